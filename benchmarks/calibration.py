"""Calibration benchmark: seconds and peak memory to calibrate int8 for a ResNet-18-sized conv net on the CPU.

    python benchmarks/calibration.py [--samples 64 256] [--size 224] [--method entropy]

What is measured, each in its own subprocess (so peak RSS is that run's alone):
  1. the model: ResNet-18's topology (conv 7x7/2, max pool, 4 stages of 2 basic blocks with 64-512 channels,
     global pool, 1000-way head; batch norm folded into the conv biases), seeded He-initialised weights, written
     with onnx.helper (no framework needed); input [1, 3, size, size];
  2. the calibration: trtflow's own call into ModelOpt PTQ (trtflow.stages.convert.quantize: int8, the chosen
     method, ONNX Runtime CPU provider) over N samples of batch 1, timed from after the imports;
  3. the baseline, in the same subprocess right before: fp32 ONNX Runtime inference of the same N samples
     (default session options, like ModelOpt's calibration session, so both may use every core);
  4. a table: seconds, peak RSS, RSS after the imports, and calibration time / fp32 inference time.
The imports (ModelOpt pulls torch and ONNX Runtime) are timed separately: a precision stage pays them once per
worker process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (channels, stride of the first block) of ResNet-18's four stages


def resnet18(size: int, seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 as ONNX, batch norm folded into conv biases; weights scaled so activations stay O(1) (He init)."""
    rng = np.random.default_rng(seed)
    net = _Net(rng)
    x = net.conv("input", 3, 64, 7, 2, relu=True)
    net.nodes.append(
        helper.make_node("MaxPool", [x], ["pool1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    )
    x, channels = "pool1", 64
    for out_channels, stride in STAGES:
        for block in range(2):
            x = net.basic_block(x, channels, out_channels, stride if block == 0 else 1)
            channels = out_channels
    net.nodes += [
        helper.make_node("GlobalAveragePool", [x], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
    ]
    net.inits += [net.weight("fc.w", (512, 1000), 512), numpy_helper.from_array(np.zeros(1000, np.float32), "fc.b")]
    net.nodes += [
        helper.make_node("MatMul", ["flat", "fc.w"], ["fc"]),
        helper.make_node("Add", ["fc", "fc.b"], ["logits"]),
    ]
    graph = helper.make_graph(
        net.nodes,
        "resnet18",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])],
        net.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class _Net:
    """Accumulates nodes and initializers; names are generated in order, so the model is the same for a seed."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.nodes, self.inits, self.count = rng, [], [], 0

    def weight(self, name: str, shape: tuple, fan_in: int) -> onnx.TensorProto:
        return numpy_helper.from_array(
            (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name
        )

    def conv(self, x: str, cin: int, cout: int, kernel: int, stride: int, relu: bool) -> str:
        self.count += 1
        name = f"conv{self.count}"
        self.inits += [
            self.weight(f"{name}.w", (cout, cin, kernel, kernel), cin * kernel * kernel),
            numpy_helper.from_array((self.rng.standard_normal(cout) * 0.01).astype(np.float32), f"{name}.b"),
        ]
        pad = kernel // 2
        self.nodes.append(
            helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [name], strides=[stride, stride], pads=[pad] * 4)
        )
        if not relu:
            return name
        self.nodes.append(helper.make_node("Relu", [name], [f"{name}.relu"]))
        return f"{name}.relu"

    def basic_block(self, x: str, cin: int, cout: int, stride: int) -> str:
        y = self.conv(self.conv(x, cin, cout, 3, stride, relu=True), cout, cout, 3, 1, relu=False)
        shortcut = x if stride == 1 and cin == cout else self.conv(x, cin, cout, 1, stride, relu=False)
        self.count += 1
        self.nodes += [
            helper.make_node("Add", [y, shortcut], [f"add{self.count}"]),
            helper.make_node("Relu", [f"add{self.count}"], [f"block{self.count}"]),
        ]
        return f"block{self.count}"


def child(model: str, samples: int, size: int, method: str, workdir: str) -> None:
    """One measurement (runs in its own process): imports, fp32 ORT baseline, then calibration; prints JSON."""
    started = time.perf_counter()
    import onnxruntime as ort

    from trtflow.stages import convert

    convert.modelopt_onnx()
    import modelopt.onnx.quantization  # noqa: F401  (the import a precision stage pays once per worker)

    imports = time.perf_counter() - started
    rss_after_imports = _rss_mib()
    rng = np.random.default_rng(1)
    feeds = [{"input": rng.standard_normal((1, 3, size, size)).astype(np.float32)} for _ in range(samples)]
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    started = time.perf_counter()
    for feed in feeds:
        session.run(None, feed)
    baseline = time.perf_counter() - started
    options = {
        "method": method,
        "percentile": 99.999 if method == "percentile" else None,
        "exclude_op_types": [],
        "exclude_nodes": [],
        "high_precision": "fp16",
        "external_data": False,
    }
    started = time.perf_counter()
    with convert.quiet():
        quantized = convert.quantize(
            Path(model), Path(workdir) / f"int8-{samples}" / "model.onnx", "int8", feeds, options
        )
    calibrate = time.perf_counter() - started
    qdq = convert.qdq_summary(quantized)["quantize_nodes"]
    print(
        json.dumps(
            {
                "samples": samples,
                "imports": imports,
                "baseline": baseline,
                "calibrate": calibrate,
                "qdq": qdq,
                "rss_after_imports": rss_after_imports,
                "peak_rss": _rss_mib(),
            }
        )
    )


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def main() -> int:
    """Run the benchmark and print its table; the exit code says whether the goals were met."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--size", type=int, default=224, help="input height and width (ResNet-18 uses 224)")
    parser.add_argument("--method", choices=["entropy", "max", "percentile"], default="entropy")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "WORKDIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.samples[0], args.size, args.method, args.child[1])
        return 0
    with tempfile.TemporaryDirectory(prefix="trtflow-calib-bench-") as workdir:
        model = Path(workdir) / "resnet18.onnx"
        onnx.save(resnet18(args.size), model)
        print(
            f"model: ResNet-18 topology, input [1, 3, {args.size}, {args.size}], {model.stat().st_size / 2**20:.1f} "
            "MiB, "
            f"int8 {args.method} calibration on {os.cpu_count()} CPU core(s)"
        )
        rows = [_measure(model, n, args, workdir) for n in args.samples]
    _print_table(rows)
    return 0


def _measure(model: Path, samples: int, args: argparse.Namespace, workdir: str) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        str(model),
        workdir,
        "--samples",
        str(samples),
        "--size",
        str(args.size),
        "--method",
        args.method,
    ]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if result.returncode != 0:
        raise SystemExit(f"calibrating on {samples} samples failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _print_table(rows: list[dict]) -> None:
    print(
        f"{'samples':>8} {'calibrate s':>12} {'fp32 ORT s':>11} {'ratio':>7} {'s/sample':>9} {'peak RSS MiB':>13} "
        f"{'RSS after imports':>18} {'Q nodes':>8}"
    )
    for row in rows:
        print(
            f"{row['samples']:>8} {row['calibrate']:>12.2f} {row['baseline']:>11.2f} "
            f"{row['calibrate'] / row['baseline']:>6.1f}x "
            f"{row['calibrate'] / row['samples']:>9.3f} {row['peak_rss']:>13.0f} {row['rss_after_imports']:>18.0f} "
            f"{row['qdq']:>8}"
        )
    print(
        f"imports (ModelOpt + torch + ONNX Runtime), once per worker process: {min(r['imports'] for r in rows):.2f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
