"""Export of TensorFlow sources: a SavedModel signature or a Keras model file to ONNX with tf2onnx, checked on ONNX
Runtime.

The way off TF-TRT (disabled from TensorFlow 2.18): tf2onnx is the maintained TensorFlow -> ONNX converter, and the
one Keras 3's own `model.export(format="onnx")` calls. Measured with TensorFlow 2.21 (CPU), Keras 3.15 and tf2onnx
1.17: a Keras CNN with BatchNorm and a 50-step LSTM convert in 0.1-0.4 s (importing TensorFlow takes 2-4 s) and
match TensorFlow within 1e-6. Its `convert.from_function` fails on a loaded signature (`_WrapperFunction` has no
`get_concrete_function`); what its command line does works: `tf_loader.from_saved_model` for the signature's
frozen graph, `convert.from_graph_def` with the signature's input and output names. A Keras file is loaded with
Keras and converted with `convert.from_keras`. tf2onnx writes opsets up to 18.

tf2onnx does not fail on an op it cannot convert: it logs the op and leaves it in the graph. The ONNX checker
(full check) runs on every result, and such a model fails naming the ops tf2onnx reported.

Shapes: the model's own input signature decides which axes the ONNX inputs leave dynamic; every axis the
profiles make dynamic must be dynamic (None) there, every other axis must match. Dynamic dimensions get stable
names (`<input>_dim<axis>`, tf2onnx's are counters), so the same model exports to the same bytes. The ONNX inputs
and outputs carry the signature's names (Keras: the model's input and output layer names).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from trtflow.backends.base import import_or_explain
from trtflow.errors import StageError, required
from trtflow.stages.base import (
    CACHED_UNDER_WARN,
    Node,
    NodeId,
    Placement,
    ProofSettings,
    RecipeContext,
    StageOutput,
    StageParams,
    Upstream,
    enforce_proof,
)
from trtflow.stages.capture import captured_output
from trtflow.stages.export.common import KIND, VERSION, check_against_reference, dynamic_axes, one_line
from trtflow.stages.modelfile import FILE_NAMES, MODEL
from trtflow.store.records import StageRecord
from trtflow.util.reads import note_glob
from trtflow.util.versions import tool_version

PROOF_FAILED = {
    "saved_model": "source.tensorflow: the exported ONNX differs from TensorFlow",
    "keras": "source.keras: the exported ONNX differs from Keras",
}
FIELD = {"saved_model": "source.tensorflow", "keras": "source.keras"}


class Params(StageParams):
    """What is converted (the SavedModel's files, or the Keras file; signature, tag), how (opset), the dynamic axes the
    profiles ask for, the proof's settings and the converter's and TensorFlow's versions."""

    FINGERPRINT = ("tensorflow", "keras", "tf2onnx", "onnx")
    POLICY = ("on_fail",)
    format: Literal["saved_model", "keras"]
    # SavedModel: every file's path inside the directory (each the input `saved_model/<path>`); Keras: its name
    files: list[str]
    signature: str | None = None
    tag: str | None = None
    opset: int
    profiles: list[dict[str, dict[str, list[int]]]]  # as the recipe gives them: the proof feeds their shapes
    dynamic: dict[str, dict[str, list[int]]]  # input -> axis -> [low, high]: the axes the profiles make dynamic
    check: ProofSettings
    samples: int
    on_fail: Literal["fail", "warn"] = "fail"
    tensorflow: str | None
    keras: str | None
    tf2onnx: str | None
    onnx: str | None


def node(ctx: RecipeContext) -> Node | None:
    """TensorFlow/Keras -> ONNX. Its inputs are every file of the SavedModel directory (or the Keras file): editing a
    variables file re-exports."""
    from trtflow.recipe.source import TF_OPSET

    source = ctx.recipe.source
    if source.tensorflow is None and source.keras is None:
        return None
    verify = ctx.recipe.verify
    common: dict[str, Any] = dict(
        profiles=ctx.profiles,
        dynamic=dynamic_axes(ctx.profiles),
        check=ProofSettings(rtol=verify.rtol, atol=verify.atol, seed=verify.seed, values=ctx.input_values),
        samples=verify.samples_for(len(ctx.profiles)),
        on_fail=verify.on_fail,
        tensorflow=tensorflow_version(),
        keras=tool_version("keras"),
        tf2onnx=tool_version("tf2onnx"),
        onnx=tool_version("onnx"),
    )
    if source.keras is not None:
        path = (ctx.root / source.keras).resolve()
        params = Params(format="keras", files=[path.name], opset=TF_OPSET, **common)
        return Node(id=NodeId.of(KIND, ctx.name), version=VERSION, params=params, sources=(("keras", path),))
    spec = required(source.tensorflow, "source.tensorflow")  # neither keras nor None: checked above
    folder = (ctx.root / spec.saved_model).resolve()
    files = saved_model_files(folder)
    params = Params(
        format="saved_model",
        files=[f.relative_to(folder).as_posix() for f in files],
        signature=spec.signature,
        tag=spec.tag,
        opset=spec.opset,
        **common,
    )
    sources = tuple((f"saved_model/{relative}", path) for relative, path in zip(params.files, files, strict=True))
    return Node(id=NodeId.of(KIND, ctx.name), version=VERSION, params=params, sources=sources)


def saved_model_files(folder: Path) -> list[Path]:
    """Every file under the SavedModel directory, sorted (a file added or removed anywhere changes the export's key)."""
    paths = sorted(folder.rglob("*"))
    note_glob("rglob", str(folder), [str(p) for p in paths])
    return [p for p in paths if p.is_file()]


def tensorflow_version() -> str | None:
    """TensorFlow's version, whichever of its distributions is installed (tensorflow, tensorflow-cpu)."""
    return tool_version("tensorflow") or tool_version("tensorflow-cpu")


def run(params: Params, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    """Load the model with TensorFlow, convert it with tf2onnx, check the ONNX against TensorFlow on ONNX Runtime."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter
    tf = import_or_explain("tensorflow", "tensorflow", "TensorFlow and Keras sources are loaded with it")
    tf2onnx = import_or_explain("tf2onnx", "tensorflow", "it converts TensorFlow models to ONNX")
    with captured_output() as log, _converter_errors() as unsupported:
        if params.format == "keras":
            reference, onnx_model = _keras(tf, tf2onnx, params, inputs["keras"].files["keras"], workdir)
        else:
            reference, onnx_model = _saved_model(tf, tf2onnx, params, _rebuilt_folder(params, inputs, workdir))
    _stabilize_dims(onnx_model)
    _check_converted(onnx_model, params, unsupported)
    path = workdir / FILE_NAMES[MODEL]
    path.write_bytes(onnx_model.SerializeToString())
    check = check_against_reference(path, params.check, params.samples, params.profiles, reference)
    enforce_proof(params.on_fail, check, PROOF_FAILED[params.format])
    record = {
        "exporter": f"tf2onnx {params.tf2onnx} ({_converter(params.format)})",
        "opset": params.opset,
        "nodes": len(onnx_model.graph.node),
        "signature": params.signature,
        "tag": params.tag,
        "inputs": [_io(v) for v in onnx_model.graph.input],
        "outputs": [_io(v) for v in onnx_model.graph.output],
        "dynamic": params.dynamic,
        "tensorflow_equality": check,
        "log": log,
    }
    return StageOutput(files={MODEL: path}, record=record)


def finish(node: Node, record: StageRecord, place: Placement) -> str | None:
    """A cached export whose check failed (it ran under on_fail: warn) fails the run when on_fail is fail now."""
    params = node.params_as(Params)
    enforce_proof(
        params.on_fail, record["record"]["tensorflow_equality"], PROOF_FAILED[params.format], CACHED_UNDER_WARN
    )
    return None


# SavedModel ---------------------------------------------------------------------------------


def _rebuilt_folder(params: Params, inputs: dict[str, Upstream], workdir: Path) -> Path:
    """The SavedModel directory as the inputs hold it (linked, or copied where links cannot be made), under workdir."""
    folder = workdir / "saved_model"
    for relative in params.files:
        role = f"saved_model/{relative}"
        _link_or_copy(inputs[role].files[role], folder / relative)
    return folder


def _link_or_copy(source: Path, target: Path) -> None:
    """`target` shows `source`'s bytes: a symlink, or a copy where links cannot be made."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.symlink(Path(source).resolve(), target)
    except OSError:
        shutil.copyfile(source, target)


def _saved_model(tf: Any, tf2onnx: Any, params: Params, folder: Path) -> tuple[Any, Any]:
    """(TensorFlow's outputs on the proof's inputs, the ONNX model) of the signature."""
    _check_tag_and_signature(tf, params, folder)
    try:
        loaded = tf.saved_model.load(str(folder), tags=[params.tag])
    except Exception as exc:
        raise StageError(f"source.tensorflow.saved_model: TensorFlow cannot load it: {one_line(exc)}") from exc
    function = loaded.signatures[params.signature]
    _, specs = function.structured_input_signature
    _check_shapes(
        params,
        {name: (spec.shape.as_list(), spec.dtype.name) for name, spec in specs.items()},
        f"signature {params.signature}",
    )

    def reference(feed: dict[str, Any]) -> dict[str, Any]:
        outputs = function(**{name: tf.constant(value) for name, value in feed.items()})
        return {name: tensor.numpy() for name, tensor in outputs.items()}

    from tf2onnx import tf_loader

    try:
        graph_def, input_names, output_names, renames = tf_loader.from_saved_model(
            str(folder), None, None, tag=[params.tag], signatures=[params.signature], return_tensors_to_rename=True
        )
        model, _ = tf2onnx.convert.from_graph_def(
            graph_def, input_names=input_names, output_names=output_names, opset=params.opset, tensors_to_rename=renames
        )
    except Exception as exc:
        raise StageError(
            f"source.tensorflow: tf2onnx cannot convert signature {params.signature}: {one_line(exc)}"
        ) from exc
    return reference, model


def _check_tag_and_signature(tf: Any, params: Params, folder: Path) -> None:
    """The tag names a MetaGraph and the signature is one of its signatures, read from saved_model.pb itself."""
    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    try:
        if (folder / "saved_model.pb").is_file():
            saved.ParseFromString((folder / "saved_model.pb").read_bytes())
        else:
            text_format.Parse((folder / "saved_model.pbtxt").read_text(), saved)
    except Exception as exc:
        raise StageError(f"source.tensorflow.saved_model: not a readable SavedModel: {one_line(exc)}") from exc
    graphs = {tuple(g.meta_info_def.tags): sorted(g.signature_def) for g in saved.meta_graphs}
    matching = [signatures for tags, signatures in graphs.items() if params.tag in tags]
    if not matching:
        shown = "; ".join(", ".join(tags) or "(none)" for tags in graphs)
        raise StageError(
            f"source.tensorflow.tag: the SavedModel has no MetaGraph tagged {params.tag!r} (its tags: {shown})"
        )
    if params.signature not in matching[0]:
        shown = ", ".join(s for s in matching[0] if not s.startswith("__")) or "none"
        raise StageError(
            f"source.tensorflow.signature: the SavedModel has no signature {params.signature!r} (its signatures: "
            f"{shown})"
        )


# Keras --------------------------------------------------------------------------------------


def _keras(tf: Any, tf2onnx: Any, params: Params, path: Path, workdir: Path) -> tuple[Any, Any]:
    """(Keras' outputs on the proof's inputs, the ONNX model) of the model file."""
    import keras

    named = workdir / "keras" / params.files[0]  # under its own name: Keras reads the format from the suffix
    _link_or_copy(path, named)
    try:
        model = keras.models.load_model(str(named), compile=False)
    except Exception as exc:
        raise StageError(f"source.keras: Keras cannot load {params.files[0]}: {one_line(exc)}") from exc
    specs = {tensor.name: (list(tensor.shape), _dtype_name(tensor.dtype)) for tensor in model.inputs}
    _check_shapes(params, specs, "the Keras model")
    order = [tensor.name for tensor in model.inputs]
    signature = [tf.TensorSpec(specs[name][0], specs[name][1], name=name) for name in order]
    try:
        converted, _ = tf2onnx.convert.from_keras(model, input_signature=signature, opset=params.opset)
    except Exception as exc:
        raise StageError(f"source.keras: tf2onnx cannot convert the model: {one_line(exc)}") from exc
    output_names = [value.name for value in converted.graph.output]  # the output layers' names, in the model's order

    def reference(feed: dict[str, Any]) -> dict[str, Any]:
        arrays = [feed[name] for name in order]
        outputs = tf.nest.flatten(model(arrays if len(arrays) > 1 else arrays[0], training=False))
        return {name: tf.convert_to_tensor(t).numpy() for name, t in zip(output_names, outputs, strict=True)}

    return reference, converted


def _dtype_name(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else getattr(dtype, "name", str(dtype))


# shared -------------------------------------------------------------------------------------


def _check_shapes(params: Params, specs: dict[str, tuple[list, str]], what: str) -> None:
    """Every model input has a shape in the profiles and each profile input is a model input with its rank, the
    profiles' dynamic axes are dynamic in the model, and its fixed axes have the profiles' sizes."""
    profiled = {name: shape["opt"] for profile in reversed(params.profiles) for name, shape in profile.items()}
    for name in profiled:
        if name not in specs:
            raise StageError(f"profiles: {what} has no input {name!r} (its inputs: {', '.join(specs) or 'none'})")
    for name, (shape, _) in specs.items():
        if name not in profiled:
            raise StageError(
                f"profiles: input {name!r} of {what} has no shape in the profiles; give its min/opt/max in every "
                "profile"
            )
        given = profiled[name]
        if len(given) != len(shape):
            raise StageError(
                f"profiles: input {name!r} has rank {len(given)} in the profiles but rank {len(shape)} in {what} "
                f"{_shown(shape)}"
            )
        for axis, size in enumerate(shape):
            low_high = params.dynamic.get(name, {}).get(str(axis))
            if size is not None and low_high is not None:
                raise StageError(
                    f"profiles: {what} fixes axis {axis} of {name!r} to {size}, but the profiles make it dynamic "
                    f"({low_high[0]}..{low_high[1]}); save the model with None on that axis"
                )
            if size is not None and size != given[axis]:
                raise StageError(
                    f"profiles: axis {axis} of {name!r} is {given[axis]} in the profiles but {size} in {what} "
                    f"{_shown(shape)}"
                )


def _shown(shape: list) -> str:
    return "(" + ", ".join("None" if size is None else str(size) for size in shape) + ")"


@contextlib.contextmanager
def _converter_errors() -> Iterator[list[str]]:
    """The ops tf2onnx logs as unsupported (it does not raise for them), collected for the block."""
    found: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            match = re.search(r"Unsupported ops: Counter\((\{.*\})\)", record.getMessage())
            if match:
                found.extend(re.findall(r"'([^']+)'", match.group(1)))

    handler, logger = Collect(level=logging.ERROR), logging.getLogger("tf2onnx")
    logger.addHandler(handler)
    try:
        yield found
    finally:
        logger.removeHandler(handler)


def _check_converted(model: Any, params: Params, unsupported: list[str]) -> None:
    """The ONNX checker on the whole model; an op tf2onnx could not convert is named."""
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        if unsupported:
            raise StageError(
                f"{FIELD[params.format]}: tf2onnx cannot convert TensorFlow op(s) "
                f"{', '.join(sorted(set(unsupported)))} to "
                f"ONNX opset {params.opset}; replace them in the model or try another opset"
            ) from exc
        raise StageError(
            f"{FIELD[params.format]}: the converted model fails the ONNX checker: {one_line(exc)}"
        ) from exc


def _stabilize_dims(model: Any) -> None:
    """Name every dynamic dimension of the graph's inputs and outputs `<tensor>_dim<axis>` (tf2onnx numbers them
    `unk__N` with a process-wide counter); a symbol an input shares with an output or inner value keeps the input's
    name."""
    renamed: dict[str, str] = {}
    for value in [*model.graph.input, *model.graph.output]:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                continue
            old = dim.dim_param
            new = renamed.get(old) or f"{value.name}_dim{axis}"
            if old:
                renamed.setdefault(old, new)
            dim.dim_param = new
    for value in model.graph.value_info:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in renamed:
                dim.dim_param = renamed[dim.dim_param]


def _io(value: Any) -> dict:
    dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
    return {"name": value.name, "shape": dims}


def _converter(model_format: str) -> str:
    """The tf2onnx entry points a format goes through, as the export record names them."""
    return "from_keras" if model_format == "keras" else "from_saved_model + from_graph_def"
