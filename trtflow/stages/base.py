"""What every stage is made of: typed params, node ids, nodes, the inputs a stage reads and what it returns.

A stage module (stages/<kind>.py, or a package) is one typed unit: `KIND`, `VERSION` (bump it when the output for
the same inputs would change), a frozen `Params` model, a function that makes its nodes from a recipe, and `STAGE`,
the `Stage` the runner, the planner and the executors use: its `run(params, inputs, workdir) -> StageOutput` and
what else it asks of them (`Stage`'s fields). `stages.stage(kind)` is the registry.
Stage modules import their heavy libraries (onnx, TensorRT, numpy) only inside `run`, so planning stays cheap.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict

from trtflow.errors import InternalError
from trtflow.util.servers import POOL

if TYPE_CHECKING:
    from trtflow.calibration import Split
    from trtflow.hashing import FileDigests
    from trtflow.recipe.project import RecipeFile
    from trtflow.recipe.schema import Pipeline, Recipe, TargetSpec
    from trtflow.signing import Signer
    from trtflow.store.records import StageRecord
    from trtflow.store.store import Store


class NodeId(str):
    """`build:tiny/fp32/rtx-ada`: the stage kind, then the recipe, then the node's own parts, as one string.

    It is a str (dict key, JSON, lock file entry); the only place ids are built and taken apart:

        >>> NodeId.of("build", "tiny", "fp32", "rtx-ada").recipe
        'tiny'
    """

    @classmethod
    def of(cls, kind: str, recipe: str, *parts: str) -> NodeId:
        """The id of a `kind` node of `recipe`, e.g. of("precision", "tiny", "fp16")."""
        return cls(f"{kind}:{'/'.join((recipe, *parts))}")

    @property
    def kind(self) -> str:
        """`build` of `build:tiny/fp32/rtx-ada`."""
        return self.split(":", 1)[0]

    @property
    def recipe(self) -> str | None:
        """`tiny` of `build:tiny/fp32/rtx-ada`; None for a string that is no node id."""
        return self.split(":", 1)[1].split("/", 1)[0] if ":" in self else None

    @property
    def parts(self) -> tuple[str, ...]:
        """`("fp32", "rtx-ada")` of `build:tiny/fp32/rtx-ada`."""
        return tuple(self.split(":", 1)[1].split("/")[1:]) if ":" in self else ()

    def with_kind(self, kind: str) -> NodeId:
        """The same recipe and parts under another stage: build:... -> verify:..."""
        return NodeId.of(kind, self.recipe or "", *self.parts)


class StageParams(BaseModel):
    """A stage's parameters: everything its `run` needs besides input files, and all of it part of the key.

    The key keeps two groups apart so explanations can say which changed: fields named in FINGERPRINT (tool
    versions, target hardware) and the rest (the recipe's settings). A field at its default is never in the key,
    at any depth, whether it was left unset or written out: adding an option with a default leaves every existing
    key as it was, so a new trtflow rebuilds nothing that would come out the same. (A default that changes what a
    stage makes is a change of that stage: bump its VERSION and say so in CHANGELOG.md.)

        >>> BuildParams(precision="fp32", optimization_level=3, workspace_mib=None, ...).key_parts()[0]
        {"precision": "fp32", "profiles": [...]}            # 3 and None are the defaults
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    FINGERPRINT: ClassVar[tuple[str, ...]] = ()
    POLICY: ClassVar[tuple[str, ...]] = ()  # fields `run` reads that change no output (on_fail): never in the key

    def key_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(params, fingerprint) as plain JSON values, the way the stage key and the lock hold them."""
        data = self.model_dump(mode="json", exclude_defaults=True, exclude=set(self.POLICY))
        params = {name: value for name, value in data.items() if name not in self.FINGERPRINT}
        return params, {name: data[name] for name in self.FINGERPRINT if name in data}


class ProofSettings(BaseModel):
    """The recipe's fp32 tolerances and seed for an ONNX Runtime proof (an export against torch, cleanup against its
    input)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    rtol: float
    atol: float
    seed: int
    values: dict[str, tuple[int, int]] = {}  # the recipe's integer input values (RecipeContext.input_values)


@dataclass(frozen=True)
class Dep:
    """One input of a node that another node produces: `role` <- `node`'s output `output`."""

    role: str
    node: NodeId
    output: str


