"""A corpus of real architectures for the tests, generated on demand into a cache folder as ONNX files.

    model = zoo_model("resnet", cache_dir)    # ZooModel: path, inputs, suggested profile
    model.calibration_batches(folder)         # seeded .npy batches at the profile's opt shape (for int8/fp8)

Every model is deterministic: torch weights come from a fixed seed (BatchNorm statistics from a few seeded
batches in train mode), ONNX-built weights from numpy's seeded generator, and node stack traces are dropped,
so a file's bytes depend on the code here and the torch/onnxscript versions only. A file found in the
cache is reused; a new one is written to a temporary name and renamed, under a file lock.

    resnet        ResNet-18 layout: basic blocks (conv-BN-ReLU, stride-2 downsample shortcuts), GAP, Linear
    mobilenet     MobileNetV3-small style: depthwise separable convs, squeeze-excitation, hardswish/hardsigmoid
    efficientnet  EfficientNet-B0 style: MBConv blocks with SiLU and squeeze-excitation
    lstm          2-layer batch-first LSTM over 50 steps of 32 features, Linear head on the last step
    encoder       4-layer TransformerEncoder (d_model 64, 4 heads) over 16 tokens, mean-pooled, Linear head
    classifier    a 3-layer MLP (every layer a Gemm)
    legacy_ir3, legacy_ir3_dynamic
                  a CNN written with onnx.helper at IR version 3 (opset 8, static batch 1 / opset 7, batch N),
                  every initializer also listed as a graph input (the old ONNX model zoo's convention)
    opweights     a conv + MLP whose weights are computed at runtime (ConstantOfShape, Range, Sin, Tile,
                  Reshape, Mul) from small seeds, as the ONNX zoo's VGG-19/AlexNet/ZFNet do: folding the
                  constants turns a 56 kB file into a 34 MB one

The torch architectures are exported with torch.onnx.export(dynamo=True), opset 18, the exporter's own
optimizer on (its default: the file a user gets) and a dynamic batch axis. Their factories (`resnet()`,
`lstm()`, ...) are public, so a recipe can also name them as a torch source: `factory: zoo:resnet`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from filelock import FileLock
from onnx import TensorProto, helper, numpy_helper
from torch import nn

ZOO_VERSION = 2  # part of every cached file's name: bump it when a model here changes
OPSET = 18
SEED = 0

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Shapes:
    """One input's min/opt/max shapes for an optimization profile."""

    min: Shape
    opt: Shape
    max: Shape

    @classmethod
    def batched(cls, *rest: int, low: int = 1, opt: int = 4, high: int = 8) -> Shapes:
        """A dynamic batch axis (low..high, opt in between) in front of fixed dimensions."""
        return cls((low, *rest), (opt, *rest), (high, *rest))

    @classmethod
    def static(cls, *shape: int) -> Shapes:
        """min = opt = max."""
        return cls(shape, shape, shape)

    def as_recipe(self) -> dict[str, list[int]]:
        """The recipe form: {min: [...], opt: [...], max: [...]}."""
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


