"""A synthetic image classification task for the torchvision-size CNNs of benchmarks/torchvision_like.py, so that
their logits have a trained classifier's margins.

With random weights the 1000 logits of a CNN are alike: the top two lie a small fraction of their spread apart, so
the least error flips a row's top-1 (fp8 of ResNet-18 kept cosine 0.994 and agreed on 62.5% of rows). A trained
network's top logit stands apart. No trained weights can be downloaded here, so the classifier (the layers after the
pooling: torchvision's `fc` or `classifier`) is trained instead:
each of 100 classes is a smooth random pattern, a sample is its pattern plus Gaussian noise, and the head learns the
classes from the random backbone's features of 600 samples (cross-entropy). The noise is set per model (NOISE) so that
it classifies 80-90% of fresh samples right, about what torchvision's ImageNet models score; calibration and held-out
samples come from the same task. Everything is seeded.

`trained_whole` trains every layer instead (the backbone's activations then are a trained network's, not a random
one's): at the same noise the three CNNs get 91-100% right, and their int8 and fp8 pass without a fallback search
(docs/precision.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

CLASSES, TRAINING_SAMPLES, STEPS = 100, 600, 300
# Steps of end-to-end training (trained_whole): EfficientNet-B0 then classifies 94% of fresh samples right (2.5 s a
# step on 2 cores)
WHOLE_STEPS, SEED = 150, 0
# The noise at which each model's trained classifier gets 80-90% of fresh samples right (84%, 81% and 89% measured),
# about what torchvision's ImageNet models score: a harder task for a backbone whose features separate less.
NOISE = {"resnet18": 0.7, "mobilenet_v3_small": 0.25, "efficientnet_b0": 0.4}


class ImageTask:
    """The classes' patterns (3 x 14 x 14 Gaussian noise, bilinearly upsampled) and a seeded stream of samples."""

    def __init__(self, noise: float, size: int = 224, seed: int = 0) -> None:
        self._generator = torch.Generator().manual_seed(seed)
        coarse = torch.randn(CLASSES, 3, 14, 14, generator=self._generator)
        self._patterns = nn.functional.interpolate(coarse, size=size, mode="bilinear")
        self.noise = noise

    def samples(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` images [count, 3, size, size] and their labels, the next in the stream."""
        labels = torch.randint(0, CLASSES, (count,), generator=self._generator)
        images = self._patterns[labels] + self.noise * torch.randn(
            count, *self._patterns.shape[1:], generator=self._generator
        )
        return images, labels

    def batches(self, count: int, batch: int) -> list[np.ndarray]:
        """`count` float32 batches of `batch` images: calibration or held-out files."""
        return [self.samples(batch)[0].numpy().astype(np.float32) for _ in range(count)]


def trained_head(model: nn.Sequential, task: ImageTask) -> nn.Sequential:
    """`model` with its classifier (what follows its nn.Flatten: torchvision's `fc` or `classifier`) trained on the
    task, its backbone's weights unchanged; eval mode."""
    children = list(model.children())
    flat = next(index for index, child in enumerate(children) if isinstance(child, nn.Flatten)) + 1
    body, head = nn.Sequential(*children[:flat]).eval(), nn.Sequential(*children[flat:])
    images, labels = task.samples(TRAINING_SAMPLES)
    with torch.no_grad():
        features = torch.cat([body(chunk) for chunk in images.split(50)])
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(STEPS):
        loss = nn.functional.cross_entropy(head(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def trained_whole(model: nn.Module, task: ImageTask, steps: int = WHOLE_STEPS, cache: Path | None = None) -> nn.Module:
    """`model` with every layer trained on the task (Adam, batches of 16 fresh samples, seeded), then its BatchNorm
    statistics settled on the task's images (a cumulative average over 8 batches of 32); eval mode. A backbone that
    learned the task, not only its classifier: activations shaped by training, as a shipped network's are. With
    `cache`, the weights are read from that file if it exists (the task's stream drawn as training draws it, so what
    follows sees the same samples) and written to it otherwise."""
    if cache is not None and cache.is_file():
        model.load_state_dict(torch.load(cache, weights_only=True))
        for _ in range(steps):
            task.samples(16)
        for _ in range(8):
            task.samples(32)
        return model.eval()
    torch.manual_seed(SEED)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(steps):
        images, labels = task.samples(16)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for norm in (module for module in model.modules() if isinstance(module, nn.BatchNorm2d)):
        norm.reset_running_stats()
        norm.momentum = None
    with torch.no_grad():
        for _ in range(8):
            model(task.samples(32)[0])
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(".partial")
        torch.save(model.state_dict(), partial)
        partial.replace(cache)  # whole, or not there
    return model.eval()


def accuracy(model: nn.Module, task: ImageTask, count: int = 64) -> tuple[float, float]:
    """Top-1 accuracy on `count` fresh samples, and the median margin between each row's two largest logits."""
    images, labels = task.samples(count)
    with torch.no_grad():
        logits = model(images)
    top = logits.topk(2, dim=1).values
    return float((logits.argmax(1) == labels).float().mean()), float((top[:, 0] - top[:, 1]).median())
