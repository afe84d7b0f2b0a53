"""Engine building shared by TensorRT and TensorRT-RTX, which expose the same Python API.

Each function takes the imported TensorRT module (`trt`) as its first argument so one code path
serves both backends; the backend modules only add what differs (targets, compatibility flags).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.backends.base import BuildRequest, BuildResult, TensorSpec
from trtflow.errors import StageError, required

DTYPE_NAMES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
    "UINT8": "uint8",
    "FP8": "float8e4m3",
    "INT4": "int4",
    "FP4": "float4e2m1",
}


def make_logger(trt: Any) -> Any:
    """A TensorRT logger that keeps warnings and errors so a failed build can say why."""

    class CollectingLogger(trt.ILogger):
        """Keeps warnings and errors in `lines`; info and verbose messages are dropped."""

        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.lines: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            """Keep a message of WARNING severity or worse as `<SEVERITY>: message`."""
            if severity <= trt.ILogger.Severity.WARNING:
                self.lines.append(f"{severity.name}: {msg}")

    return CollectingLogger()


def network_from_onnx(trt: Any, builder: Any, logger: Any, onnx_path: str) -> tuple[Any, Any]:
    """Parse an ONNX file into a strongly typed network (the only kind TensorRT 11 and RTX build).

    Returns (network, parser): the parser owns the weights the network points at, so the caller
    keeps it alive until the engine is built.
    """
    network = builder.create_network(network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(onnx_path):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise StageError("the ONNX parser rejected the model: " + "; ".join(errors or logger.lines))
    return network, parser


def network_flags(trt: Any) -> int:
    """STRONGLY_TYPED where the API has the flag (TensorRT 10, TensorRT-RTX): the ONNX's types decide each layer's
    precision, as ModelOpt wrote them (fp16 from AutoCast, Q/DQ from PTQ); TensorRT 11 builds nothing else."""
    flag = getattr(getattr(trt, "NetworkDefinitionCreationFlag", None), "STRONGLY_TYPED", None)
    return 1 << int(flag) if flag is not None else 0


def network_facts(network: Any) -> dict:
    """What the network the builder compiled says of itself, without a GPU: its layers (name, type, output type),
    counted by type and by output type. The engine's fused layers and its device memory need the engine inspector
    on a deserialized engine, which only a GPU can give (said in `device_memory`)."""
    layers = []
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        dtype = layer.get_output(0).dtype.name if layer.num_outputs else "none"
        layers.append(
            {"name": layer.name, "type": layer.type.name.lower(), "dtype": DTYPE_NAMES.get(dtype, dtype.lower())}
        )
    return {
        "layers": layers,
        "by_type": _counted(layer["type"] for layer in layers),
        "by_output_dtype": _counted(layer["dtype"] for layer in layers),
        "device_memory": "not known: the engine inspector needs a GPU to deserialize the engine",
    }


def _counted(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items()))


def config_from_request(trt: Any, builder: Any, request: BuildRequest) -> Any:
    """Builder config with profiles and the recipe's builder options (never precision flags)."""
    config = builder.create_builder_config()
    for shapes in request.profiles:
        profile = builder.create_optimization_profile()
        for name, (min_shape, opt_shape, max_shape) in shapes.items():
            profile.set_shape(name, min_shape, opt_shape, max_shape)
        config.add_optimization_profile(profile)
    for name, value in request.options.items():
        if value is not None:
            BUILDER_OPTIONS[name].apply(trt, config, value)
    return config


def _workspace(trt: Any, config: Any, mib: int) -> None:
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, mib << 20)


def _enum_setting(attribute: str, enum: str) -> Callable[[Any, Any, str], None]:
    """Set a config attribute to a member of one of TensorRT's enums, named in lower case in the recipe."""
    return lambda trt, config, value: setattr(config, attribute, getattr(getattr(trt, enum), value.upper()))


def _setting(attribute: str) -> Callable[[Any, Any, Any], None]:
    """Set a plain config attribute."""
    return lambda trt, config, value: setattr(config, attribute, value)


def _flag(name: str) -> Callable[[Any, Any, bool], None]:
    """Set (true) or clear (false) one BuilderFlag."""

    def apply(trt: Any, config: Any, on: bool) -> None:
        (config.set_flag if on else config.clear_flag)(getattr(trt.BuilderFlag, name))

    return apply