@dataclass(frozen=True)
class ZooModel:
    """A generated model: its ONNX file, its inputs and a suggested optimization profile."""

    name: str
    path: Path
    profile: dict[str, Shapes]
    summary: str

    @property
    def inputs(self) -> tuple[str, ...]:
        """The graph's real inputs (initializers listed as inputs excluded), in order."""
        return tuple(self.profile)

    @property
    def dynamic(self) -> bool:
        """Whether any input has an axis that varies within the profile."""
        return any(shapes.min != shapes.max for shapes in self.profile.values())

    def recipe_profile(self) -> dict:
        """One entry of a recipe's `profiles:` list (YAML-ready)."""
        return {"inputs": {name: shapes.as_recipe() for name, shapes in self.profile.items()}}

    def build_task(self, cc: str, workdir: Path):  # -> trtflow.executors.StageTask
        """The fp32 build of this model for one compute capability, as a run hands it to a worker (`workdir` made)."""
        from trtflow.executors import StageTask
        from trtflow.stages import build
        from trtflow.stages.base import Upstream

        profile = {
            name: {"min": list(s.min), "opt": list(s.opt), "max": list(s.max)} for name, s in self.profile.items()
        }
        params = build.Params(
            precision="fp32",
            profiles=[profile],
            backend="tensorrt-rtx",
            backend_version=None,
            compute_capabilities=[cc],
            hardware_compatibility="none",
            version_compatible=False,
        )
        workdir.mkdir(parents=True)
        return StageTask(
            f"build:{self.name}/fp32/t", "build", params, {"model": Upstream(files={"model": self.path})}, workdir
        )

    def calibration_batches(self, folder: Path, count: int = 4, seed: int = SEED) -> list[Path]:
        """`count` seeded float32 batches at the opt shape: .npy for one input, .npz (one array per input) else."""
        folder.mkdir(parents=True, exist_ok=True)
        return [
            _write_batch(folder / f"{self.name}_{index:02d}", arrays)
            for index, arrays in enumerate(self.random_feeds(count, seed))
        ]

    def random_feeds(self, count: int, seed: int = SEED) -> list[dict[str, np.ndarray]]:
        """`count` seeded float32 feeds at the opt shape, drawn in order."""
        rng = np.random.default_rng(seed)
        return [
            {name: rng.standard_normal(shapes.opt).astype(np.float32) for name, shapes in self.profile.items()}
            for _ in range(count)
        ]


def _write_batch(stem: Path, arrays: dict[str, np.ndarray]) -> Path:
    """One calibration sample file."""
    if len(arrays) == 1:
        path = stem.with_suffix(".npy")
        np.save(path, next(iter(arrays.values())))
    else:
        path = stem.with_suffix(".npz")
        np.savez(path, **arrays)
    return path


# --- torch building blocks, shared by the architectures -------------------------------------------------------------

Activation = Callable[[], nn.Module]


class ConvBNAct(nn.Sequential):
    """Conv2d (no bias, 'same' padding) -> BatchNorm2d -> optional activation."""

    def __init__(
        self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1, act: Activation | None = nn.ReLU
    ) -> None:
        layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        super().__init__(*layers, *([act()] if act else []))


