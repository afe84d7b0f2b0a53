"""Engine building shared by TensorRT and TensorRT-RTX, which expose the same Python API.

Each function takes the imported TensorRT module (`trt`) as its first argument so one code path
serves both backends; the backend modules only add what differs (targets, compatibility flags).
"""

from __future__ import annotations

from typing import Any, Callable

from trtflow.backends.base import BuildRequest, BuildResult, TensorSpec
from trtflow.errors import StageError

DTYPE_NAMES = {
    "FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8", "INT32": "int32",
    "INT64": "int64", "BOOL": "bool", "UINT8": "uint8", "FP8": "float8e4m3", "INT4": "int4", "FP4": "float4e2m1",
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
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(onnx_path):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise StageError("the ONNX parser rejected the model: " + "; ".join(errors or logger.lines))
    return network, parser


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
            BUILDER_OPTIONS[name](trt, config, value)
    return config


def _workspace(trt: Any, config: Any, mib: int) -> None:
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, mib << 20)


def _optimization_level(trt: Any, config: Any, level: int) -> None:
    config.builder_optimization_level = level


def _profiling_verbosity(trt: Any, config: Any, verbosity: str) -> None:
    config.profiling_verbosity = getattr(trt.ProfilingVerbosity, verbosity.upper())


# The recipe's `build:` options (trtflow.recipe.build.BuildOptions) by name -> how each is set on a builder config.
BUILDER_OPTIONS: dict[str, Callable[[Any, Any, Any], None]] = {
    "workspace_mib": _workspace,
    "optimization_level": _optimization_level,
    "profiling_verbosity": _profiling_verbosity,
}


def tensors_from_network(network: Any) -> list[TensorSpec]:
    """The I/O tensors as the network declares them, inputs first."""
    tensors = []
    for mode, count, get in (("input", network.num_inputs, network.get_input), ("output", network.num_outputs, network.get_output)):
        for index in range(count):
            tensor = get(index)
            dtype = DTYPE_NAMES.get(tensor.dtype.name, tensor.dtype.name.lower())
            tensors.append(TensorSpec(name=tensor.name, mode=mode, dtype=dtype, shape=list(tensor.shape)))
    return tensors


def build_engine(trt: Any, request: BuildRequest, configure: Callable[[Any, Any], None], backend: str) -> BuildResult:
    """Parse, configure (`configure(config, logger)` adds backend specifics), build, write the engine file."""
    logger = make_logger(trt)
    builder = trt.Builder(logger)
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
    )


def outputs_from_engine(trt: Any, engine_path: Any, feeds: dict) -> dict:
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
    engine = trt.Runtime(logger).deserialize_cuda_engine(engine_path.read_bytes())
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


TORCH_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "int32": "int32", "int64": "int64",
                "int8": "int8", "uint8": "uint8", "bool": "bool"}


def _bind_output(trt: Any, engine: Any, context: Any, name: str, torch: Any) -> Any:
    dtype_name = DTYPE_NAMES.get(engine.get_tensor_dtype(name).name)
    if dtype_name not in TORCH_DTYPES:
        raise StageError(f"output {name} has dtype {dtype_name}, which engine runs cannot read back yet")
    tensor = torch.empty(tuple(context.get_tensor_shape(name)), dtype=getattr(torch, TORCH_DTYPES[dtype_name]), device="cuda")
    context.set_tensor_address(name, tensor.data_ptr())
    return tensor
