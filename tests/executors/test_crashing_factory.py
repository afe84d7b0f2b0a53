"""A torch factory that exits or crashes the process fails its export alone, in one line naming the factory and how
the process died; the run goes on with the other recipes."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import trtflow
from torchsources import CONVNET, torch_recipe, write_torch_project

CRASHING = """\
import ctypes
import os


def exits():
    os._exit(3)


def segfaults():
    ctypes.string_at(0)
"""


def test_a_factory_that_exits_or_segfaults_is_named_with_how_it_died(tmp_path: Path) -> None:
    recipes = {
        "exits": torch_recipe("models.crash:exits"),
        "segfaults": torch_recipe("models.crash:segfaults"),
        "fine": torch_recipe(),
    }
    root = write_torch_project(tmp_path / "proj", recipes, {"convnet.py": CONVNET, "crash.py": CRASHING})
    result = trtflow(root, "run", "--json")
    assert result.code == 1, result.err
    nodes = {node["id"]: node for node in json.loads(result.out)["nodes"]}
    assert nodes["export:exits"]["reason"].startswith(
        "the worker process of export:exits died in source.torch.factory models.crash:exits or the exporter: exit 3"
    )
    assert nodes["export:segfaults"]["reason"].startswith(
        "the worker process of export:segfaults died in source.torch.factory models.crash:segfaults or the exporter: "
        "killed by SIGSEGV"
    )
    assert nodes["package:fine"]["status"] == "built"
