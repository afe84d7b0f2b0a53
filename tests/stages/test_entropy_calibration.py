"""Entropy calibration's ranges without ONNX Runtime's Python loops: the same thresholds, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.quantization import calibrate
from onnxruntime.quantization.calibrate import HistogramCollector

from trtflow.stages.entropy_calibration import entropy_threshold


def _collected(batches: list[dict[str, np.ndarray]]) -> dict[str, tuple]:
    """Histograms as ONNX Runtime's collector builds them over calibration batches (128 bins, merged and widened as
    a later batch reaches further)."""
    collector = HistogramCollector("entropy", False, 128, 128, 99.999, "same")
    for batch in batches:
        collector.collect_value(batch)
    return collector.get_histogram_dict()


def _activations(rng: np.random.Generator, scale: float) -> dict[str, np.ndarray]:
    """What activations look like: normal, heavy-tailed, after a ReLU (half of it zeros), one large outlier, sparse,
    one constant."""
    size = 50_000
    relu = np.maximum(rng.standard_normal(size), 0)
    outlier = rng.standard_normal(size)
    outlier[rng.integers(size)] = 40.0
    sparse = np.zeros(size)
    sparse[rng.integers(size, size=20)] = rng.standard_normal(20)
    arrays = {
        "normal": rng.standard_normal(size),
        "heavy": rng.standard_t(2, size),
        "relu": relu,
        "outlier": outlier,
        "sparse": sparse,
        "constant": np.full(size, 0.5),
    }
    return {name: (array * scale).astype(np.float32) for name, array in arrays.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_try_and_threshold_is_onnx_runtimes_bit_for_bit(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each try's distributions (what both hand to ONNX Runtime's smoothing) and the range chosen."""
    rng = np.random.default_rng(seed)
    histograms = _collected([_activations(rng, scale) for scale in (1.0, 0.5, 3.0, 7.5)])  # widened twice
    assert max(h[0].size for h in histograms.values()) > 128
    smooth, tries = calibrate.smooth_distribution, []
    monkeypatch.setattr(calibrate, "smooth_distribution", lambda p: tries.append(p.copy()) or smooth(p))
    own = HistogramCollector.get_entropy_threshold
    for name, histogram in histograms.items():
        expected = own(None, histogram, 128)
        theirs = tries[:]
        tries.clear()
        got = entropy_threshold(histogram, 128)
        assert len(tries) == len(theirs) > 0, name
        for ours, reference in zip(tries, theirs, strict=True):
            assert ours.dtype == reference.dtype and np.array_equal(ours, reference), name
        tries.clear()
        assert [np.asarray(v).tobytes() for v in got] == [np.asarray(v).tobytes() for v in expected], name
        assert [np.asarray(v).dtype for v in got] == [np.asarray(v).dtype for v in expected], name
