"""`trtflow export ort-context`: ONNX models whose one EPContext node carries a prebuilt engine, for ONNX Runtime.

ONNX Runtime loads such a model on the execution provider named by the node's `source` without compiling anything:
the NV TensorRT RTX provider for TensorRT-RTX engines, the TensorRT provider for full TensorRT ones. What is
written follows those providers' own writers (onnxruntime: core/providers/nv_tensorrt_rtx/onnx_ctx_model_helper,
core/providers/tensorrt/onnx_ctx_model_helper) and ONNX Runtime's EP context design:

- node: op `EPContext`, domain `com.microsoft` (opset import com.microsoft 1), inputs and outputs named as the
  engine's tensors (the provider binds graph tensors to engine tensors by name);
- `embed_mode` 0 with `ep_cache_context` the engine's file name beside the model (the provider refuses absolute
  paths and `..`), or `embed_mode` 1 with the engine bytes in the attribute (--embed);
- `hardware_architecture`: the compute capability without the dot ("86"), or "80+" for an ampere_plus build;
- `source`, `partition_name`, `ep_sdk_version` (the backend version), `main_context` (as the RTX provider writes
  it: 0, every node holds its own engine) and `notes` (trtflow, engine sha256);
- graph I/O: the engine's names, element types and shapes, a dynamic dimension as a named symbolic dimension.

Engines cannot run here (no GPU): the models are checked with the ONNX checker, and the tests read them back.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from trtflow import __version__
from trtflow.deploy.provision import SAFE_NAME, Package, copy_verified
from trtflow.deploy.triton import CannotExport
from trtflow.manifest import Engine, Tensor
from trtflow.util.cc import ComputeCapability
from trtflow.util.fs import atomic_write, atomic_writer, first_link

SOURCES = {"tensorrt-rtx": "NvTensorRTRTXExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
ONNX_TYPES = {
    "float32": "FLOAT",
    "float16": "FLOAT16",
    "bfloat16": "BFLOAT16",
    "int8": "INT8",
    "int32": "INT32",
    "int64": "INT64",
    "bool": "BOOL",
    "uint8": "UINT8",
    "float8e4m3": "FLOAT8E4M3FN",
}
IR_VERSION = 10  # ONNX Runtime 1.20 and newer load it
OPSET = 17
MAX_EMBEDDED = (2 << 30) - (64 << 20)  # protobuf's 2 GiB message limit, less room for the rest of the model


def context_model(package: Package, engine: Engine, engine_file: str, embed: bytes | None):
    """The ONNX model (onnx.ModelProto) whose EPContext node holds `embed` or references `engine_file`."""
    import onnx
    from onnx import helper

    inputs = [t for t in engine.tensors if t.mode == "input"]
    outputs = [t for t in engine.tensors if t.mode == "output"]
    attributes: dict[str, Any] = {
        "main_context": 0,
        "embed_mode": 1 if embed is not None else 0,
        "ep_cache_context": embed if embed is not None else engine_file,
        "hardware_architecture": _hardware_architecture(engine),
        "source": SOURCES[engine.backend],
        "partition_name": f"{package.manifest.recipe}_{engine.target}_{engine.precision}",
        "ep_sdk_version": engine.backend_version,
        "notes": f"trtflow {__version__}; engine sha256 {engine.sha256}; target {engine.target}",
    }
    node = helper.make_node(
        "EPContext",
        [t.name for t in inputs],
        [t.name for t in outputs],
        name=attributes["partition_name"],
        domain="com.microsoft",
        **attributes,
    )
    graph = helper.make_graph(
        [node],
        f"{package.manifest.recipe}_{engine.precision}",
        [_value_info(t) for t in inputs],
        [_value_info(t) for t in outputs],
    )
    model = helper.make_model(
        graph,
        producer_name="trtflow",
        producer_version=__version__,
        ir_version=IR_VERSION,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _hardware_architecture(engine: Engine) -> str:
    if engine.hardware_compatibility == "ampere_plus":
        return "80+"
    return ",".join(ComputeCapability.parse(cc).removeprefix("sm_") for cc in engine.compute_capabilities)


def _value_info(tensor: Tensor):
    """A graph input/output with the engine's element type and shape; -1 becomes a symbolic dimension."""
    from onnx import TensorProto, helper

    if tensor.dtype not in ONNX_TYPES:
        raise CannotExport(f"tensor {tensor.name!r} has dtype {tensor.dtype}, which an ONNX graph input cannot declare")
    dims = [
        ("batch" if axis == 0 else f"{tensor.name}_dim{axis}") if size < 0 else size
        for axis, size in enumerate(tensor.shape)
    ]
    return helper.make_tensor_value_info(tensor.name, getattr(TensorProto, ONNX_TYPES[tensor.dtype]), dims)


def export_ort_context(package: Package, dest: Path, embed: bool = False) -> list[dict]:
    """Write `<dest>/<recipe>-<target>-<precision>_ctx.onnx` (and the engine beside it unless embedded) for every
    engine."""
    for engine in package.manifest.engines:  # refuse before anything is written
        if engine.backend not in SOURCES:
            raise CannotExport(
                f"{package.where(engine.file)}: backend {engine.backend} has no ONNX Runtime execution provider that "
                "loads its engines"
            )
        if embed and engine.size > MAX_EMBEDDED:
            raise CannotExport(
                f"{package.where(engine.file)}: {engine.size} bytes cannot be embedded (an ONNX model is under 2 GiB); "
                "export without --embed to keep the engine beside the model"
            )
        if not SAFE_NAME.fullmatch(_stem(package, engine)):
            raise CannotExport(
                f"{package.path}: {_stem(package, engine)!r} is not a plain file name; refusing it (rebuild the "
                "package with `trtflow run`)"
            )
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CannotExport(f"--dest {dest}: cannot make the folder: {exc.strerror or exc}") from exc
    outputs = [
        dest / f"{_stem(package, e)}{suffix}" for e in package.manifest.engines for suffix in (".engine", "_ctx.onnx")
    ]
    link = first_link(outputs)
    if link is not None:
        raise CannotExport(f"--dest {dest}: {link} is a symlink; refusing to write through it (remove it)")
    return [_export_one(package, engine, dest, embed) for engine in package.manifest.engines]


def _stem(package: Package, engine: Engine) -> str:
    return f"{package.manifest.recipe}-{engine.target}-{engine.precision}"


def _export_one(package: Package, engine: Engine, dest: Path, embed: bool) -> dict:
    """The engine (verified while copied) beside its context model, or inside it."""
    engine_path, model_path = dest / f"{_stem(package, engine)}.engine", dest / f"{_stem(package, engine)}_ctx.onnx"
    payload = None
    if embed:
        buffer = io.BytesIO()
        copy_verified(package, engine, buffer)
        payload = buffer.getvalue()
    else:
        with atomic_writer(engine_path) as sink:
            copy_verified(package, engine, sink)
    atomic_write(model_path, context_model(package, engine, engine_path.name, payload).SerializeToString())
    return {
        "model": str(model_path),
        "engine": None if embed else str(engine_path),
        "embed_mode": int(embed),
        "source": SOURCES[engine.backend],
        "target": engine.target,
        "precision": engine.precision,
        "sha256": engine.sha256,
        "inputs": [t.name for t in engine.tensors if t.mode == "input"],
        "outputs": [t.name for t in engine.tensors if t.mode == "output"],
    }
