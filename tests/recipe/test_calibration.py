"""Calibration data: selection decided from paths alone, real .npy/.npz/image files read and checked, exact digests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trtflow import calibration
from trtflow.calibration import Sample, check_sample, rank, samples_digest, split
from trtflow.errors import StageError

MODEL_INPUTS = {"input": {"dtype": "float32", "dims": [None, 3, 8, 8]}}
PROFILES = [{"input": {"min": [1, 3, 8, 8], "opt": [2, 3, 8, 8], "max": [4, 3, 8, 8]}}]
IMAGES = {
    "kind": "images",
    "seed": 0,
    "input": None,
    "resize": None,
    "crop": None,
    "mean": None,
    "std": None,
    "layout": "NCHW",
    "dtype": "float32",
    "color": "RGB",
    "batch": 1,
}


def test_rank_is_a_fixed_function_of_seed_and_path() -> None:
    """Selection must be the same on every machine and Python version: a golden value."""
    assert rank(0, "calib/a.npz") == "4fdb44d51e8fc8ce103f8f8f6960ce6cbf85a7f05bf9e495457bb4daf8ea80a9"
    assert rank(1, "calib/a.npz") != rank(0, "calib/a.npz")


def test_split_holds_out_first_and_caps_calibration() -> None:
    files = [f"c/{i:02d}.npz" for i in range(10)]
    chosen = split(files, seed=0, held_out=3, samples=4)
    assert len(chosen.held_out) == 3 and len(chosen.calibration) == 4
    assert not set(chosen.held_out) & set(chosen.calibration)
    assert split(list(reversed(files)), seed=0, held_out=3, samples=4) == chosen  # the listing order does not matter
    assert split(files, seed=1, held_out=3, samples=4) != chosen


def test_adding_a_file_ranked_after_the_held_out_ones_leaves_them_alone() -> None:
    files = [f"c/{i:02d}.npz" for i in range(10)]
    before = split(files, seed=0, held_out=3, samples=None)
    late = next(f"c/new{i}.npz" for i in range(100) if rank(0, f"c/new{i}.npz") > rank(0, before.held_out[-1]))
    after = split(files + [late], seed=0, held_out=3, samples=None)
    assert after.held_out == before.held_out and set(after.calibration) == set(before.calibration) | {late}


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_npz_batches_are_read_per_input_name_and_npy_feeds_the_only_input(tmp_path: Path) -> None:
    batch = np.ones((2, 3, 8, 8), np.float32)
    two_inputs = {"image": MODEL_INPUTS["input"], "mask": {"dtype": "float32", "dims": [None, 4]}}
    files = {"a.npz": _npz(tmp_path / "a.npz", image=batch, mask=np.zeros((2, 4), np.float32))}
    (sample,) = calibration.samples_from_inputs(files, {"kind": "arrays", "seed": 0}, two_inputs)
    assert sorted(sample.feed) == ["image", "mask"] and sample.feed["mask"].shape == (2, 4)
    np.save(tmp_path / "b.npy", batch)
    (single,) = calibration.samples_from_inputs(
        {"b.npy": tmp_path / "b.npy"}, {"kind": "arrays", "seed": 0}, MODEL_INPUTS
    )
    assert list(single.feed) == ["input"] and single.feed["input"].shape == (2, 3, 8, 8)
    with pytest.raises(StageError, match="b.npy: a .npy file holds one array but the model has inputs image, mask"):
        calibration.samples_from_inputs({"b.npy": tmp_path / "b.npy"}, {"kind": "arrays", "seed": 0}, two_inputs)


def test_pickled_arrays_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "evil.npy", np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(StageError, match="evil.npy: cannot read it"):
        calibration.samples_from_inputs(
            {"evil.npy": tmp_path / "evil.npy"}, {"kind": "arrays", "seed": 0}, MODEL_INPUTS
        )


@pytest.mark.parametrize(
    "feed, problem",
    [
        ({"image": np.zeros((1, 3, 8, 8), np.float32)}, "f.npz has no array for input 'input' (it holds: image)"),
        (
            {"input": np.zeros((1, 3, 8, 8), np.float32), "extra": np.zeros(1)},
            "f.npz holds 'extra', which is not a model input (inputs: input)",
        ),
        ({"input": np.zeros((1, 3, 8, 8), np.float64)}, "f.npz: input 'input' is float64, the model takes float32"),
        (
            {"input": np.zeros((16, 3, 8, 8), np.float32)},
            "f.npz: shapes input [16, 3, 8, 8] fit no profile (profile 0: input min [1, 3, 8, 8] max [4, 3, 8, 8])",
        ),
        ({"input": np.zeros((2, 3, 8, 8), np.float32)}, None),
    ],
    ids=["missing-input", "extra-array", "dtype", "outside-profile", "fits"],
)
def test_samples_are_checked_against_the_model_and_profiles(feed: dict, problem: str) -> None:
    assert check_sample(Sample("f.npz", feed), MODEL_INPUTS, PROFILES) == problem


def test_without_profiles_a_sample_must_match_the_static_shape() -> None:
    static = {"x": {"dtype": "float32", "dims": [1, 4]}}
    assert check_sample(Sample("f", {"x": np.zeros((1, 4), np.float32)}), static, []) is None
    assert "fit no profile (the model's x is [1, 4])" in check_sample(
        Sample("f", {"x": np.zeros((2, 4), np.float32)}), static, []
    )


def _image(path: Path, width: int, height: int, value: int = 128) -> Path:
    pixels = np.full((height, width, 3), value, np.uint8)
    pixels[0, 0] = [255, 0, 0]
    Image.fromarray(pixels).save(path)
    return path


def test_images_are_resized_cropped_normalized_and_laid_out(tmp_path: Path) -> None:
    path = _image(tmp_path / "a.png", 40, 20, value=51)  # 51/255 = 0.2
    spec = {**IMAGES, "resize": 10, "crop": [8, 8], "mean": [0.1, 0.1, 0.1], "std": [0.5, 0.5, 0.5]}
    array = calibration.preprocess_image(path, spec)
    assert array.shape == (3, 8, 8) and array.dtype == np.float32  # 40x20 -> shorter side 10 -> 20x10 -> center 8x8
    assert np.allclose(array[:, 4, 4], (0.2 - 0.1) / 0.5, atol=1e-6)
    nhwc = calibration.preprocess_image(path, {**IMAGES, "layout": "NHWC", "dtype": "uint8"})
    assert nhwc.shape == (20, 40, 3) and nhwc.dtype == np.uint8 and list(nhwc[0, 0]) == [255, 0, 0]
    assert list(
        calibration.preprocess_image(path, {**IMAGES, "layout": "NHWC", "dtype": "uint8", "color": "BGR"})[0, 0]
    ) == [0, 0, 255]
    assert calibration.preprocess_image(path, {**IMAGES, "color": "L", "resize": [4, 6]}).shape == (1, 4, 6)


def test_images_batch_in_rank_order_and_a_partial_batch_is_left_out(tmp_path: Path) -> None:
    files = {f"img/{i}.png": _image(tmp_path / f"{i}.png", 8, 8, value=i * 20) for i in range(5)}
    samples = calibration.samples_from_inputs(files, {**IMAGES, "batch": 2}, MODEL_INPUTS)
    assert len(samples) == 2 and samples[0].feed["input"].shape == (2, 3, 8, 8)
    ordered = sorted(files, key=lambda r: rank(0, r))
    assert samples[0].origin == f"{ordered[0]} (+1)"


def test_an_unreadable_image_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.png").write_bytes(b"not a png")
    with pytest.raises(StageError, match="img/broken.png: cannot read the image"):
        calibration.samples_from_inputs({"img/broken.png": tmp_path / "broken.png"}, IMAGES, MODEL_INPUTS)


def test_the_digest_covers_values_dtypes_shapes_and_order() -> None:
    a, b = np.zeros((1, 4), np.float32), np.ones((1, 4), np.float32)
    digest = samples_digest([Sample("a", {"x": a}), Sample("b", {"x": b})])
    assert digest == samples_digest([Sample("renamed", {"x": a.copy()}), Sample("b", {"x": b})])  # content, not names
    assert digest != samples_digest([Sample("b", {"x": b}), Sample("a", {"x": a})])
    assert digest != samples_digest([Sample("a", {"x": a.astype(np.float16)}), Sample("b", {"x": b})])
    assert digest != samples_digest([Sample("a", {"x": a.reshape(4, 1)}), Sample("b", {"x": b})])
