"""`trtflow export triton`: a Triton Inference Server model repository serving full TensorRT engines.

    <repo>/<model>/config.pbtxt          platform tensorrt_plan, written and re-parsed through Triton's own schema
    <repo>/<model>/<version>/<target>.plan

One Triton model serves one precision of one recipe on several GPU architectures: `cc_model_filenames` maps each
compute capability ("8.6") to the plan built for it, so the same model folder loads on every GPU of the fleet (an
`ampere_plus` engine becomes `default_model_filename`, loaded where no exact plan is listed). Engines may come from
several packages of the recipe (full TensorRT builds on the GPU it targets, so each architecture is often built on
its own machine); their I/O must agree. Each optimization profile gets an instance group that uses it.

`max_batch_size` comes from the manifest: when every input and output has a dynamic first dimension and the
profiles together accept every batch from 1 to their largest without a gap (e.g. 1-8 and 9-64, not 1-8 and 16-64,
where Triton would send a batch of 12 that no profile takes), that dimension is Triton's batch dimension and
max_batch_size is that largest batch (dims then omit it); otherwise 0 and dims are the full shapes, -1 where dynamic,
and the export says why. `default_model_filename` is set only for a hardware-compatible (`ampere_plus`) plan: a GPU
missing from `cc_model_filenames` must fail to load rather than load a plan built for another architecture.

TensorRT-RTX engines are refused: Triton's TensorRT backend deserializes plans with the TensorRT runtime it was
built with, and a TensorRT-RTX engine loads only on the TensorRT-RTX runtime of the same release; no Triton
backend for TensorRT-RTX is documented. Use `trtflow export ort-context` for them.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.deploy.provision import SAFE_NAME, Package, copy_verified
from trtflow.errors import CannotExport, EnvironmentProblem
from trtflow.manifest import Engine, Tensor
from trtflow.util.cc import ComputeCapability
from trtflow.util.fs import atomic_write, first_link, fsync_dir

TRITON_TYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "bfloat16": "TYPE_BF16",
    "int8": "TYPE_INT8",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
}
RTX_REFUSAL = (
    "Triton's TensorRT backend loads plans with the TensorRT runtime it was built with; TensorRT-RTX engines load "
    "only on "
    "the TensorRT-RTX runtime of the same release, and no Triton backend for them is documented: export them with "
    "`trtflow export ort-context` instead"
)


@dataclass(frozen=True)
class Plan:
    """One engine of one package, as a plan file of the Triton model."""

    package: Package
    engine: Engine

    @property
    def file(self) -> str:
        """The plan's file name in the Triton model folder."""
        return f"{self.engine.target}.plan"


def triton_model_config_pb2() -> Any:
    """Triton's ModelConfig protobuf module (tritonclient's generated model_config_pb2)."""
    try:
        from tritonclient.grpc import model_config_pb2
    except (ImportError, RuntimeError) as exc:
        raise EnvironmentProblem(
            f"export triton needs Triton's model configuration schema ({exc}): pip install 'trtflow[triton]'"
        ) from exc
    return model_config_pb2


def select_plans(packages: list[Package], precision: str | None) -> tuple[list[Plan], list[str]]:
    """The full-TensorRT engines of one recipe and precision across `packages`; also one note per engine left out."""
    recipes = sorted({p.manifest.recipe for p in packages})
    if len(recipes) > 1:
        raise CannotExport(
            f"the packages hold different recipes ({', '.join(recipes)}); one Triton model serves one recipe: export "
            "each on its own"
        )
    candidates = [
        Plan(p, e) for p in packages for e in p.manifest.engines if precision is None or e.precision == precision
    ]
    notes = [
        f"left out {c.package.where(c.engine.file)}: tensorrt-rtx engine"
        for c in candidates
        if c.engine.backend != "tensorrt"
    ]
    plans = [c for c in candidates if c.engine.backend == "tensorrt"]
    if not plans:
        rtx = len(candidates) - len(plans)
        what = f"{rtx} TensorRT-RTX engine(s) and no full TensorRT engine" if rtx else "no engine"
        asked = f" of precision {precision}" if precision else ""
        raise CannotExport(
            f"{', '.join(str(p.path) for p in packages)}: {what}{asked}: {RTX_REFUSAL if rtx else 'nothing to export'}"
        )
    precisions = sorted({p.engine.precision for p in plans})
    if len(precisions) > 1:
        raise CannotExport(
            f"the TensorRT engines are in several precisions ({', '.join(precisions)}); one Triton model serves one: "
            "pass --precision"
        )
    return plans, notes