@dataclass(frozen=True)
class NodeInfo:
    """What a node tells the user and its dependents beyond its id; never part of its key."""

    precision: str | None = None  # precision, build and verify nodes
    target: str | None = None  # build and verify nodes: the pipeline target's name
    where: str | None = None  # `recipes/x.yaml:3: source.onnx`: where the node's source file is declared


P = TypeVar("P", bound=StageParams)


@dataclass(frozen=True)
class Node:
    """One unit of work in the DAG: a stage applied to typed params and to inputs (upstream outputs, files)."""

    id: NodeId
    version: int
    params: StageParams
    deps: tuple[Dep, ...] = ()
    sources: tuple[tuple[str, Path], ...] = ()  # (role, file outside the store)
    info: NodeInfo = NodeInfo()

    @property
    def kind(self) -> str:
        """The stage that runs this node."""
        return self.id.kind

    @property
    def recipe(self) -> str:
        """The recipe this node belongs to (recipes never share nodes)."""
        return self.id.recipe or ""

    def params_as(self, cls: type[P]) -> P:
        """The params as `cls`, its stage's own Params (a stage's hooks see only its own nodes: else a bug)."""
        if not isinstance(self.params, cls):
            raise InternalError(f"{self.id}: params of {type(self.params).__name__}, not {cls.__name__}")
        return self.params

    @functools.cached_property
    def known_parts(self) -> dict[str, Any]:
        """Key components known before any input digest: kind, version, params and fingerprint."""
        params, fingerprint = self.params.key_parts()
        return {"kind": self.kind, "version": self.version, "params": params, "fingerprint": fingerprint}


@dataclass
class RecipeContext:
    """What a stage's node function reads: the recipe (with its file, for errors), the project root and its targets."""

    item: RecipeFile
    root: Path
    pipeline: Pipeline

    @property
    def recipe(self) -> Recipe:
        """The validated Recipe model."""
        return self.item.recipe

    @property
    def name(self) -> str:
        """The recipe's name: the first part of each of its node ids."""
        return self.item.recipe.name

    @functools.cached_property
    def profiles(self) -> list[dict[str, dict[str, list[int]]]]:
        """Profiles as [{input: {min, opt, max}}], the plain form keys, backends and manifests use."""
        return [
            {
                name: dict(zip(("min", "opt", "max"), shape.triple(), strict=True))
                for name, shape in profile.inputs.items()
            }
            for profile in self.recipe.profiles
        ]

    @property
    def input_values(self) -> dict[str, tuple[int, int]]:
        """The recipe's `inputs: {NAME: {values: [LO, HI]}}` as {NAME: (LO, HI)}: the stages that draw inputs hold it
        in their params (empty by default, so out of their keys)."""
        return {name: spec.values for name, spec in sorted(self.recipe.inputs.items())}

    @functools.cached_property
    def plugin_sources(self) -> tuple[tuple[str, Path], ...]:
        """(`plugin:<name>`, path) of each plugin library the recipe declares: a source of its builds, verifies,
        package."""
        from trtflow.recipe.plugins import plugin_sources

        return plugin_sources(self.item, self.root)

    def pairs(self) -> list[tuple[str, str, TargetSpec]]:
        """(precision, target name, target spec) of every engine the recipe builds (its `exclude:` applied)."""
        return [
            (precision, target, self.pipeline.targets[target]) for precision, target in self.item.pairs(self.pipeline)
        ]

    def precisions(self) -> list[str]:
        """The recipe's precisions that at least one target builds."""
        built = {precision for precision, _ in self.item.pairs(self.pipeline)}
        return [precision for precision in self.recipe.precisions if precision in built]

    @functools.cached_property
    def calibration_split(self) -> Split | None:
        """The calibration and held-out files reduced precisions read (decided from paths alone)."""
        from trtflow import calibration

        return calibration.plan_split(self.item, self.root) if set(self.recipe.precisions) - {"fp32"} else None


@dataclass
class Upstream:
    """One input of a stage: the files an upstream node produced (or a source file) and its record."""

    files: dict[str, Path]
    record: dict[str, Any] = field(default_factory=dict)
    key: str | None = None
    sha256: dict[str, str] = field(default_factory=dict)
    missing: str | None = None  # `<node id>: <reason>` of an optional input whose producer failed (no files then)


@dataclass
class StageOutput:
    """What `run` returns: output files (moved into the store by the runner) and a JSON record."""

    files: dict[str, Path]
    record: dict[str, Any]


