"""A labelled dataset for task accuracy: a tiny CNN trained for a few seconds on a separable synthetic task.

Four classes of 1x16x16 images, each drawn with a random position, thickness, contrast and Gaussian noise:
    0 horizontal bars   1 vertical bars   2 diagonal stripes   3 a blob (a filled disc)
The CNN (two 3x3 convolutions, global average pooling, a linear layer) learns them in ~300 Adam steps on one
thread, so its top-1 on fresh rows is meaningful (well above the 25% of chance, below 100% because of the noise),
and a precision that hurts it shows. Seeds are fixed: the same files on every machine running the same torch.

`make(folder)` writes models/labelled_cnn.onnx (dynamic batch 1..256), val/rows.npz (256 rows), val/labels.npy
(int64), and calib/NN.npz (16 batches of 16 rows of the same task, other seeds: structured calibration data).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from zoo import Shapes, _export

SIZE, CLASSES, NOISE = 16, 4, 1.5  # noise 1.5: fp32 top-1 near 0.92, so a drop can show
VALIDATION_ROWS, CALIBRATION_BATCHES, CALIBRATION_ROWS = 256, 16, 16
PROFILE = {"input": Shapes.batched(1, SIZE, SIZE, low=1, opt=16, high=VALIDATION_ROWS)}


def images(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(float32 [rows, 1, 16, 16], int64 [rows]): balanced classes in random order."""
    labels = rng.permutation(np.arange(rows) % CLASSES).astype(np.int64)
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    out = np.empty((rows, 1, SIZE, SIZE), np.float32)
    for row, label in enumerate(labels):
        period, phase, contrast = rng.uniform(4, 7), rng.uniform(0, 2 * np.pi), rng.uniform(0.8, 1.6)
        if label == 0:
            picture = np.sin(2 * np.pi * y / period + phase) > 0.3
        elif label == 1:
            picture = np.sin(2 * np.pi * x / period + phase) > 0.3
        elif label == 2:
            picture = np.sin(2 * np.pi * (x + y) / (period * 1.4) + phase) > 0.3
        else:
            cy, cx, radius = rng.uniform(4, 12), rng.uniform(4, 12), rng.uniform(2.5, 5)
            picture = (y - cy) ** 2 + (x - cx) ** 2 < radius**2
        out[row, 0] = contrast * picture + rng.normal(0, NOISE, (SIZE, SIZE))
    return out, labels


def network() -> nn.Module:
    """Conv-ReLU-pool, Conv-ReLU, global average pool, Linear: 4 logits."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, CLASSES),
    )


def train(steps: int = 300, batch: int = 64) -> nn.Module:
    """Adam on fresh rows every step (no epoch: no overfitting to judge); one thread, fixed seeds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model, rng = network(), np.random.default_rng(0)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(steps):
            x, y = images(rng, batch)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
            loss.backward()
            optimizer.step()
        return model.eval()
    finally:
        torch.set_num_threads(threads)


def make(folder: Path) -> dict[str, float]:
    """Write the model, the labelled validation rows and the calibration batches under `folder`; returns timings."""
    start = time.perf_counter()
    model = train()
    trained = time.perf_counter()
    (folder / "models").mkdir(parents=True, exist_ok=True)
    _export(model, PROFILE, folder / "models" / "labelled_cnn.onnx")
    (folder / "val").mkdir(exist_ok=True)
    rows, labels = images(np.random.default_rng(1), VALIDATION_ROWS)
    np.savez(folder / "val" / "rows.npz", input=rows)
    np.save(folder / "val" / "labels.npy", labels)
    (folder / "calib").mkdir(exist_ok=True)
    rng = np.random.default_rng(2)
    for index in range(CALIBRATION_BATCHES):
        np.savez(folder / "calib" / f"{index:02d}.npz", input=images(rng, CALIBRATION_ROWS)[0])
    return {"train_seconds": trained - start, "total_seconds": time.perf_counter() - start}
