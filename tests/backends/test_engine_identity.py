"""The canonical engine digest: equal for builds of identical inputs that differ in generated numbering, different
for any real change (a weight, a profile, a compute capability, a precision)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from zoo import zoo_model

from trtflow.backends.engine_identity import canonical_digest

BUILD = """
import json, sys
from pathlib import Path
from trtflow.backends.base import BuildRequest, get_backend
onnx_path, engine, cc, profile = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
get_backend("tensorrt-rtx").engine_from_onnx(BuildRequest(onnx_path=Path(onnx_path), engine_path=Path(engine),
    compute_capabilities=[cc], profiles=[{name: tuple(shapes) for name, shapes in profile.items()}]))
"""


@pytest.fixture(scope="module")
def model(zoo_dir: Path):
    return zoo_model("efficientnet", zoo_dir)


def _profile(model, max_batch: int = 8) -> dict:
    ((name, shapes),) = model.profile.items()
    return {name: [list(shapes.min), list(shapes.opt), [max_batch, *shapes.max[1:]]]}


def _build(onnx_path: Path, engine: Path, cc: str = "sm_89", profile: dict | None = None) -> Path:
    """One build in a fresh ordinary process (address-space randomization on): how numbering comes to vary."""
    subprocess.run(
        [sys.executable, "-c", BUILD, str(onnx_path), str(engine), cc, json.dumps(profile)],
        check=True,
        capture_output=True,
    )
    return engine


def _variant(model, tmp_path: Path, change) -> Path:
    proto = onnx.load(str(model.path))
    change(proto)
    path = tmp_path / f"variant-{len(list(tmp_path.glob('variant-*')))}.onnx"
    onnx.save(proto, path)
    return path


def _one_ulp(proto: onnx.ModelProto) -> None:
    weight = max(proto.graph.initializer, key=lambda t: len(t.raw_data))
    values = numpy_helper.to_array(weight).copy()
    values.flat[0] = np.nextafter(values.flat[0], np.float32(np.inf))
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))


def test_builds_of_identical_inputs_share_one_canonical_digest(model, tmp_path: Path) -> None:
    engines = [_build(model.path, tmp_path / f"e{i}.engine", profile=_profile(model)) for i in range(4)]
    raw = {hashlib.sha256(e.read_bytes()).hexdigest() for e in engines}
    assert len({canonical_digest(e) for e in engines}) == 1
    if len(raw) == 1:
        pytest.skip(
            "the builder gave identical bytes 4 times in a row: nothing varied to abstract (the digest above still "
            "held)"
        )


def test_every_real_change_changes_the_canonical_digest(model, tmp_path: Path) -> None:
    base = canonical_digest(_build(model.path, tmp_path / "base.engine", profile=_profile(model)))
    fp16 = tmp_path / "fp16.onnx"
    from modelopt.onnx.autocast import convert_to_mixed_precision

    onnx.save(
        convert_to_mixed_precision(onnx_path=str(model.path), low_precision_type="fp16", keep_io_types=True), fp16
    )
    variants = {
        "one weight one ulp up": _build(
            _variant(model, tmp_path, _one_ulp), tmp_path / "ulp.engine", profile=_profile(model)
        ),
        "profile max batch 16": _build(model.path, tmp_path / "max16.engine", profile=_profile(model, 16)),
        "sm_86 instead of sm_89": _build(model.path, tmp_path / "sm86.engine", cc="sm_86", profile=_profile(model)),
        "fp16": _build(fp16, tmp_path / "fp16.engine", profile=_profile(model)),
    }
    assert base is not None
    assert {name: canonical_digest(engine) != base for name, engine in variants.items()} == dict.fromkeys(
        variants, True
    )


def test_an_unknown_layout_has_no_canonical_digest(tmp_path: Path) -> None:
    (tmp_path / "x.engine").write_bytes(b"not an engine at all" * 10)
    (tmp_path / "empty.engine").write_bytes(b"")
    assert canonical_digest(tmp_path / "x.engine") is None and canonical_digest(tmp_path / "empty.engine") is None