CACHED_UNDER_WARN = " (a cached result built under verify: {on_fail: warn})"


def plugin_files(inputs: dict[str, Upstream]) -> dict[str, Path]:
    """The plugin libraries among a stage's inputs (roles `plugin:<name>`) by name, in the recipe's order (an executor
    may hand a file over under another name)."""
    from trtflow.recipe.plugins import plugin_name

    return {name: upstream.files[role] for role, upstream in inputs.items() if (name := plugin_name(role)) is not None}


def enforce_proof(on_fail: str, proof: dict, what: str, suffix: str = "") -> None:
    """Raise StageError naming the first differing output of a failed proof, unless the recipe says `on_fail: warn`.

    Stages call it when they run and again from `finish` on a cached record (suffix CACHED_UNDER_WARN): on_fail is a
    policy, not part of a key, so one record serves both policies.
    """
    if not proof["passed"] and on_fail == "fail":
        from trtflow.errors import StageError
        from trtflow.stages import compare  # numpy: only when there is a failure to describe

        raise StageError(compare.failure_message(what, proof) + suffix)


@dataclass(frozen=True)
class Placement:
    """Where a finish hook may put what a finished node made for the user (packages), and the store it reads."""

    store: Store
    packages_dir: Path
    digests: FileDigests
    signer: Signer | None = None  # signs each package's provenance (signing.py), when the environment holds a key


MIB = 1 << 20
# The model tools' stages (export, cleanup, precision) back a child's memory with huge pages only above this many
# bytes of inputs: below, a short-lived child's first huge pages cost more than they save (docs/memory.md)
SMALL_INPUTS = 256 * MIB


def declared_memory(base: int, per_model_byte: float) -> Callable[[Node], tuple[int, float]]:
    """A stage kind's expected peak, the same for all its nodes: `base` bytes plus `per_model_byte` times the size
    of the node's largest input (measured on the test corpus; a node's own last peak replaces it once it has run)."""
    return lambda node: (base, per_model_byte)


@dataclass(frozen=True)
class Stage:
    """A stage kind as the runner, the planner and the executors see it (each stage module's `STAGE`): what it does,
    and everything it asks of them, declared here rather than in tables of kind names elsewhere."""

    kind: str
    version: int
    run: Callable[[Any, dict[str, Upstream], Path], StageOutput]  # (its Params, inputs by role, work dir)
    # on every finished or cached node: re-checks a cached record under today's policy, places what the user gets
    # (packages); returns a warning line or None, raises StageError to fail the node
    finish: Callable[[Node, StageRecord, Placement], str | None] | None = None
    # a failed node's reason -> the line shown (e.g. how to exclude the pair)
    failure_hint: Callable[[Node, str], str] | None = None
    # what the runner adds to a finished node's record, read from its output files beside the next stages (a build's
    # canonical digest: 0.04 s a ResNet-18 engine that no longer holds up the next stage)
    described: Callable[[dict[str, Path]], dict[str, Any]] | None = None
    verify_inputs: bool = False  # re-hash every input object before running (what a package ships must be intact)
    places_files: bool = False  # its finish hook writes the user's files (I/O only): it runs beside the next stages
    # only these inputs must exist: the stage also runs when the others failed, told which and why (None: all)
    required_roles: tuple[str, ...] | None = None
    # the modules a node with these params imports beyond its kind's usual ones (a worker server imports them once,
    # before it forks the node's worker: executors.forking)
    imports: Callable[[Any], tuple[str, ...]] | None = None
    runs_in: str = POOL  # BUILD_SERVER, TOOLS_SERVER, USER_CODE_SERVER or POOL
    warm_imports: tuple[str, ...] = ()  # what a worker imports ahead of the kind's first task
    # (base bytes, bytes per byte of the largest input) the scheduler expects a node to peak at before it has run
    memory: Callable[[Node], tuple[int, float]] = declared_memory(500 * MIB, 2.0)
    # A worker process of this kind backs its memory with transparent huge pages (util.settings.tool_overlay) only
    # when its inputs hold more bytes than this (0: always; executors.worker.settle_huge_pages). A huge page saves 511
    # faults where a process copies a large model again and again, but a short-lived child's first huge pages cost
    # more than they save on a small model
    huge_pages_above: int = 0
    # `run --builds-alone`: a node of this kind runs with nothing beside it, nor anything beside it (admission)
    alone_when_asked: bool = False
