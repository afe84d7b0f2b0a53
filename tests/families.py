"""The models teams ship today, for the tests: transformers architectures at their real sizes with seeded random
weights, exported to ONNX on demand into a cache folder (nothing is downloaded: each is built from its config).

    model = family_model("bert", cache_dir)     # ZooModel: path, inputs, profile

    bert    BERT-base (12 layers, hidden 768, vocabulary 30522): input_ids, attention_mask, token_type_ids (int64),
            batch 1-8 x sequence 16-128; sequence-classification head (2 labels)
    bert_narrow_init  the same with initializer_range 0.04, not 0.1; measured by benchmarks/fallback.py
    bert_outliers  bert_narrow_init with two hidden dimensions of outsized LayerNorm weight in three layers, as a
            trained BERT-base has; measured by benchmarks/fallback.py
    gpt2    GPT-2 small (12 layers, hidden 768, vocabulary 50257), no cache: input_ids, attention_mask, batch 1-4 x
            sequence 8-64; the LM head's logits
    gpt2_large  GPT-2-large size (36 layers, hidden 1280: 774M parameters, 3.1 GB of external data), no cache,
            batch 1-2 x sequence 8-32; measured by benchmarks/model_families.py
    vit     ViT-B/16 (12 layers, hidden 768, patch 16, 1000 labels) at 224x224, batch 1-4
    whisper Whisper-tiny's audio encoder (4 layers, d_model 384): input_features [1, 80, 3000]
    unet    a Stable-Diffusion-like UNet (diffusers, 142M parameters): sample [2, 4, 64, 64], timestep [2],
            encoder_hidden_states [2, 77, 768]; measured by benchmarks/model_families.py (its fp16 run, 200 s on two
            cores, does not fit the CI run beside the rest)
    detector  an SSD-lite-style detector (conv backbone, 3 anchors per cell of a 20x20 grid, 4 classes) at 320x320
            whose graph ends in NonMaxSuppression: boxes, scores and the selected indices

Weights are drawn with the model's own initializer from a fixed seed, with `initializer_range` raised so that outputs
depend on the inputs (at the default 0.02 a random BERT's logits barely move with its tokens). Exports use
torch.onnx.export(dynamo=True) at opset 18 with batch and sequence dynamic, as a user exporting by hand would.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock
from zoo import SEED, Shapes, ZooModel, export_onnx

FAMILIES_VERSION = 2


@dataclass(frozen=True)
class _Family:
    make: Callable[[], torch.nn.Module]
    profile: dict[str, Shapes]  # in the order of forward's keyword arguments
    outputs: tuple[str, ...]
    summary: str


def _text(batch: tuple[int, int, int], sequence: tuple[int, int, int], *names: str) -> dict[str, Shapes]:
    shapes = Shapes(min=(batch[0], sequence[0]), opt=(batch[1], sequence[1]), max=(batch[2], sequence[2]))
    return dict.fromkeys(names, shapes)


class _Logits(torch.nn.Module):
    """forward(*inputs) -> the model's logits only: an ONNX graph with one named output, as a serving export has."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs, strict=True))).logits


def bert(initializer_range: float = 0.1) -> torch.nn.Module:
    """BERT-base for sequence classification, random weights (seeded)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(SEED)
    config = BertConfig(initializer_range=initializer_range, num_labels=2, attn_implementation="eager")
    return BertForSequenceClassification(config).eval()


def bert_narrow_init() -> torch.nn.Module:
    """BERT-base as `bert`, with initializer_range 0.04 instead of 0.1."""
    return bert(0.04)


# Trained BERT-base carries a few hidden dimensions of outsized LayerNorm weight (308 and 381 in bert-base-uncased:
# Kovaleva et al., "BERT Busters", 2021), whose activations reach tens where the rest stay near one; per-tensor int8
# of the tensors that carry them is the known reason its PTQ misses (Bondarenko et al., "Understanding and Overcoming
# the Challenges of Efficient Transformer Quantization", 2021).
OUTLIER_DIMENSIONS = (308, 381)
OUTLIER_LAYERS = (8, 9, 10)  # whose output LayerNorm carries them (into the next layer's attention)
OUTLIER_GAIN = 12.0


def bert_outliers() -> torch.nn.Module:
    """BERT-base as `bert_narrow_init`, with OUTLIER_DIMENSIONS' LayerNorm weights at OUTLIER_GAIN in the output
    LayerNorms of OUTLIER_LAYERS, as a trained BERT's are."""
    model = bert(0.04)
    with torch.no_grad():
        for layer in OUTLIER_LAYERS:
            norm = model.bert.encoder.layer[layer].output.LayerNorm
            norm.weight[list(OUTLIER_DIMENSIONS)] = OUTLIER_GAIN
    return model


