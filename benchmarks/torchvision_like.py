"""torchvision's ResNet-18 and MobileNetV3-small at their real sizes, and a 4-layer transformer encoder, in plain
torch (torchvision has no CPU build on every index), exported to ONNX with a batch 1/8/32 profile: the project the
cold benchmark measures in its `--torchvision` mode.

    python benchmarks/torchvision_like.py DIR   # writes DIR/pipeline.yaml, recipes/ and models/ (fp32, sm_86 + sm_89)

Sizes as torchvision's: ResNet-18 11.7 M parameters, MobileNetV3-small 2.5 M, both on [N, 3, 224, 224] with 1000
classes; the encoder is d_model 256, 4 heads, FFN 1024, over [N, 128, 256] embeddings (3.2 M). EfficientNet-B0 (5.3 M,
its stages, widths and squeeze-excitation as torchvision's) is there for the benchmarks that name it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from zoo import (  # noqa: E402
    MOBILENET_V3_SMALL,
    SEED,
    BasicBlock,
    ConvBNAct,
    InvertedResidual,
    PooledEncoder,
    Shapes,
    SqueezeExcite,
    _export,
    _image_classifier,
    _mlp,
    _quiet,
    _seeded,
    _settled,
)

IMAGE = {"input": Shapes.batched(3, 224, 224, low=1, opt=8, high=32)}
TOKENS = {"embeddings": Shapes.batched(128, 256, low=1, opt=8, high=32)}
TARGETS = {"rtx-ampere": "sm_86", "rtx-ada": "sm_89"}


def resnet18(classes: int = 1000) -> nn.Module:
    """torchvision's resnet18: 7x7/2 stem and max pool, stages of 2 basic blocks at 64/128/256/512, GAP, Linear."""
    blocks: list[nn.Module] = []
    cin = 64
    with _seeded():
        for stage, width in enumerate((64, 128, 256, 512)):
            blocks += [BasicBlock(cin, width, 1 if stage == 0 else 2), BasicBlock(width, width, 1)]
            cin = width
        stem = nn.Sequential(ConvBNAct(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        return _settled(_image_classifier(stem, blocks, nn.Linear(512, classes)), 3, 224, 224, batches=1)


def mobilenet_v3_small(classes: int = 1000) -> nn.Module:
    """torchvision's mobilenet_v3_small: its bneck table, 576-channel 1x1 conv, Linear 576-1024-1000 (hardswish)."""
    blocks: list[nn.Module] = []
    cin = 16
    with _seeded():
        for kernel, expanded, cout, se, hardswish, stride in MOBILENET_V3_SMALL:
            act = nn.Hardswish if hardswish else nn.ReLU
            blocks.append(InvertedResidual(cin, cout, expanded, kernel, stride, se, act, nn.Hardsigmoid))
            cin = cout
        blocks.append(ConvBNAct(cin, 576, 1, act=nn.Hardswish))
        stem = ConvBNAct(3, 16, 3, 2, act=nn.Hardswish)
        model = _image_classifier(stem, blocks, *_mlp(576, 1024, classes, act=nn.Hardswish))
        return _settled(model, 3, 224, 224, batches=1)


# torchvision's efficientnet_b0 stages: (expand ratio, kernel, stride, out channels, repeats)
EFFICIENTNET_B0 = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
                   (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))  # fmt: skip


def efficientnet_b0(classes: int = 1000) -> nn.Module:
    """torchvision's efficientnet_b0: SiLU stem of 32, MBConv stages with squeeze-excitation, 1x1 conv to 1280, Linear
    (5.29 M parameters)."""
    blocks: list[nn.Module] = []
    cin = 32
    with _seeded():
        for ratio, kernel, stride, cout, repeats in EFFICIENTNET_B0:
            for index in range(repeats):
                act, gate, expanded = nn.SiLU, nn.Sigmoid, cin * ratio
                block = InvertedResidual(cin, cout, expanded, kernel, stride if index == 0 else 1, True, act, gate)
                # torchvision squeezes to a quarter of the block's input channels (the zoo's block: of the expanded)
                block.body[-2] = SqueezeExcite(expanded, max(1, cin // 4), act, gate)
                blocks.append(block)
                cin = cout
        blocks.append(ConvBNAct(cin, 1280, 1, act=nn.SiLU))
        model = _image_classifier(ConvBNAct(3, 32, 3, 2, act=nn.SiLU), blocks, nn.Linear(1280, classes))
        return _settled(model, 3, 224, 224, batches=2)


def encoder4(d_model: int = 256, heads: int = 4, layers: int = 4, classes: int = 1000) -> nn.Module:
    """A 4-layer post-norm TransformerEncoder (FFN 4 x d_model), mean-pooled, Linear head."""
    with _seeded():
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True)
        stack = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        return PooledEncoder(stack, nn.Linear(d_model, classes)).eval()


VGG19 = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")


def vgg19(classes: int = 1000) -> nn.Module:
    """torchvision's vgg19 (no batch norm): 16 3x3 convs in 5 blocks, then 25088-4096-4096-1000 (143.7 M parameters,
    a 548 MB ONNX file): the memory benchmark's large model, with its weights as initializers."""
    layers: list[nn.Module] = []
    cin = 3
    with _seeded():
        for width in VGG19:
            if width == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            layers += [nn.Conv2d(cin, int(width), 3, padding=1), nn.ReLU()]
            cin = int(width)
        head = [nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, classes)]
        model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(7), nn.Flatten(), *head)
        for module in model.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                nn.init.zeros_(module.bias)
    return model.eval()


