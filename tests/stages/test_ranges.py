"""AutoCast's value ranges measured by trtflow (stages.ranges): the same fp32 decisions as ModelOpt's own reference
run on float tensors, in groups when one sample's activations pass the budget, and integer tensors left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from zoo import export_onnx, zoo_model

from trtflow.recipe.precision import AutocastOptions
from trtflow.stages import compare, convert
from trtflow.stages.ranges import float_ranges

OPTIONS = AutocastOptions().model_dump()


def _feeds(count: int, scale: float) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [{"input": rng.standard_normal((2, 3, 64, 64)).astype(np.float32) * scale} for _ in range(count)]


def _modelopts_own(path: Path, feeds: list[dict], folder: Path) -> onnx.ModelProto:
    """AutoCast as trtflow called it before: ModelOpt's reference run over a folder of .npz feeds."""
    from modelopt.onnx.autocast import convert_to_mixed_precision

    folder.mkdir()
    for index, feed in enumerate(feeds):
        np.savez(folder / f"{index:02d}.npz", **feed)
    with convert.quiet():
        return convert_to_mixed_precision(
            onnx_path=str(path), low_precision_type="fp16", keep_io_types=True, calibration_data=str(folder)
        )


def test_the_measured_ranges_make_the_same_model_as_modelopts_reference_run(tmp_path: Path, zoo_dir: Path) -> None:
    """ResNet-18 layout on inputs scaled so that some activations pass data_max (512) and others do not: byte for
    byte the model ModelOpt makes from its own reference run."""
    path = zoo_model("resnet", zoo_dir).path
    feeds = _feeds(3, scale=20.0)
    theirs = _modelopts_own(path, feeds, tmp_path / "npz")
    with convert.quiet():
        ours, reasons = convert.autocast(path, "fp16", OPTIONS, float_ranges(path, feeds))
    # the scale drives some activations past 512 and leaves most within it
    assert 0 < len(reasons) < len(ours.graph.node) / 2, reasons
    assert ours.SerializeToString() == theirs.SerializeToString()


@pytest.fixture(scope="module")
def small_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BERT (2 layers, hidden 64, the real 30,522-token vocabulary) with token ids, a mask and token types."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128, initializer_range=0.1
    )
    model = transformers.BertModel(config).eval()
    ids = torch.zeros((2, 16), dtype=torch.int64)
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    names = ["input_ids", "attention_mask", "token_type_ids"]
    export_onnx(model, (ids, torch.ones_like(ids), torch.zeros_like(ids)), names, ["last_hidden_state"], None, path)
    return path


def test_token_ids_do_not_keep_the_word_embeddings_in_fp32(small_bert: Path, tmp_path: Path) -> None:
    """ModelOpt's own run judges the int64 token ids (up to 30,521) against fp16's range and keeps the embedding
    lookup, and its 30,522 x 64 table, in fp32; trtflow measures float tensors only."""
    values = compare.input_values(small_bert, {})
    feeds = compare.sample_feeds(compare.signature(small_bert), [], 2, seed=0, values=values)
    assert max(int(f["input_ids"].max()) for f in feeds) > 512
    theirs = _modelopts_own(small_bert, feeds, tmp_path / "npz")
    ranges = float_ranges(small_bert, feeds)
    assert "input_ids" not in ranges and all(r.elements > 0 for r in ranges.values())
    with convert.quiet():
        ours, _ = convert.autocast(small_bert, "fp16", OPTIONS, ranges)

    def table_type(model: onnx.ModelProto) -> int:
        (table,) = [i for i in model.graph.initializer if i.dims and i.dims[0] == 30522]
        return table.data_type

    assert table_type(theirs) == onnx.TensorProto.FLOAT
    assert table_type(ours) == onnx.TensorProto.FLOAT16
