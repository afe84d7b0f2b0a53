"""Package: engines + manifest.json + SHA256SUMS in a folder, packed into a reproducible .tar.gz.

The recipe's plugin libraries are sources of the package too (the manifest lists each with its sha256, so a changed
library repacks even when the engine's bytes came out the same); `package: {plugins: carry}` packs them as well.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow import __version__
from trtflow.errors import StageError, required
from trtflow.recipe.precision import QUANTIZED_PRECISIONS
from trtflow.stages import build as build_stage
from trtflow.stages import precision as precision_stage
from trtflow.stages.base import (
    MIB,
    Dep,
    Node,
    NodeId,
    Placement,
    RecipeContext,
    Stage,
    StageOutput,
    StageParams,
    Upstream,
    declared_memory,
)
from trtflow.states import FAILED, SKIPPED, NodeState
from trtflow.store.records import StageRecord
from trtflow.util.fs import link_or_copy
from trtflow.util.reads import note_path

if TYPE_CHECKING:  # the manifest's models, the archive and lock helpers load when a package is made or placed
    from trtflow.manifest import Calibration, Engine, MissingEngine, Plugin, Tensor

KIND, VERSION = "package", 9  # 5: canonical_sha256 and reproducible per engine; 6: gzip level 0 (stored);
# 7: a missing engine names its target's compute capabilities; 8: each engine's network facts (layers); 9: engines
# enter the key by their canonical digest (an equivalent rebuild re-keys nothing)


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
    params = Params(recipe=ctx.name, engines=engines, trtflow=__version__, plugins=ctx.recipe.package.plugins)
    return Node(
        id=NodeId.of(KIND, ctx.name),
        version=VERSION,
        params=params,
        deps=(Dep("model", cleanup.id, "model"), *deps),
        sources=ctx.plugin_sources,
    )


def run(params: Params, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    """Pack every engine (re-hashed while it is packed) with manifest.json and SHA256SUMS into a reproducible archive.

    The engines are streamed from the store into the archive, never copied into a folder first: the archive is the
    package's only output (the packages folder is extracted from it when the package is placed).
    """
    from trtflow.manifest import MANIFEST_FILE, SUMS_FILE, Manifest, Source
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
    members[SUMS_FILE] = "".join(f"{sums[name]}  {name}\n" for name in sorted(sums)).encode()
    archive = workdir / f"{recipe}.tar.gz"
    try:
        write_reproducible_members(archive, recipe, members, expected=digests)
    except UnsafeArchive as exc:
        raise StageError(f"{exc} (corrupt store object); run again to rebuild it") from exc
    return StageOutput(
        files={"package": archive}, record={"engines": len(engines), "manifest": json.loads(manifest_bytes)}
    )


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


def finish(node: Node, record: StageRecord, place: Placement) -> str | None:
    """Make `<packages>/<recipe>.tar.gz`, its extracted folder and its provenance match the package object.

    Returns what was repaired (an archive or folder that differed from the package), None otherwise.
    """
    from trtflow.store.locks import holding

    recipe, digest = node.recipe, record["outputs"]["package"]
    difference = _difference(digest, place, recipe)
    if difference or _provenance_differs(place, recipe, record):
        with holding(place.store.locks / f"package-{recipe}.lock"):  # concurrent runs write the same package folder
            difference = _difference(digest, place, recipe)  # another run may have put it in place meanwhile
            if difference:
                _checkout(place, digest, recipe)
            if _provenance_differs(place, recipe, record):
                _write_provenance(place, recipe, record)
    return (
        None
        if difference in (None, NOT_PLACED, UPDATED)
        else f"{place.packages_dir / recipe}: {difference}; restored it from the store"
    )


NOT_PLACED = "not placed yet"
UPDATED = "an earlier package of the recipe, as placed"  # an ordinary update: replaced without a warning


def _difference(digest: str, place: Placement, recipe: str) -> str | None:
    """What differs between the placed archive and folder and the package object (None: nothing; cheap when unchanged).

    The folder is compared with the listing remembered at checkout: the same files, each with its digest (files
    are re-hashed only when their size, mtime or inode changed).
    """
    archive, folder = place.packages_dir / f"{recipe}.tar.gz", place.packages_dir / recipe
    if not archive.exists() and not folder.exists():
        return NOT_PLACED
    placed = place.digests.digest(archive) if archive.is_file() else None
    if placed != digest:
        # trtflow placed it: is it still as placed?
        earlier = place.store.memos.package_listing(placed) if placed else None
        return (
            UPDATED
            if earlier is not None and _folder_difference(folder, earlier, place) is None
            else f"{archive.name} differs from the package built"
        )
    listing = place.store.memos.package_listing(digest)
    if listing is None:
        return "its folder was never checked"
    return _folder_difference(folder, listing, place)


def _folder_difference(folder: Path, listing: dict[str, str], place: Placement) -> str | None:
    """What differs between a package folder and the listing of the package it was extracted from (None: nothing)."""
    if folder.is_symlink() or not folder.is_dir():
        return "its folder is a symlink" if folder.is_symlink() else "its folder is missing"
    present = _files_under(folder)
    if set(present) != set(listing):
        changed = sorted(set(present) ^ set(listing))
        return f"its folder has other files than the package ({', '.join(changed[:3])})"
    changed = [name for name in sorted(listing) if place.digests.digest(present[name]) != listing[name]]
    return f"{', '.join(changed[:3])} changed" if changed else None


def _files_under(folder: Path) -> dict[str, Path]:
    """Every entry under `folder` by relative POSIX path (symlinks and special files included, never followed)."""
    found = {}
    for parent, dirs, files in os.walk(folder):
        note_path(parent)  # a file added anywhere changes its folder
        for name in files + [d for d in dirs if (Path(parent) / d).is_symlink()]:
            path = Path(parent) / name
            found[path.relative_to(folder).as_posix()] = path
    return found


def _provenance(place: Placement, recipe: str, record: StageRecord) -> tuple[Path, bytes]:
    """(where `<recipe>.intoto.jsonl` goes, the bytes it must hold): signed by the run's key, if any."""
    from trtflow import provenance
    from trtflow.manifest import MANIFEST_FILE

    archive = place.packages_dir / f"{recipe}.tar.gz"
    statement = provenance.statement(
        recipe,
        place.digests.digest(archive),
        place.digests.digest(place.packages_dir / recipe / MANIFEST_FILE),
        record["record"]["manifest"],
        record["key"],
    )
    return provenance.provenance_path(archive), provenance.envelope_line(statement, place.signer)


