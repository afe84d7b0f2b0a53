"""PyTorch sources for tests: a conv net module as a user writes one, a torch recipe with its fields on known lines,
and a project that holds both."""

from __future__ import annotations

from pathlib import Path

from conftest import write_project

CONVNET = '''\
"""A small conv net with BatchNorm and Dropout: cleanup folds the BatchNorms and drops the Dropouts."""
from torch import nn


class ConvNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(16, classes))

    def forward(self, x):
        return self.head(self.features(x))


def make(classes=10):
    return ConvNet(classes)
'''


ONE_TARGET = "targets: [rtx-ada]\n"


def write_torch_project(root: Path, recipes: dict[str, str], modules: dict[str, str]) -> Path:
    write_project(root, recipes)
    for name, text in modules.items():
        (root / "models" / name).write_text(text)
    return root


def torch_recipe(
    factory: str = "models.convnet:make",
    extra: str = "",
    inputs: str = "[{name: image}]",
    profile_input: str = "image",
    shape: str = "min: [1, 3, 32, 32], opt: [4, 3, 32, 32], max: [8, 3, 32, 32]",
) -> str:
    """A torch recipe in block style, one field per known line (numbers on the right)."""
    return (
        "source:\n"  # 1
        "  torch:\n"  # 2
        f"    factory: {factory}\n"  # 3  source.torch.factory
        f"    inputs: {inputs}\n"  # 4  source.torch.inputs
        f"{extra}"  # 5  (optional) source.torch.<extra>
        "profiles:\n"
        "  - inputs:\n"
        f"      {profile_input}: {{{shape}}}\n" + ONE_TARGET
    )