@dataclass(frozen=True)
class BuilderOption:
    """How a recipe's `build:` option is set on a builder config, and the API it needs (to refuse it by name where the
    installed backend lacks that API: a config attribute, a BuilderFlag member or an enum)."""

    apply: Callable[[Any, Any, Any], None]
    needs: str  # "config.<attribute>", "flag.<BuilderFlag member>" or "enum.<TensorRT enum>"

    def supported(self, trt: Any) -> bool:
        """Whether the imported TensorRT module has the API this option sets."""
        kind, name = self.needs.split(".")
        owner = {
            "config": getattr(trt, "IBuilderConfig", None),
            "flag": getattr(trt, "BuilderFlag", None),
            "enum": trt,
        }[kind]
        return owner is not None and hasattr(owner, name)


# The recipe's `build:` options (trtflow.recipe.build.BuildOptions) by name -> how each is set on a builder config.
BUILDER_OPTIONS: dict[str, BuilderOption] = {
    "workspace_mib": BuilderOption(_workspace, "config.set_memory_pool_limit"),
    "optimization_level": BuilderOption(_setting("builder_optimization_level"), "config.builder_optimization_level"),
    "profiling_verbosity": BuilderOption(
        _enum_setting("profiling_verbosity", "ProfilingVerbosity"), "config.profiling_verbosity"
    ),
    "tiling_optimization_level": BuilderOption(
        _enum_setting("tiling_optimization_level", "TilingOptimizationLevel"), "enum.TilingOptimizationLevel"
    ),
    "l2_limit_for_tiling": BuilderOption(_setting("l2_limit_for_tiling"), "config.l2_limit_for_tiling"),
    "max_aux_streams": BuilderOption(_setting("max_aux_streams"), "config.max_aux_streams"),
    "max_num_tactics": BuilderOption(_setting("max_num_tactics"), "config.max_num_tactics"),
    "sparse_weights": BuilderOption(_flag("SPARSE_WEIGHTS"), "flag.SPARSE_WEIGHTS"),
    "tf32": BuilderOption(_flag("TF32"), "flag.TF32"),
    "direct_io": BuilderOption(_flag("DIRECT_IO"), "flag.DIRECT_IO"),
    "strict_nans": BuilderOption(_flag("STRICT_NANS"), "flag.STRICT_NANS"),
    "weight_streaming": BuilderOption(_flag("WEIGHT_STREAMING"), "flag.WEIGHT_STREAMING"),
}


def unsupported_options(trt: Any, names: set[str]) -> list[str]:
    """The options among `names` the imported TensorRT module has no API for, in name order."""
    return sorted(name for name in names if name in BUILDER_OPTIONS and not BUILDER_OPTIONS[name].supported(trt))


def tensors_from_network(network: Any) -> list[TensorSpec]:
    """The I/O tensors as the network declares them, inputs first."""
    tensors = []
    for mode, count, get in (
        ("input", network.num_inputs, network.get_input),
        ("output", network.num_outputs, network.get_output),
    ):
        for index in range(count):
            tensor = get(index)
            dtype = DTYPE_NAMES.get(tensor.dtype.name, tensor.dtype.name.lower())
            tensors.append(TensorSpec(name=tensor.name, mode=mode, dtype=dtype, shape=list(tensor.shape)))
    return tensors


def load_plugins(registry: Any, logger: Any, plugins: dict[str, Path]) -> list[Any]:
    """Load each shared library into a plugin registry (the ONNX parser then finds its ops' creators); StageError naming
    the first one TensorRT refuses, with TensorRT's reason. Returns the handles (for deregister_library)."""
    handles = []
    for name, path in plugins.items():
        seen = len(logger.lines)
        handle = registry.load_library(str(path))
        if handle is None:
            raise StageError(f"plugin library {name}: TensorRT refused it: {_load_error(logger.lines[seen:])}")
        handles.append(handle)
    return handles


