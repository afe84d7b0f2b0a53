"""Package: engines + manifest.json + SHA256SUMS in a folder, packed into a reproducible .tar.gz."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from trtflow import __version__
from trtflow.archive import write_reproducible_tar
from trtflow.errors import StageError
from trtflow.hashing import sha256_file
from trtflow.manifest import MANIFEST_FILE, SUMS_FILE, Engine, Manifest, ProfileShape, Source, Tensor
from trtflow.stages import StageOutput, Upstream


def run(params: dict, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    recipe = params["recipe"]
    folder = workdir / recipe
    engines = [_place_engine(folder, recipe, spec, inputs[spec["role"]], inputs[spec["verify_role"]], _calibration(inputs, spec["precision"]))
               for spec in params["engines"]]
    model = inputs["model"]
    source = Source(sha256=model.record["source_sha256"], cleaned_sha256=model.sha256["model"], nodes=model.record["after"]["nodes"])
    manifest = Manifest(recipe=recipe, trtflow_version=__version__, source=source, engines=engines)
    (folder / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=2) + "\n")
    _write_sums(folder)
    archive = workdir / f"{recipe}.tar.gz"
    write_reproducible_tar(folder, archive, prefix=recipe)
    return StageOutput(files={"package": archive}, record={"engines": len(engines), "manifest": json.loads(manifest.model_dump_json())})


def _calibration(inputs: dict[str, Upstream], precision: str) -> Optional[dict]:
    """How an int8/fp8 model was calibrated, from its precision node (the package depends on it for this alone)."""
    upstream = inputs.get(f"precision:{precision}")
    return upstream.record.get("calibration") if upstream is not None else None


def _place_engine(folder: Path, recipe: str, spec: dict, build: Upstream, verify: Upstream, calibration: Optional[dict]) -> Engine:
    relative = f"engines/{spec['target']}/{recipe}-{spec['precision']}.engine"
    (folder / relative).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(build.files["engine"], folder / relative)
    digest = sha256_file(folder / relative)
    if digest != build.sha256["engine"]:
        raise StageError(f"engine {relative} does not match its store digest (corrupt store object); run again to rebuild it")
    return Engine(
        file=relative,
        sha256=digest,
        size=(folder / relative).stat().st_size,
        precision=spec["precision"],
        calibration=calibration,
        target=spec["target"],
        compute_capabilities=spec["compute_capabilities"],
        backend=build.record["backend"],
        backend_version=build.record["backend_version"],
        hardware_compatibility=spec["hardware_compatibility"],
        version_compatible=spec["version_compatible"],
        builder={"workspace_mib": spec["workspace_mib"], "optimization_level": spec["optimization_level"]},
        tensors=[_tensor(t, spec["profiles"]) for t in build.record["tensors"]],
        verification=verify.record,
        stage_key=build.key,
    )


def _tensor(spec: dict, profiles: list[dict]) -> Tensor:
    shapes = [ProfileShape(**profile[spec["name"]]) for profile in profiles if spec["name"] in profile]
    return Tensor(profiles=shapes, **spec)


def _write_sums(folder: Path) -> None:
    """`sha256  path` per file, sorted: the format `sha256sum -c` checks."""
    lines = [f"{sha256_file(p)}  {p.relative_to(folder).as_posix()}" for p in sorted(folder.rglob("*")) if p.is_file()]
    (folder / SUMS_FILE).write_text("\n".join(lines) + "\n")