def model_config(name: str, plans: list[Plan]) -> Any:
    """The ModelConfig message for the plans (validated: every plan has the same I/O; one plan per compute
    capability)."""
    pb = triton_model_config_pb2()
    tensors = _agreed_tensors(plans)
    batch = _max_batch_size(tensors)
    config = pb.ModelConfig(name=name, platform="tensorrt_plan", max_batch_size=batch or 0)
    for tensor in tensors:
        dims = tensor.shape[1:] if batch else tensor.shape
        entry = config.input.add() if tensor.mode == "input" else config.output.add()
        entry.name, entry.data_type = tensor.name, pb.DataType.Value(_triton_type(tensor))
        entry.dims.extend(dims)
    profiles = max((len(t.profiles) for t in tensors), default=0)
    for index in range(max(profiles, 1)):
        group = config.instance_group.add(kind=pb.ModelInstanceGroup.KIND_GPU, count=1)
        if profiles:
            group.profile.append(str(index))
    exact, portable = _cc_files(plans)
    for cc, file in exact.items():
        config.cc_model_filenames[cc] = file
    if portable:
        config.default_model_filename = portable
    return config


def _agreed_tensors(plans: list[Plan]) -> list[Tensor]:
    """The I/O tensors every plan shares (names, modes, dtypes, shapes, profiles); CannotExport naming the first that
    differs."""
    first = plans[0]
    for other in plans[1:]:
        if other.engine.tensors != first.engine.tensors:
            raise CannotExport(
                f"{other.package.where(other.engine.file)}: its I/O tensors or profiles differ from those of "
                f"{first.package.where(first.engine.file)}; one Triton model needs the same I/O on every GPU"
            )
    return first.engine.tensors


def _max_batch_size(tensors: list[Tensor]) -> int:
    """The largest batch when dim 0 of every tensor is a dynamic batch the profiles cover from 1 without a gap, else
    0."""
    return 0 if batching_refusal(tensors) else max(p.max[0] for t in tensors if t.mode == "input" for p in t.profiles)


def batching_refusal(tensors: list[Tensor]) -> str | None:
    """Why Triton must not batch these tensors (max_batch_size 0), or None when dim 0 is a batch it can use."""
    if not tensors or any(not t.shape or t.shape[0] != -1 for t in tensors):
        return "not every input and output has a dynamic first dimension"
    inputs = [t for t in tensors if t.mode == "input"]
    if not inputs or any(not t.profiles for t in inputs):
        return "an input has no optimization profile"
    count = len(inputs[0].profiles)
    if any(len(t.profiles) != count for t in inputs):
        return "the inputs have different numbers of profiles"
    ranges = sorted(
        (max(t.profiles[i].min[0] for t in inputs), min(t.profiles[i].max[0] for t in inputs)) for i in range(count)
    )
    covered = 0
    for low, high in ranges:
        if low > covered + 1:
            break
        covered = max(covered, high)
    top = max(high for _, high in ranges)
    if covered < top or covered < 1:
        return f"the profiles accept batches up to {top} but not {covered + 1} (a gap Triton's batcher would fall into)"
    return None


def _triton_type(tensor: Tensor) -> str:
    if tensor.dtype not in TRITON_TYPES:
        raise CannotExport(
            f"tensor {tensor.name!r} has dtype {tensor.dtype}, which Triton's model configuration cannot declare"
        )
    return TRITON_TYPES[tensor.dtype]