def _load_error(lines: list[str]) -> str:
    """TensorRT's reason from its log, without its source locations: `SymbolAddress for getCreators could not be
    loaded`."""
    found = next((line for line in lines if "loadLibrary" in line or "load library" in line.lower()), None)
    if found is None:
        return (
            "no reason logged (a plugin library exports getCreators and setLoggerFinder: "
            "the V3 plugin library interface)"
        )
    reason = found.split("(", 1)[1].rsplit(")", 1)[0] if "(" in found else found
    reason = re.sub(r" In \w+ at \S+$", "", reason).strip()
    return re.sub(r"/\S*/", "", reason)  # a path would make the same library fail differently from another folder


def build_engine(trt: Any, request: BuildRequest, configure: Callable[[Any, Any], None], backend: str) -> BuildResult:
    """Load plugins, parse, configure (`configure(config, logger)` adds backend specifics), build, write the engine
    file."""
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    registry = builder.get_plugin_registry() if request.plugins else None
    handles = load_plugins(registry, logger, request.plugins) if request.plugins else []
    try:
        return _build(trt, builder, logger, request, configure, backend)
    finally:
        for handle in handles:  # full TensorRT's builder registry is the process's: the next build must not see them
            required(registry, "the plugin registry").deregister_library(handle)


def _build(
    trt: Any, builder: Any, logger: Any, request: BuildRequest, configure: Callable[[Any, Any], None], backend: str
) -> BuildResult:
    """Parse, configure, build and write the engine file with a builder whose plugins are loaded."""
    network, _parser = network_from_onnx(trt, builder, logger, str(request.onnx_path))
    config = config_from_request(trt, builder, request)
    configure(config, logger)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise StageError("the engine build failed: " + ("; ".join(logger.lines[-5:]) or "no message from the builder"))
    data = memoryview(serialized)
    request.engine_path.write_bytes(data)
    return BuildResult(
        backend=backend,
        backend_version=trt.__version__,
        tensors=tensors_from_network(network),
        engine_bytes=data.nbytes,
        log=logger.lines[-50:],
        network=network_facts(network),
    )


def outputs_from_engine(trt: Any, engine_path: Any, feeds: dict, plugins: dict[str, Path] | None = None) -> dict:
    """Run a serialized engine once on this machine's GPU, with device buffers from torch.

    Only reached where a GPU exists (verify checks first); raises StageError when it cannot run.
    """
    try:
        import torch
    except ImportError:
        raise StageError("running an engine needs torch with CUDA for device buffers: pip install torch") from None
    if not torch.cuda.is_available():
        raise StageError("torch sees no CUDA device")
    logger = make_logger(trt)
    runtime = trt.Runtime(logger)
    load_plugins(runtime.get_plugin_registry(), logger, plugins or {})
    engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
    if engine is None:
        raise StageError("the engine does not load here: " + "; ".join(logger.lines[-3:]))
    context = engine.create_execution_context()
    keep = {name: _bind_input(context, name, array, torch) for name, array in feeds.items()}
    outputs = {name: _bind_output(trt, engine, context, name, torch) for name in _output_names(trt, engine)}
    stream = torch.cuda.Stream()
    if not context.execute_async_v3(stream.cuda_stream):
        raise StageError("engine execution failed: " + "; ".join(logger.lines[-3:]))
    stream.synchronize()
    del keep
    return {name: tensor.float().cpu().numpy() for name, tensor in outputs.items()}


def _output_names(trt: Any, engine: Any) -> list[str]:
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    return [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]


def _bind_input(context: Any, name: str, array: Any, torch: Any) -> Any:
    tensor = torch.from_numpy(array.copy()).cuda().contiguous()
    context.set_input_shape(name, tuple(array.shape))
    context.set_tensor_address(name, tensor.data_ptr())
    return tensor


TORCH_DTYPES = {
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "int32": "int32",
    "int64": "int64",
    "int8": "int8",
    "uint8": "uint8",
    "bool": "bool",
}


def _bind_output(trt: Any, engine: Any, context: Any, name: str, torch: Any) -> Any:
    dtype_name = DTYPE_NAMES.get(engine.get_tensor_dtype(name).name)
    if dtype_name not in TORCH_DTYPES:
        raise StageError(f"output {name} has dtype {dtype_name}, which engine runs cannot read back yet")
    tensor = torch.empty(
        tuple(context.get_tensor_shape(name)), dtype=getattr(torch, TORCH_DTYPES[dtype_name]), device="cuda"
    )
    context.set_tensor_address(name, tensor.data_ptr())
    return tensor
