"""Export: a framework's model to ONNX, proven equal to the framework on ONNX Runtime. One stage kind (`export`, one
version) with one exporter per source: from_torch (torch.onnx.export, dynamo), from_huggingface (a save_pretrained
folder, exported the same way) and from_tensorflow (tf2onnx, for
SavedModel and Keras); common holds what they share. ONNX sources have no export node.
"""

from __future__ import annotations

from pathlib import Path

from trtflow.stages.base import (
    SMALL_INPUTS,
    Node,
    Placement,
    RecipeContext,
    Stage,
    StageOutput,
    StageParams,
    Upstream,
    declared_memory,
)
from trtflow.stages.export import from_huggingface, from_tensorflow, from_torch, torch_module
from trtflow.stages.export.common import KIND, VERSION
from trtflow.store.records import StageRecord
from trtflow.util.servers import USER_CODE_SERVER


def node(ctx: RecipeContext) -> Node | None:
    """The export node of a torch, TensorFlow or Keras source; None for an ONNX source."""
    return from_torch.node(ctx) or from_huggingface.node(ctx) or from_tensorflow.node(ctx)


def run(params: StageParams, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    """Export with the exporter the params belong to."""
    if isinstance(params, from_torch.Params):
        return from_torch.run(params, inputs, workdir)
    if isinstance(params, from_huggingface.Params):
        return from_huggingface.run(params, inputs, workdir)
    assert isinstance(params, from_tensorflow.Params)
    return from_tensorflow.run(params, inputs, workdir)


def finish(node: Node, record: StageRecord, place: Placement) -> str | None:
    """A cached export whose proof failed under on_fail: warn fails the run once on_fail is fail."""
    if isinstance(node.params, torch_module.ModuleExport):  # torch and Hugging Face sources
        return torch_module.finish(node, record, place)
    return from_tensorflow.finish(node, record, place)


STAGE = Stage(
    KIND,
    VERSION,
    run,
    finish=finish,
    imports=lambda params: torch_module.EXPORTER_MODULES if isinstance(params, torch_module.ModuleExport) else (),
    runs_in=USER_CODE_SERVER,  # it runs user code: a child of its own each, so a crash names itself
    memory=declared_memory(1 << 30, 4.0),
    # measured on `validate --export` of ResNet-18, EfficientNet-B0 and an encoder from torch factories: 2-6% faster
    # without them in each of 7 alternated rounds; BERT-base's 440 MB folder the same either way (docs/memory.md)
    huge_pages_above=SMALL_INPUTS,
)