def _cc_files(plans: list[Plan]) -> tuple[dict[str, str], str | None]:
    """({"8.6": "rtx-ampere.plan", ...}, the plan for every other GPU or None); CannotExport on any ambiguity."""
    exact: dict[str, Plan] = {}
    portable = [p for p in plans if p.engine.hardware_compatibility == "ampere_plus"]
    if len(portable) > 1:
        raise CannotExport(
            f"several hardware-compatible engines ({', '.join(p.file for p in portable)}); Triton takes one default "
            "plan: pass fewer packages"
        )
    for plan in plans:
        if plan in portable:
            continue
        for cc in plan.engine.compute_capabilities:
            key = _triton_cc(cc)
            if key in exact and exact[key] != plan:
                raise CannotExport(
                    f"compute capability {cc} has two engines ({exact[key].package.where(exact[key].engine.file)} and "
                    f"{plan.package.where(plan.engine.file)}); pass fewer packages or --precision"
                )
            exact[key] = plan
    names = [p.file for p in plans]
    if len(set(names)) != len(names):
        raise CannotExport(
            f"two engines have the same target name ({', '.join(sorted(names))}); they would be the same plan file"
        )
    return {
        cc: plan.file for cc, plan in sorted(exact.items(), key=lambda item: tuple(map(int, item[0].split("."))))
    }, (portable[0].file if portable else None)


def _triton_cc(cc: str) -> str:
    """sm_86 -> "8.6", sm_120 -> "12.0": the key Triton's TensorRT backend looks up (major.minor)."""
    parsed = ComputeCapability.parse(cc)
    digits = parsed.removeprefix("sm_")
    return f"{digits[:-1]}.{digits[-1]}"


def export_triton(packages: list[Package], repo: Path, name: str | None, version: int, precision: str | None) -> dict:
    """Write `<repo>/<model>/config.pbtxt` and `<repo>/<model>/<version>/*.plan` (each plan's sha256 checked while
    copied)."""
    from google.protobuf import text_format

    plans, notes = select_plans(packages, precision)
    name = name or packages[0].manifest.recipe
    if not SAFE_NAME.fullmatch(name):
        raise CannotExport(f"model name {name!r} is not a plain folder name")
    config = model_config(name, plans)
    text = text_format.MessageToString(config)
    if text_format.Parse(text, type(config)()) != config:  # Triton's schema must read back exactly what was written
        raise CannotExport(f"model {name}: the written config.pbtxt does not read back as the same configuration")
    model = repo / name
    link = first_link([model, model / str(version), model / "config.pbtxt"])
    if link is not None:
        raise CannotExport(f"--repo {repo}: {link} is a symlink; refusing to write through it (remove it)")
    _write_version(model, version, plans)
    atomic_write(model / "config.pbtxt", text)
    no_batch = batching_refusal(_agreed_tensors(plans)) if config.max_batch_size == 0 else None
    notes += [f"max_batch_size 0 (dims are full shapes): {no_batch}"] if no_batch else []
    notes += (
        []
        if config.default_model_filename
        else [
            "no default_model_filename: no hardware-compatible plan, so a GPU not in "
            "cc_model_filenames fails to load instead of loading another architecture's plan"
        ]
    )
    return {
        "model": str(model),
        "version": version,
        "config": str(model / "config.pbtxt"),
        "max_batch_size": config.max_batch_size,
        "cc_model_filenames": dict(config.cc_model_filenames),
        "default_model_filename": config.default_model_filename,
        "plans": {p.file: p.engine.sha256 for p in plans},
        "notes": notes,
    }


def _write_version(model: Path, version: int, plans: list[Plan]) -> None:
    """Fill `<model>/.<version>-<random>/` with the verified plans and rename it to `<model>/<version>/` (replacing
    it)."""
    try:
        model.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CannotExport(f"--repo {model.parent}: cannot make the model folder: {exc.strerror or exc}") from exc
    incoming = model / f".{version}-{uuid.uuid4().hex}"
    incoming.mkdir()
    try:
        for plan in plans:
            with open(incoming / plan.file, "wb") as sink:
                copy_verified(plan.package, plan.engine, sink)
                os.fsync(sink.fileno())
        target = model / str(version)
        if target.exists():
            shutil.rmtree(target)
        os.rename(incoming, target)
        fsync_dir(model)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)
