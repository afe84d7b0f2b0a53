"""Recipes with every field on a known line, and the check that a project is refused in one line, exit 3, with
nothing written: shared by the bad-input tests of several packages."""

from __future__ import annotations

from pathlib import Path

from conftest import trtflow

PROJECT_ERROR = 3  # trtflow/cli.py: "3 invalid project, recipe or file"


def recipe(
    onnx: str = "models/tiny_cnn.onnx",
    precisions: str = "[fp32]",
    targets: str = "[rtx-ampere, rtx-ada]",
    build: str = "optimization_level: 3",
    input: str = "input",
    min: str = "[1, 3, 32, 32]",
    opt: str = "[4, 3, 32, 32]",
    max: str = "[8, 3, 32, 32]",
    extra: str = "",
) -> str:
    """A recipe in block style so that every field sits on its own, known line (numbers on the right)."""
    return (
        "source:\n"  # 1
        f"  onnx: {onnx}\n"  # 2  source.onnx
        f"precisions: {precisions}\n"  # 3  precisions
        f"targets: {targets}\n"  # 4  targets
        "build:\n"  # 5
        f"  {build}\n"  # 6  build.*
        "profiles:\n"  # 7  profiles
        "  - inputs:\n"  # 8  profiles[0].inputs
        f"      {input}:\n"  # 9  profiles[0].inputs.<input>
        f"        min: {min}\n"  # 10
        f"        opt: {opt}\n"  # 11
        f"        max: {max}\n"  # 12
        f"{extra}"  # 13 onwards
    )


def files(root: Path) -> list[Path]:
    return sorted(root.rglob("*"))


def assert_refused(root: Path, where: str, message: str) -> None:
    """`validate` and `run` both exit 3 with exactly `error: <where>: ...<message>...` and write nothing."""
    before = files(root)
    for command in ("validate", "run"):
        result = trtflow(root, command)
        context = f"trtflow {command}: code {result.code}\nstdout: {result.out!r}\nstderr: {result.err!r}"
        assert result.code == PROJECT_ERROR, context
        assert "Traceback" not in result.err + result.out, context
        assert result.out == "", context
        lines = result.err.splitlines()
        assert len(lines) == 1, context
        assert lines[0].startswith(f"error: {where}: "), context
        assert message in lines[0], context
    assert_wrote_nothing(root, before)


def assert_wrote_nothing(root: Path, before: list[Path]) -> None:
    assert not (root / "artifacts" / "store").exists()
    assert not (root / "artifacts").exists()
    assert files(root) == before