def gpt2() -> torch.nn.Module:
    """GPT-2 small language model without a key/value cache, random weights (seeded)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    config = GPT2Config(initializer_range=0.1, use_cache=False, attn_implementation="eager")
    return GPT2LMHeadModel(config).eval()


def gpt2_large() -> torch.nn.Module:
    """GPT-2-large size (36 layers, hidden 1280, 20 heads: 774M parameters, 3.1 GB in fp32) without a cache: a
    model past protobuf's 2 GB, exported with external data."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    config = GPT2Config(
        n_embd=1280, n_layer=36, n_head=20, initializer_range=0.1, use_cache=False, attn_implementation="eager"
    )
    return GPT2LMHeadModel(config).eval()


def vit() -> torch.nn.Module:
    """ViT-B/16 for image classification at 224x224 (12 layers, hidden 768, 1000 labels), random weights (seeded)."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(SEED)
    config = ViTConfig(initializer_range=0.1, num_labels=1000, attn_implementation="eager")
    return ViTForImageClassification(config).eval()


def whisper() -> torch.nn.Module:
    """Whisper-tiny's audio encoder (4 layers, d_model 384, 6 heads, 80 mel bins x 3000 frames), random weights."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(SEED)
    config = WhisperConfig(
        d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6, decoder_attention_heads=6,
        encoder_ffn_dim=1536, decoder_ffn_dim=1536, init_std=0.1, attn_implementation="eager",
    )  # fmt: skip
    return WhisperForConditionalGeneration(config).model.encoder.eval()