class SqueezeExcite(nn.Module):
    """Channel attention: global pool -> 1x1 reduce -> act -> 1x1 expand -> gate -> scale the input."""

    def __init__(self, channels: int, reduced: int, act: Activation, gate: Activation) -> None:
        super().__init__()
        self.score = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, reduced, 1), act(), nn.Conv2d(reduced, channels, 1), gate()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.score(x)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv-BN, a 1x1 conv-BN shortcut where the shape changes, ReLU after the sum."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(ConvBNAct(cin, cout, 3, stride), ConvBNAct(cout, cout, 3, act=None))
        changes = stride != 1 or cin != cout
        self.shortcut = ConvBNAct(cin, cout, 1, stride, act=None) if changes else nn.Identity()
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class InvertedResidual(nn.Module):
    """MobileNetV3 bneck / EfficientNet MBConv: 1x1 expand, depthwise kxk, optional SE, 1x1 project, residual."""

    def __init__(
        self, cin: int, cout: int, expanded: int, kernel: int, stride: int, se: bool, act: Activation, gate: Activation
    ) -> None:
        super().__init__()
        layers = [] if expanded == cin else [ConvBNAct(cin, expanded, 1, act=act)]
        layers.append(ConvBNAct(expanded, expanded, kernel, stride, groups=expanded, act=act))
        if se:
            layers.append(SqueezeExcite(expanded, max(8, expanded // 4), act, gate))
        layers.append(ConvBNAct(expanded, cout, 1, act=None))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return x + out if self.residual else out


def _image_classifier(stem: nn.Module, blocks: list[nn.Module], *head: nn.Module) -> nn.Sequential:
    """stem -> blocks -> global average pool -> flatten -> head (ending in nn.Linear, exported as Gemm)."""
    return nn.Sequential(stem, *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), *head)


def _mlp(*widths: int, act: Activation = nn.ReLU) -> nn.Sequential:
    """Linear layers widths[0] -> ... -> widths[-1], an activation between each two."""
    layers: list[nn.Module] = []
    for index, (cin, cout) in enumerate(zip(widths, widths[1:], strict=False)):
        layers += [nn.Linear(cin, cout)] + ([act()] if index < len(widths) - 2 else [])
    return nn.Sequential(*layers)


@contextlib.contextmanager
def _seeded(seed: int = SEED) -> Iterator[None]:
    """torch's CPU generator seeded for the block, restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _settled(model: nn.Module, *example: int, batches: int = 3) -> nn.Module:
    """Seeded batches through the model in train mode (BatchNorm statistics like a trained model's), then eval.

    The running statistics are the settling batches' own (a cumulative average): with BatchNorm's default momentum a
    batch moves them only 10% from their initial values, and the networks' outputs then hardly depended on their
    input (MobileNetV3-small's not at all, ResNet-18's logits 0.997 alike across inputs)."""
    norms = [module for module in model.modules() if isinstance(module, nn.BatchNorm2d)]
    if norms:
        for norm in norms:
            norm.momentum = None
        model.train()
        with torch.no_grad():
            for _ in range(batches):
                model(torch.randn(8, *example))
    return model.eval()


# --- the torch architectures (public: usable as `source.torch.factory`) ------------------------------------------


def resnet(classes: int = 10) -> nn.Module:
    """ResNet-18 layout (2 basic blocks per stage, 4 stages) at small widths, for [N,3,64,64]."""
    widths, blocks, cin = (16, 32, 64, 128), [], 16
    with _seeded():
        for stage, width in enumerate(widths):
            blocks += [BasicBlock(cin, width, 1 if stage == 0 else 2), BasicBlock(width, width, 1)]
            cin = width
        model = _image_classifier(ConvBNAct(3, 16, 3), blocks, nn.Linear(cin, classes))
        return _settled(model, 3, 64, 64)


# MobileNetV3-small's bneck table (kernel, expanded, out, SE, hardswish, stride) at its real widths.
MOBILENET_V3_SMALL = [
    (3, 16, 16, True, False, 2),
    (3, 72, 24, False, False, 2),
    (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2),
    (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1),
    (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1),
]


def mobilenet(classes: int = 10) -> nn.Module:
    """MobileNetV3-small: hardswish stem, bnecks with SE (hardsigmoid gate), 1x1 conv, Linear-hardswish-Linear."""
    blocks, cin = [], 16
    with _seeded():
        for kernel, expanded, cout, se, hardswish, stride in MOBILENET_V3_SMALL:
            act = nn.Hardswish if hardswish else nn.ReLU
            blocks.append(InvertedResidual(cin, cout, expanded, kernel, stride, se, act, nn.Hardsigmoid))
            cin = cout
        blocks.append(ConvBNAct(cin, 288, 1, act=nn.Hardswish))
        model = _image_classifier(
            ConvBNAct(3, 16, 3, 2, act=nn.Hardswish), blocks, *_mlp(288, 256, classes, act=nn.Hardswish)
        )
        return _settled(model, 3, 64, 64)


# EfficientNet-B0's stages (expand ratio, kernel, stride, out channels, repeats), halved widths and one repeat fewer.
EFFICIENTNET_B0 = [
    (1, 3, 1, 8, 1),
    (6, 3, 2, 12, 1),
    (6, 5, 2, 20, 1),
    (6, 3, 2, 40, 2),
    (6, 5, 1, 56, 2),
    (6, 5, 2, 96, 2),
    (6, 3, 1, 160, 1),
]


def efficientnet(classes: int = 10) -> nn.Module:
    """EfficientNet-B0 style: SiLU stem, MBConv stages with SE (sigmoid gate), 1x1 conv head, Linear."""
    blocks, cin = [], 16
    with _seeded():
        for ratio, kernel, stride, cout, repeats in EFFICIENTNET_B0:
            for index in range(repeats):
                blocks.append(
                    InvertedResidual(
                        cin, cout, cin * ratio, kernel, stride if index == 0 else 1, True, nn.SiLU, nn.Sigmoid
                    )
                )
                cin = cout
        blocks.append(ConvBNAct(cin, 320, 1, act=nn.SiLU))
        model = _image_classifier(ConvBNAct(3, 16, 3, 2, act=nn.SiLU), blocks, nn.Dropout(0.2), nn.Linear(320, classes))
        return _settled(model, 3, 64, 64)


class LastStep(nn.Module):
    """A recurrent layer's output sequence, reduced to its last step, then a head."""

    def __init__(self, rnn: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.rnn, self.head = rnn, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class PooledEncoder(nn.Module):
    """A transformer encoder over the tokens, mean-pooled, then a head."""

    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


def lstm(features: int = 32, hidden: int = 64, classes: int = 8) -> nn.Module:
    """2-layer batch-first LSTM, Linear head on the last step; input [N,50,features]."""
    with _seeded():
        return LastStep(nn.LSTM(features, hidden, num_layers=2, batch_first=True), nn.Linear(hidden, classes)).eval()


def encoder(d_model: int = 64, heads: int = 4, layers: int = 4, classes: int = 10) -> nn.Module:
    """4-layer TransformerEncoder (post-norm, ReLU FFN of 2 x d_model); input [N,16,d_model] embeddings."""
    with _seeded():
        layer = nn.TransformerEncoderLayer(d_model, heads, 2 * d_model, dropout=0.0, batch_first=True)
        stack = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        return PooledEncoder(stack, nn.Linear(d_model, classes)).eval()


def classifier(features: int = 64, classes: int = 10) -> nn.Module:
    """An MLP features -> 256 -> 128 -> classes with ReLU: three Gemm nodes once exported."""
    with _seeded():
        return _mlp(features, 256, 128, classes).eval()


# --- models written with onnx.helper -----------------------------------------------------------------------------


def _weight(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.1) -> onnx.TensorProto:
    """A seeded float32 initializer."""
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _constant(name: str, values: list | float, dtype: type = np.int64) -> onnx.TensorProto:
    """A small constant initializer (shapes, repeats, scalars)."""
    return numpy_helper.from_array(np.array(values, dtype=dtype), name)


def _onnx_model(
    name: str,
    nodes: list,
    inputs: dict[str, list],
    outputs: dict[str, list],
    initializers: list,
    opset: int,
    ir_version: int,
    initializers_as_inputs: bool = False,
) -> onnx.ModelProto:
    """A float32 graph; with `initializers_as_inputs` every initializer is also a graph input (IR < 4 style)."""
    graph_inputs = [helper.make_tensor_value_info(key, TensorProto.FLOAT, shape) for key, shape in inputs.items()]
    if initializers_as_inputs:
        graph_inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in initializers]
    graph = helper.make_graph(
        nodes,
        name,
        graph_inputs,
        [helper.make_tensor_value_info(key, TensorProto.FLOAT, shape) for key, shape in outputs.items()],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="trtflow-zoo")
    model.ir_version = ir_version
    onnx.checker.check_model(model)
    return model


def legacy_cnn(opset: int, batch: int | str, seed: int = 3) -> onnx.ModelProto:
    """The old model zoo's form: IR 3, opset 7-8, initializers also graph inputs, BN/Dropout/Softmax left in."""
    rng = np.random.default_rng(seed)
    inits = [
        _weight(rng, "conv1_w_0", 16, 3, 3, 3),
        _weight(rng, "conv1_b_0", 16),
        numpy_helper.from_array(1 + 0.1 * rng.random(16, dtype=np.float32), "bn1_scale_0"),
        _weight(rng, "bn1_b_0", 16),
        _weight(rng, "bn1_mean_0", 16),
        numpy_helper.from_array(0.5 + rng.random(16, dtype=np.float32), "bn1_var_0"),
        _weight(rng, "conv2_w_0", 32, 16, 3, 3),
        _weight(rng, "conv2_b_0", 32),
        _weight(rng, "fc_w_0", 10, 32),
        _weight(rng, "fc_b_0", 10),
    ]
    nodes = [
        helper.make_node("Conv", ["data_0", "conv1_w_0", "conv1_b_0"], ["conv1_1"], pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization",
            ["conv1_1", "bn1_scale_0", "bn1_b_0", "bn1_mean_0", "bn1_var_0"],
            ["bn1_1"],
            epsilon=1e-5,
        ),
        helper.make_node("Relu", ["bn1_1"], ["relu1_1"]),
        helper.make_node("MaxPool", ["relu1_1"], ["pool1_1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["pool1_1", "conv2_w_0", "conv2_b_0"], ["conv2_1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv2_1"], ["relu2_1"]),
        helper.make_node("GlobalAveragePool", ["relu2_1"], ["pool2_1"]),
        helper.make_node("Flatten", ["pool2_1"], ["flat_1"], axis=1),
        helper.make_node("Dropout", ["flat_1"], ["drop_1"]),
        helper.make_node("Gemm", ["drop_1", "fc_w_0", "fc_b_0"], ["fc_1"], transB=1),
        helper.make_node("Softmax", ["fc_1"], ["softmax_1"]),
    ]
    return _onnx_model(
        "legacy_cnn",
        nodes,
        {"data_0": [batch, 3, 32, 32]},
        {"softmax_1": [batch, 10]},
        inits,
        opset=opset,
        ir_version=3,
        initializers_as_inputs=True,
    )


def _runtime_weight(prefix: str, seed: onnx.TensorProto, repeats: list[int], nodes: list, inits: list) -> str:
    """Nodes computing the weight Tile(seed, repeats) * (1 + sin(row index)); returns its name."""
    shape = [size * times for size, times in zip(seed.dims, repeats, strict=True)]
    rows = shape[0]
    inits += [
        seed,
        _constant(f"{prefix}_repeats", repeats),
        _constant(f"{prefix}_start", 0.0, np.float32),
        _constant(f"{prefix}_limit", float(rows), np.float32),
        _constant(f"{prefix}_delta", 1.0, np.float32),
        _constant(f"{prefix}_row_shape", [rows] + [1] * (len(shape) - 1)),
        _constant(f"{prefix}_ones_shape", [1] * len(shape)),
    ]
    nodes += [
        helper.make_node("Tile", [seed.name, f"{prefix}_repeats"], [f"{prefix}_tiled"]),
        helper.make_node("Range", [f"{prefix}_start", f"{prefix}_limit", f"{prefix}_delta"], [f"{prefix}_range"]),
        helper.make_node("Sin", [f"{prefix}_range"], [f"{prefix}_sin"]),
        helper.make_node("Reshape", [f"{prefix}_sin", f"{prefix}_row_shape"], [f"{prefix}_rows"]),
        helper.make_node(
            "ConstantOfShape",
            [f"{prefix}_ones_shape"],
            [f"{prefix}_one"],
            value=numpy_helper.from_array(np.array([1.0], dtype=np.float32)),
        ),
        helper.make_node("Add", [f"{prefix}_rows", f"{prefix}_one"], [f"{prefix}_scale"]),
        helper.make_node("Mul", [f"{prefix}_tiled", f"{prefix}_scale"], [prefix]),
    ]
    return prefix


def opweights(seed: int = 4) -> onnx.ModelProto:
    """Conv 3->32 on [N,3,16,16], then Gemm 8192 -> 1024 -> 10; the conv and the 8192x1024 (32 MiB) weights are
    computed."""
    rng = np.random.default_rng(seed)
    nodes: list = []
    inits = [
        _weight(rng, "conv_b", 32),
        _weight(rng, "fc1_b", 1024),
        _weight(rng, "fc2_w", 1024, 10),
        _weight(rng, "fc2_b", 10),
    ]
    conv_w = _runtime_weight("conv_w", _weight(rng, "conv_seed", 8, 3, 3, 3), [4, 1, 1, 1], nodes, inits)
    fc1_w = _runtime_weight("fc1_w", _weight(rng, "fc1_seed", 64, 32, scale=0.01), [128, 32], nodes, inits)
    nodes += [
        helper.make_node("Conv", ["input", conv_w, "conv_b"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("Flatten", ["relu"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", fc1_w, "fc1_b"], ["fc1"]),
        helper.make_node("Relu", ["fc1"], ["hidden"]),
        helper.make_node("Gemm", ["hidden", "fc2_w", "fc2_b"], ["logits"]),
    ]
    return _onnx_model(
        "opweights", nodes, {"input": ["batch", 3, 16, 16]}, {"logits": ["batch", 10]}, inits, opset=17, ir_version=8
    )


# --- the registry ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    make: Callable[[], nn.Module | onnx.ModelProto]
    profile: dict[str, Shapes]
    summary: str


IMAGE = {"input": Shapes.batched(3, 64, 64)}

_SPECS: dict[str, _Spec] = {
    "resnet": _Spec(resnet, IMAGE, "ResNet-18 layout, basic blocks with downsample shortcuts, GAP, Gemm"),
    "mobilenet": _Spec(mobilenet, IMAGE, "MobileNetV3-small: depthwise separable, SE, hardswish/hardsigmoid"),
    "efficientnet": _Spec(efficientnet, IMAGE, "EfficientNet-B0 style MBConv with SiLU and SE"),
    "lstm": _Spec(lstm, {"sequence": Shapes.batched(50, 32)}, "2-layer LSTM, 50 steps, Linear head on the last step"),
    "encoder": _Spec(
        encoder, {"embeddings": Shapes.batched(16, 64)}, "4-layer TransformerEncoder, d_model 64, 4 heads"
    ),
    "classifier": _Spec(classifier, {"features": Shapes.batched(64, opt=16, high=64)}, "MLP, three Gemm layers"),
    "legacy_ir3": _Spec(
        lambda: legacy_cnn(opset=8, batch=1),
        {"data_0": Shapes.static(1, 3, 32, 32)},
        "IR 3, opset 8, static batch 1, initializers also graph inputs",
    ),
    "legacy_ir3_dynamic": _Spec(
        lambda: legacy_cnn(opset=7, batch="N"),
        {"data_0": Shapes.batched(3, 32, 32)},
        "IR 3, opset 7, batch N, initializers also graph inputs",
    ),
    "opweights": _Spec(
        opweights,
        {"input": Shapes.batched(3, 16, 16)},
        "conv + MLP whose weights are computed by ConstantOfShape/Range/Sin/Tile/Reshape/Mul",
    ),
}

ZOO: tuple[str, ...] = tuple(_SPECS)


def zoo_model(name: str, cache_dir: Path) -> ZooModel:
    """The named model, generated into `cache_dir` unless a file for this ZOO_VERSION is already there."""
    if name not in _SPECS:
        raise KeyError(f"no zoo model {name!r} (there are: {', '.join(ZOO)})")
    spec = _SPECS[name]
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{name}-v{ZOO_VERSION}.onnx"
    if not path.is_file():  # files only appear whole (renamed into place), so no lock is needed to reuse one
        with FileLock(str(cache_dir / ".zoo.lock")):
            if not path.is_file():
                _generate(spec, path)
    return ZooModel(name=name, path=path, profile=spec.profile, summary=spec.summary)


def _generate(spec: _Spec, path: Path) -> None:
    """Build the model and write it under a temporary name, then rename it into place."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    model = spec.make()
    if isinstance(model, onnx.ModelProto):
        onnx.save(model, partial)
    else:
        _export(model, spec.profile, partial)
    os.replace(partial, path)


def _export(model: nn.Module, profile: dict[str, Shapes], path: Path) -> None:
    """torch.onnx.export(dynamo=True) at the profile's opt shapes, the batch axis dynamic over the profile's range."""
    generator = torch.Generator().manual_seed(SEED)
    examples = tuple(torch.randn(shapes.opt, generator=generator) for shapes in profile.values())
    batch = torch.export.Dim(
        "batch", min=min(s.min[0] for s in profile.values()), max=max(s.max[0] for s in profile.values())
    )
    dynamic = tuple({0: batch} if shapes.min[0] != shapes.max[0] else None for shapes in profile.values())
    export_onnx(model, examples, list(profile), ["logits"], dynamic, path)


def export_onnx(
    model: nn.Module,
    examples: tuple,
    inputs: list[str],
    outputs: list[str],
    dynamic,
    path: Path,
    external: bool = False,
) -> None:
    """torch.onnx.export(dynamo=True) at OPSET, quietly, without gradients; node stack traces dropped; saved whole
    (weights inside the file, below protobuf's 2 GB) or, `external`, with the weights in `<name>.data` beside it."""
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            model,
            examples,
            dynamo=True,
            opset_version=OPSET,
            input_names=inputs,
            output_names=outputs,
            dynamic_shapes=dynamic,
            verbose=False,
        )
    for graph in [program.model.graph, *program.model.functions.values()]:
        for node in graph.all_nodes():
            node.metadata_props.pop("pkg.torch.onnx.stack_trace", None)
    program.save(str(path), external_data=external)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No warnings (pytest turns them into errors), exporter progress or torch log lines while exporting."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
