"""Hostile or broken files are refused in one line with their exit code, quickly, and nothing is written:
alias bombs, deep nesting, FIFOs, NUL and non-UTF-8 bytes, symlink loops, outputs that are files, bad --dest."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import PIPELINE, TINY_RECIPE, trtflow, write_project

SOURCE = "source: {onnx: models/tiny_cnn.onnx}\n"


def _alias_bomb() -> str:
    """Ten levels of nine aliases each: 9**10 values once expanded."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(levels) + "\n" + SOURCE


RECIPES = [
    ("alias bomb", _alias_bomb().encode(), "recipes/hostile.yaml:1: more than 100000 values (aliases expand)"),
    (
        "deep flow nesting",
        ("source: " + "[" * 3000 + "]" * 3000 + "\n").encode(),
        "recipes/hostile.yaml:1: nested deeper than 64 levels",
    ),
    (
        "deep block nesting",
        "".join("  " * i + f"k{i}:\n" for i in range(100)).encode(),
        "recipes/hostile.yaml:66: nested deeper than 64 levels",
    ),
    ("NUL byte", (SOURCE + "\x00\n").encode(), "recipes/hostile.yaml:2: a NUL byte: this is not a text file"),
    (
        "not UTF-8",
        SOURCE.encode() + b'name: "x\xff"\n',
        "recipes/hostile.yaml:2: not UTF-8 (byte 0xff); save the file as UTF-8",
    ),
    (
        "too large",
        SOURCE.encode() + b"#" * (1 << 20),
        "recipes/hostile.yaml: 1048613 bytes; a YAML file of trtflow's is at most 1048576 bytes",
    ),
]


@pytest.mark.parametrize("data, message", [case[1:] for case in RECIPES], ids=[case[0] for case in RECIPES])
def test_a_hostile_recipe_is_one_line_exit_3_and_quick(tmp_path: Path, data: bytes, message: str) -> None:
    root = write_project(tmp_path / "p")
    (root / "recipes" / "hostile.yaml").write_bytes(data)
    started = time.perf_counter()
    result = trtflow(root, "run")
    assert (result.code, result.err) == (3, f"error: {message}\n")
    assert time.perf_counter() - started < 10 and not (root / "artifacts").exists()


def test_a_fifo_as_a_recipe_does_not_hang(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p")
    os.mkfifo(root / "recipes" / "fifo.yaml")
    result = trtflow(root, "validate")
    assert (result.code, result.err) == (
        3,
        "error: recipes/fifo.yaml: not a regular file (a YAML file is expected here)\n",
    )


def test_a_model_that_is_a_symlink_loop_is_named(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p", {"tiny": TINY_RECIPE.replace("models/tiny_cnn.onnx", "models/loop.onnx")})
    os.symlink("loop.onnx", root / "models" / "loop.onnx")
    result = trtflow(root, "validate")
    assert result.code == 3 and result.err.startswith(
        "error: recipes/tiny.yaml:2: source.onnx: cannot follow models/loop.onnx: "
    )


@pytest.mark.parametrize("field", ["store", "packages"])
def test_an_output_folder_that_is_a_file_is_refused(tmp_path: Path, field: str) -> None:
    pipeline = (
        "\n".join(f"{field}: out-file" if line.startswith(f"{field}:") else line for line in PIPELINE.splitlines())
        + "\n"
    )
    root = write_project(tmp_path / "p", pipeline=pipeline)
    (root / "out-file").write_text("")
    result = trtflow(root, "run")
    assert (
        result.code == 3
        and result.err.startswith("error: pipeline.yaml:")
        and result.err.endswith(f"{field}: out-file is a file, not a folder\n")
    )


def test_a_lock_that_is_a_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p")
    (root / "trtflow.lock").mkdir()
    result = trtflow(root, "run")
    assert (result.code, result.err) == (
        3,
        "error: trtflow.lock: not a regular file (remove it: `trtflow run` writes it)\n",
    )
    assert not (root / "artifacts").exists()


@pytest.mark.parametrize("dest", ["pipeline.yaml/sub", "/proc/trtflow-cannot-be-here"])
def test_a_provision_destination_that_cannot_be_a_folder_is_one_line(built_project: Path, dest: str) -> None:
    target = dest if dest.startswith("/") else str(built_project / dest)
    result = trtflow(
        built_project,
        "provision",
        str(built_project / "artifacts" / "packages" / "tiny"),
        "--gpu",
        "sm_89",
        "--dest",
        target,
    )
    assert (
        result.code == 3
        and result.err.startswith(f"error: --dest {target}: cannot make the folder: ")
        and result.err.count("\n") == 1
    )


@pytest.mark.parametrize(
    "options, url",
    [
        ("{account_key: abc}", "s3://bucket/prefix"),
        ("{connection_string: abc}", "s3://bucket/prefix"),
        ("{SSECustomerKey: abc}", "s3://bucket/prefix"),
        ("{}", "s3://user:secret@host/bucket"),
    ],
)
def test_credentials_never_enter_pipeline_yaml(tmp_path: Path, options: str, url: str) -> None:
    root = write_project(tmp_path / "p", pipeline=PIPELINE + f"cache:\n  remote: {url}\n  options: {options}\n")
    result = trtflow(root, "validate")
    assert result.code == 3 and "credential" in result.err and "secret" not in result.err


def test_a_remote_url_is_shown_without_user_info_or_query() -> None:
    from trtflow.store.remote import redacted

    assert redacted("az://acct:key@container/prefix?sv=2024&sig=SECRET") == "az://container/prefix"


def test_yaml_merge_keys_work_and_x_keys_hold_anchors(tmp_path: Path) -> None:
    shared = "x-common: &common\n  precisions: [fp32]\n  targets: [rtx-ada]\n"
    root = write_project(
        tmp_path / "p",
        {"tiny": shared + TINY_RECIPE.replace("precisions: [fp32]\ntargets: [rtx-ampere, rtx-ada]\n", "<<: *common\n")},
    )
    assert trtflow(root, "validate").out == "ok: 1 recipe(s), 2 target(s), 5 stage(s)\n"
    (root / "recipes" / "tiny.yaml").write_text(SOURCE + "<<: [1, 2]\n")
    assert (
        trtflow(root, "validate").err
        == "error: recipes/tiny.yaml:2: `<<` merges a mapping (or a list of them) into this one\n"
    )


def test_a_recursive_glob_through_a_symlink_never_reads_pipeline_yaml_as_a_recipe(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p", pipeline=PIPELINE.replace("  - recipes/*.yaml", '  - "**/*.yaml"'))
    (root / "recipes" / "up").symlink_to("..")
    assert trtflow(root, "validate").out == "ok: 1 recipe(s), 2 target(s), 7 stage(s)\n"