def write_vgg19(path: Path) -> Path:
    """VGG-19 exported to ONNX at a static [1, 3, 224, 224] input, as ONNX's legacy VGG-19 takes it."""
    with torch.no_grad(), _quiet():
        program = torch.onnx.export(
            vgg19(), (torch.randn(1, 3, 224, 224),), dynamo=True, input_names=["input"], output_names=["logits"]
        )
    program.save(str(path))
    return path


MODELS = {
    "resnet18": (resnet18, IMAGE),
    "mobilenet_v3_small": (mobilenet_v3_small, IMAGE),
    "efficientnet_b0": (efficientnet_b0, IMAGE),
    "encoder": (encoder4, TOKENS),
}


TRIO = ("resnet18", "mobilenet_v3_small", "encoder")  # what the cold benchmark's --torchvision project builds


def write_project(
    root: Path, cache: Path, models: tuple[str, ...] = TRIO, precisions: tuple[str, ...] = ("fp32",)
) -> Path:
    """pipeline.yaml for sm_86 and sm_89, one recipe per model with the batch 1/8/32 profile (ONNX cached); with a
    precision other than fp32, 4 seeded calibration batches at the opt shape (as tests/fleet.py writes them)."""
    (root / "recipes").mkdir(parents=True)
    (root / "models").mkdir()
    targets = {name: {"backend": "tensorrt-rtx", "compute_capabilities": [cc]} for name, cc in TARGETS.items()}
    (root / "pipeline.yaml").write_text(yaml.safe_dump({"targets": targets}))
    cache.mkdir(parents=True, exist_ok=True)
    for name in models:
        make, profile = MODELS[name]
        onnx_file = cache / f"{name}.onnx"
        if not onnx_file.is_file():
            with torch.no_grad():
                _export(make(), profile, onnx_file)
        (root / "models" / f"{name}.onnx").write_bytes(onnx_file.read_bytes())
        recipe = {
            "source": {"onnx": f"models/{name}.onnx"},
            "precisions": list(precisions),
            "profiles": [{"inputs": {input_name: s.as_recipe() for input_name, s in profile.items()}}],
        }
        if set(precisions) - {"fp32"}:
            _calibration_batches(root / "calib" / name, profile)
            recipe["calibration"] = {"data": f"calib/{name}/*"}
        (root / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root


def _calibration_batches(folder: Path, profile: dict[str, Shapes], count: int = 4) -> None:
    """`count` seeded float32 batches at the opt shape, one .npz each."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(SEED)
    for index in range(count):
        arrays = {name: rng.standard_normal(shapes.opt).astype(np.float32) for name, shapes in profile.items()}
        np.savez(folder / f"{index:02d}.npz", **arrays)


if __name__ == "__main__":
    write_project(Path(sys.argv[1]), Path(sys.argv[1]) / ".onnx-cache")