def unet() -> torch.nn.Module:
    """A Stable-Diffusion-like UNet (diffusers UNet2DConditionModel: channels 128-256-512-512, cross-attention over 77
    tokens of 768, 142M parameters) on 64x64 latents, random weights (seeded)."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(SEED)
    return UNet2DConditionModel(
        sample_size=64, block_out_channels=(128, 256, 512, 512), cross_attention_dim=768, attention_head_dim=8
    ).eval()


class Detector(torch.nn.Module):
    """image [1, 3, 320, 320] -> boxes [1, 1200, 4] (sigmoid-decoded corners), scores [1, 4, 1200]."""

    def __init__(self, classes: int = 4, anchors: int = 3):
        from zoo import ConvBNAct

        super().__init__()
        widths = (3, 16, 32, 64, 128)
        self.backbone = torch.nn.Sequential(*(ConvBNAct(a, b, 3, 2) for a, b in zip(widths, widths[1:], strict=False)))
        self.boxes = torch.nn.Conv2d(128, anchors * 4, 3, padding=1)
        self.scores = torch.nn.Conv2d(128, anchors * classes, 3, padding=1)
        self.classes = classes

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.backbone(image)
        boxes = torch.sigmoid(self.boxes(features)).permute(0, 2, 3, 1).reshape(1, -1, 4)
        low, high = boxes[..., :2], boxes[..., :2] + 0.25 * boxes[..., 2:]
        scores = torch.sigmoid(self.scores(features)).permute(0, 2, 3, 1).reshape(1, -1, self.classes)
        return torch.cat([low, high], dim=-1), scores.transpose(1, 2)


def detector() -> torch.nn.Module:
    """The detector with seeded weights and settled BatchNorm statistics."""
    from zoo import _settled

    torch.manual_seed(SEED)
    return _settled(Detector(), 3, 320, 320)


_SPECS: dict[str, _Family] = {
    "bert": _Family(
        bert,
        _text((1, 4, 8), (16, 64, 128), "input_ids", "attention_mask", "token_type_ids"),
        ("logits",),
        "BERT-base, 3 int64 inputs sharing batch and sequence",
    ),
    "bert_narrow_init": _Family(
        bert_narrow_init,
        _text((1, 4, 8), (16, 64, 128), "input_ids", "attention_mask", "token_type_ids"),
        ("logits",),
        "BERT-base with initializer_range 0.04 (benchmarks/fallback.py: where plain int8 meets the limits)",
    ),
    "bert_outliers": _Family(
        bert_outliers,
        _text((1, 4, 8), (16, 64, 128), "input_ids", "attention_mask", "token_type_ids"),
        ("logits",),
        "BERT-base with a trained BERT's outlier dimensions (benchmarks/fallback.py: where plain int8 misses)",
    ),
    "gpt2": _Family(
        gpt2, _text((1, 2, 4), (8, 32, 64), "input_ids", "attention_mask"), ("logits",), "GPT-2 small, no cache"
    ),
    "gpt2_large": _Family(
        gpt2_large,
        _text((1, 1, 2), (8, 16, 32), "input_ids", "attention_mask"),
        ("logits",),
        "GPT-2-large size (774M parameters, 3.1 GB), external data",
    ),
    "vit": _Family(vit, {"pixel_values": Shapes.batched(3, 224, 224, opt=2, high=4)}, ("logits",), "ViT-B/16, 224x224"),
    "whisper": _Family(
        whisper, {"input_features": Shapes.static(1, 80, 3000)}, ("last_hidden_state",), "Whisper-tiny encoder"
    ),
    "unet": _Family(
        unet,
        {
            "sample": Shapes.static(2, 4, 64, 64),
            "timestep": Shapes.static(2),
            "encoder_hidden_states": Shapes.static(2, 77, 768),
        },
        ("out_sample",),
        "Stable-Diffusion-like UNet, 142M parameters, 64x64 latents",
    ),
    "detector": _Family(
        detector,
        {"image": Shapes.static(1, 3, 320, 320)},
        ("boxes", "scores", "selected_indices"),
        "SSD-lite-style detector ending in NonMaxSuppression",
    ),
}
FAMILIES: tuple[str, ...] = tuple(_SPECS)


def family_model(name: str, cache_dir: Path) -> ZooModel:
    """The named model as ONNX (external data beside it when past 2 GB), generated into `cache_dir` once."""
    spec = _SPECS[name]
    cache_dir.mkdir(parents=True, exist_ok=True)
    folder = cache_dir / f"family-{name}-v{FAMILIES_VERSION}"  # the model, and its external data when it has some
    path = folder / f"{name}.onnx"
    if not path.is_file():
        with FileLock(str(cache_dir / ".zoo.lock")):
            if not path.is_file():
                partial = cache_dir / f".{folder.name}.{os.getpid()}.partial"
                shutil.rmtree(partial, ignore_errors=True)
                partial.mkdir()
                _export(spec, partial / path.name)
                os.replace(partial, folder)
    return ZooModel(name=name, path=path, profile=spec.profile, summary=spec.summary)


def _export(spec: _Family, path: Path) -> None:
    """torch.onnx.export(dynamo=True) at the opt shapes; a text model's batch and sequence dynamic and shared by every
    input; the detector gets its NonMaxSuppression appended (torch has no ONNX NMS without torchvision)."""
    names = tuple(spec.profile)
    model = spec.make()
    first = next(iter(spec.profile.values()))
    text = len(first.opt) == 2
    if text:
        model = _Logits(model, names)
        examples: tuple = tuple(torch.ones(shapes.opt, dtype=torch.int64) for shapes in spec.profile.values())
        batch = torch.export.Dim("batch", min=first.min[0], max=first.max[0])
        sequence = torch.export.Dim("sequence", min=first.min[1], max=first.max[1])
        dynamic: tuple | None = (tuple({0: batch, 1: sequence} for _ in names),)  # forward(*inputs): one argument
    else:
        examples = tuple(torch.randn(s.opt) for s in spec.profile.values())
        dynamic = _batch_axis(spec.profile)
    outputs = [name for name in spec.outputs if name != "selected_indices"]
    large = sum(p.numel() * p.element_size() for p in model.parameters()) > 2**31 - 2**28
    export_onnx(model, examples, list(names), outputs, dynamic, path, external=large)
    if "selected_indices" in spec.outputs:
        _append_nms(path)


def _batch_axis(profile: dict[str, Shapes]) -> tuple | None:
    """The batch axis dynamic where the profile varies it (an image model's), else static."""
    if all(s.min[0] == s.max[0] for s in profile.values()):
        return None
    first = next(iter(profile.values()))
    batch = torch.export.Dim("batch", min=first.min[0], max=first.max[0])
    return tuple({0: batch} for _ in profile)


def _append_nms(path: Path) -> None:
    """boxes, scores -> NonMaxSuppression (100 per class, IoU 0.5, score 0.3) -> selected_indices [K, 3]."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(path)
    constants = {"max_per_class": np.array([100], np.int64), "iou": np.array([0.5], np.float32)}
    constants["score"] = np.array([0.3], np.float32)
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in constants.items())
    model.graph.node.append(
        helper.make_node(
            "NonMaxSuppression", ["boxes", "scores", *constants], ["selected_indices"], name="nms", center_point_box=0
        )
    )
    model.graph.output.append(helper.make_tensor_value_info("selected_indices", TensorProto.INT64, ["selected", 3]))
    onnx.save(model, path)