def _provenance_differs(place: Placement, recipe: str, record: StageRecord) -> bool:
    """Whether the provenance file is missing or holds other bytes (a new package, another key, an edit)."""
    path, line = _provenance(place, recipe, record)
    note_path(path)
    return not (path.is_file() and not path.is_symlink() and path.read_bytes() == line)


def _write_provenance(place: Placement, recipe: str, record: StageRecord) -> None:
    """Write `<recipe>.intoto.jsonl` beside the package, atomically."""
    from trtflow.util.fs import atomic_write

    path, line = _provenance(place, recipe, record)
    atomic_write(path, line)


def _checkout(place: Placement, digest: str, recipe: str) -> None:
    """Extract the package object beside the packages folder, then swap the folder and the archive into place.

    The archive placed is the package object itself, and each engine of the folder is its build's object, by hard
    links (read-only files, as every object is): a project's artifacts hold each engine twice, in the store and in
    the archive, not four times. A placed file edited in place changes its object too: the store sees its new
    signature, re-hashes it and rebuilds what it was. Where a link cannot be made (another filesystem), a copy."""
    from trtflow.util.archive import extract_tar, replace_dir_atomically
    from trtflow.util.faults import crash_point

    packages_dir = place.packages_dir
    packages_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=packages_dir, prefix=f".{recipe}.incoming-"))
    try:
        link_or_copy(place.store.objects.path(digest), staging / "package.tar.gz")
        extracted = extract_tar(staging / "package.tar.gz", staging / "extracted")
        for name, sha256 in extracted.items():  # each engine: its build's object
            place.store.objects.link_as(sha256, staging / "extracted" / name)
        place.store.memos.remember_package_listing(
            digest, {name.removeprefix(f"{recipe}/"): sha for name, sha in extracted.items()}
        )
        crash_point("package-extracted")
        replace_dir_atomically(staging / "extracted" / recipe, packages_dir / recipe)
        os.replace(staging / "package.tar.gz", packages_dir / f"{recipe}.tar.gz")
        if place.store.objects.intact(digest):  # its provenance names its digest: not read again for that
            place.digests.vouch(packages_dir / f"{recipe}.tar.gz", digest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


STAGE = Stage(
    KIND,
    VERSION,
    run,
    finish=finish,
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
