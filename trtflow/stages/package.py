"""Package: engines + manifest.json + SHA256SUMS in a folder (and, when the recipe asks, a reproducible .tar.gz).

The recipe's plugin libraries are sources of the package too (the manifest lists each with its sha256, so a changed
library repacks even when the engine's bytes came out the same); `package: {plugins: carry}` packs them as well.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow import __version__
from trtflow.errors import StageError, required
from trtflow.recipe.precision import QUANTIZED_PRECISIONS
from trtflow.stages import build as build_stage
from trtflow.stages import package_placing
from trtflow.stages import precision as precision_stage
from trtflow.stages.base import (
    MIB,
    Dep,
    Node,
    NodeId,
    RecipeContext,
    Stage,
    StageOutput,
    StageParams,
    Upstream,
    declared_memory,
)
from trtflow.stages.package_placing import ARCHIVE
from trtflow.states import FAILED, SKIPPED, NodeState
from trtflow.util.fs import link_or_copy

if TYPE_CHECKING:  # the manifest's models, the archive and lock helpers load when a package is made or placed
    from trtflow.manifest import Calibration, Engine, MissingEngine, Plugin, Tensor

KIND, VERSION = "package", 10  # 5: canonical_sha256 and reproducible per engine; 6: gzip level 0 (stored);
# 7: a missing engine names its target's compute capabilities; 8: each engine's network facts (layers); 9: engines
# enter the key by their canonical digest (an equivalent rebuild re-keys nothing); 10: the folder's files are the
# outputs (engines are their builds' objects), the archive only with `package: {archive: true}`


class PackagedEngine(build_stage.Params):
    """One engine of the package: its build's params, its target's name and the input roles of its engine and report."""

    FINGERPRINT = ()
    role: str
    verify_role: str
    target: str


class Params(StageParams):
    """The recipe's name and, per engine, everything the manifest records about how it was built; the trtflow
    version the manifest names (a fingerprint: a new trtflow repacks, cheaply, and says so, instead of a frozen
    run finding its package bytes differ from the lock's)."""

    FINGERPRINT = ("trtflow",)
    recipe: str
    engines: list[PackagedEngine]
    trtflow: str
    plugins: str = "list"  # the recipe's package.plugins: `carry` packs the libraries (the default is out of the key)
    archive: bool = False  # the recipe's package.archive: also pack the folder as `<recipe>.tar.gz`


def node(ctx: RecipeContext, builds: list[Node], verifies: list[Node], cleanup: Node) -> Node:
    """package:<recipe>: every engine with its verification, the cleaned model's summary, int8/fp8 calibration
    records."""
    engines = [
        PackagedEngine(
            **b.params.model_dump(),
            role=f"engine:{b.info.precision}/{b.info.target}",
            verify_role=f"verify:{b.info.precision}/{b.info.target}",
            target=required(b.info.target, f"{b.id}: the target"),  # every build node names it
        )
        for b in builds
    ]
    deps = [Dep(e.role, b.id, "engine") for e, b in zip(engines, builds, strict=True)]
    deps += [Dep(e.verify_role, v.id, "report") for e, v in zip(engines, verifies, strict=True)]
    quantized = sorted(set(QUANTIZED_PRECISIONS) & {b.info.precision for b in builds})
    deps += [dep for p in quantized for dep in precision_stage.report_dep(ctx, p, f"precision:{p}")]
    params = Params(
        recipe=ctx.name,
        engines=engines,
        trtflow=__version__,
        plugins=ctx.recipe.package.plugins,
        archive=ctx.recipe.package.archive,
    )
    return Node(
        id=NodeId.of(KIND, ctx.name),
        version=VERSION,
        params=params,
        deps=(Dep("model", cleanup.id, "model"), *deps),
        sources=ctx.plugin_sources,
    )


def run(params: Params, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    """The package folder's files (every engine, manifest.json, SHA256SUMS) and, with `package: {archive: true}`,
    the same files in a reproducible archive.

    An engine is its build's object (hard-linked, never copied), so the store holds its bytes once; only an archive
    holds them a second time (streamed from the store into it, hashed while it is packed).
    """
    from trtflow.manifest import MANIFEST_FILE, SUMS_FILE, Manifest, Source, sums_bytes
    from trtflow.manifest import manifest_bytes as dumped
    from trtflow.util.archive import UnsafeArchive, write_reproducible_members

    recipe = params.recipe
    present = [spec for spec in params.engines if _missing(spec, inputs) is None]
    missing = [gone for spec in params.engines if (gone := _missing(spec, inputs)) is not None]
    if not present:
        first = missing[0]
        raise StageError(
            f"no engine of {recipe} was built ({first.precision} for {first.target}: {first.stage} failed, and "
            f"{len(missing) - 1} more): no package written"
        )
    plugins = _plugins(inputs, carry=params.plugins == "carry")
    engines = [
        _describe_engine(
            recipe, spec, inputs[spec.role], inputs[spec.verify_role], _calibration(inputs, spec.precision), plugins
        )
        for spec in present
    ]
    model = inputs["model"]
    source = Source(
        sha256=model.record["source_sha256"], cleaned_sha256=model.sha256["model"], nodes=model.record["after"]["nodes"]
    )
    manifest = Manifest(
        recipe=recipe,
        trtflow_version=params.trtflow,
        source=source,
        engines=engines,
        complete=not missing,
        missing=missing,
    )
    manifest_bytes = dumped(manifest)
    carried = {plugin.file: (path, plugin.sha256) for plugin, path in plugins if plugin.carried}
    digests = {e.file: e.sha256 for e in engines} | {file: sha for file, (_, sha) in carried.items()}
    members: dict[str, Path | bytes] = {
        e.file: inputs[spec.role].files["engine"] for e, spec in zip(engines, present, strict=True)
    }
    members.update({file: path for file, (path, _) in carried.items()})
    members[MANIFEST_FILE] = manifest_bytes
    sums = {**digests, MANIFEST_FILE: hashlib.sha256(manifest_bytes).hexdigest()}
    members[SUMS_FILE] = sums_bytes(sums)
    files = _members_as_files(members, workdir, objects={e.file for e in engines})
    if params.archive:
        files[ARCHIVE] = workdir / f"{recipe}.tar.gz"
        try:
            write_reproducible_members(files[ARCHIVE], recipe, members, expected=digests)
        except UnsafeArchive as exc:
            raise StageError(f"{exc} (corrupt store object); run again to rebuild it") from exc
    return StageOutput(files=files, record={"engines": len(engines), "manifest": json.loads(manifest_bytes)})


def _members_as_files(members: dict[str, Path | bytes], workdir: Path, objects: set[str]) -> dict[str, Path]:
    """Each file of the package folder (relative path -> a file in `workdir`): an engine is a hard link to its
    build's object (the store keeps one copy of its bytes); a carried library, a file of the project, is copied
    (a link would make the project's file a read-only store object); the manifest and SHA256SUMS are written."""
    files = {}
    for number, (name, content) in enumerate(sorted(members.items())):
        files[name] = workdir / f"member-{number}"  # flat: executors move outputs by file name
        if isinstance(content, bytes):
            files[name].write_bytes(content)
        elif name in objects:
            link_or_copy(content, files[name])
        else:
            shutil.copyfile(content, files[name])
    return files


def _plugins(inputs: dict[str, Upstream], carry: bool) -> list[tuple[Plugin, Path]]:
    """The recipe's plugin libraries as the manifest lists them, each with its file (packed when carried)."""
    from trtflow.manifest import Plugin
    from trtflow.recipe.plugins import plugin_name

    found = []
    for role, upstream in inputs.items():
        name = plugin_name(role)
        if name is not None:
            path = upstream.files[role]
            found.append(
                (Plugin(name=name, sha256=upstream.sha256[role], size=path.stat().st_size, carried=carry), path)
            )
    return found


def _missing(spec: PackagedEngine, inputs: dict[str, Upstream]) -> MissingEngine | None:
    """The engine's entry in `missing` when its build or its verification failed; None when it can be packed."""
    from trtflow.manifest import MissingEngine

    cause = inputs[spec.role].missing or inputs[spec.verify_role].missing
    if cause is None:
        return None
    stage, _, reason = cause.partition(": ")
    return MissingEngine(
        precision=spec.precision,
        target=spec.target,
        stage=stage,
        reason=reason,
        compute_capabilities=list(spec.compute_capabilities),
    )


def _calibration(inputs: dict[str, Upstream], precision: str) -> Calibration | None:
    """How an int8/fp8 model was calibrated, from its precision node (the package depends on it for this alone)."""
    from trtflow.manifest import Calibration

    upstream = inputs.get(f"precision:{precision}")
    found = upstream.record.get("calibration") if upstream is not None else None
    return Calibration.model_validate(found) if found is not None else None


def _describe_engine(
    recipe: str,
    spec: PackagedEngine,
    build: Upstream,
    verify: Upstream,
    calibration: Calibration | None,
    plugins: list[tuple[Plugin, Path]],
) -> Engine:
    """One engine's manifest entry (its bytes are checked against `sha256` while they are packed)."""
    from trtflow.manifest import Engine, Verification
    from trtflow.recipe.build import BuildOptions

    relative = f"engines/{spec.target}/{recipe}-{spec.precision}.engine"
    digest = build.sha256["engine"]
    return Engine(
        file=relative,
        sha256=digest,
        size=build.files["engine"].stat().st_size,
        precision=spec.precision,
        calibration=calibration,
        target=spec.target,
        compute_capabilities=list(spec.compute_capabilities),
        backend=build.record["backend"],
        backend_version=build.record["backend_version"],
        hardware_compatibility=spec.hardware_compatibility,
        version_compatible=spec.version_compatible,
        builder=BuildOptions.model_validate(spec.builder_options()),
        tensors=[_tensor(t, spec.profiles) for t in build.record["tensors"]],
        verification=Verification.model_validate(verify.record),
        stage_key=required(build.key, f"{spec.role}: the stage key"),
        canonical_sha256=(build.record.get("canonical_sha256") or {}).get("engine"),
        reproducible="equivalent" if build.record.get("canonical_sha256") else "bytes",
        network=build.record.get("network") or None,
        plugins=[plugin for plugin, _ in plugins],
    )


def _tensor(spec: dict, profiles: list[dict]) -> Tensor:
    from trtflow.manifest import ProfileShape, Tensor

    shapes = [ProfileShape(**profile[spec["name"]]) for profile in profiles if spec["name"] in profile]
    return Tensor(profiles=shapes, **spec)


STAGE = Stage(
    KIND,
    VERSION,
    run,
    finish=package_placing.finish,
    verify_inputs=True,  # what a package ships is re-hashed first: a corrupt object is rebuilt, never packed
    places_files=True,  # extracting the package into its folder overlaps the stages after it
    required_roles=("model",),  # engines whose build or verify failed are left out and listed as missing
    warm_imports=("trtflow.stages.package", "trtflow.manifest"),
    memory=declared_memory(200 * MIB, 1.0),
)


def earlier_packages(states: Iterable[NodeState], packages_dir: Path) -> list[str]:
    """A warning for each recipe whose package stage failed or was skipped this run while a package of an earlier run
    is still in the packages folder: what is there is not this run's (it is kept: provisioning may rely on it)."""
    return [
        f"{packages_dir / state.node.recipe}/ is the package of an earlier run: {state.node.id} "
        f"{'failed' if state.status == FAILED else 'was skipped'} in this one; fix that (or remove the folder) before "
        "shipping it"
        for state in states
        if state.node.kind == KIND and state.status in (FAILED, SKIPPED) and (packages_dir / state.node.recipe).is_dir()
    ]
