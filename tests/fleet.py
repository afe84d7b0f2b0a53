"""A project of the real-model corpus (tests/zoo.py) for a fleet of three GPU generations: shared by the slow
end-to-end test and benchmarks/realmodels.py.

Every model is an ONNX source with its profile and 4 seeded calibration batches, in fp32, fp16 and int8 (with
`fallback: auto`: EfficientNet's plain int8 misses the default limits), for rtx-turing (sm_75), rtx-ampere (sm_86) and
rtx-ada (sm_89). Pairs are excluded only where a tool truly cannot:
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from zoo import ZOO, zoo_model

TARGETS = {"rtx-turing": "sm_75", "rtx-ampere": "sm_86", "rtx-ada": "sm_89"}
PRECISIONS = ("fp32", "fp16", "int8")
# TensorRT-RTX has no fp32 GEMM on Turing (support matrix; every corpus model has a Gemm, MatMul or LSTM).
EXCLUDE = [{"precision": "fp32", "target": "rtx-turing"}]
# Measured with ModelOpt 0.47: it quantizes no node of the LSTM (it leaves LSTM ops and GEMV-shaped MatMuls alone), and
# its per-channel Q/DQ of weights computed by ops fails in ONNX Runtime (`scale must be 1D tensor with size 1024`).
MORE_EXCLUDES = {"lstm": [{"precision": "int8"}], "opweights": [{"precision": "int8"}]}
MODELS = tuple(name for name in ZOO if name != "legacy_ir3_dynamic")


def write_fleet_project(root: Path, models: tuple[str, ...] = MODELS, precisions: tuple[str, ...] = PRECISIONS) -> Path:
    """pipeline.yaml with the three targets, one recipe per model, its ONNX and its calibration batches."""
    (root / "recipes").mkdir(parents=True)
    (root / "models").mkdir()
    targets = {name: {"backend": "tensorrt-rtx", "compute_capabilities": [cc]} for name, cc in TARGETS.items()}
    (root / "pipeline.yaml").write_text(yaml.safe_dump({"targets": targets}))
    for name in models:
        model = zoo_model(name, root.parent / "zoo-cache")
        shutil.copyfile(model.path, root / "models" / f"{name}.onnx")
        model.calibration_batches(root / "calib" / name)
        excluded = [rule for rule in EXCLUDE + MORE_EXCLUDES.get(name, []) if rule["precision"] in precisions]
        recipe = {
            "source": {"onnx": f"models/{name}.onnx"},
            "precisions": list(precisions),
            "exclude": excluded,
            "profiles": [model.recipe_profile()],
            "calibration": {"data": f"calib/{name}/*"},
            **({"accuracy": {"int8": {"fallback": "auto"}}} if "int8" in precisions else {}),
        }
        (root / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root


def expected_engines(name: str, precisions: tuple[str, ...] = PRECISIONS) -> set[tuple[str, str]]:
    """(precision, target) of every engine the model's package must hold."""
    rules = EXCLUDE + MORE_EXCLUDES.get(name, [])
    return {
        (p, t)
        for p in precisions
        for t in TARGETS
        if not any(r["precision"] in (None, p) and r.get("target") in (None, t) for r in rules)
    }
