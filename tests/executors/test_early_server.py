"""The model tools' server a cold `trtflow run` starts as the command starts (util.early_server): the run takes it
over instead of starting its own, and one the run never takes ends with the command."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import trtflow

from trtflow.util import early_server, servers


@pytest.mark.parametrize(
    ("argv", "starts"),
    [
        (["run"], True),
        (["-C", "{p}", "run", "-j", "2", "fp16"], True),
        (["-C{p}", "-v", "run"], True),
        (["--project={p}", "run", "--executor", "local"], True),
        (["--project", "{p}", "run", "--executor=local", "--json"], True),
        (["-C", "{p}", "run", "--executor", "ray"], False),
        (["-C", "{p}", "run", "--executor=ray"], False),
        (["-C", "{p}", "run", "--ray-address", "auto"], False),
        (["-C", "{p}", "run", "--dry-run"], False),
        (["-C", "{p}", "run", "--help"], False),
        (["-C", "{p}", "plan"], False),
        (["-C", "{p}", "--unknown", "run"], False),
        ([], False),
    ],
)
def test_the_guess_reads_a_cold_local_run_off_the_command_line(
    argv: list[str], starts: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    words = [word.replace("{p}", str(tmp_path)) for word in argv]
    assert early_server.cold_run_project(words) is None  # no pipeline.yaml: the command fails at once
    (tmp_path / "pipeline.yaml").write_text("targets: {}\n")
    assert (early_server.cold_run_project(words) is not None) is starts
    (tmp_path / early_server.DEFAULT_STORE).mkdir(parents=True)  # built before: not cold, the build server comes first
    assert early_server.cold_run_project(words) is None


def test_the_guess_looks_for_the_store_where_pipeline_yaml_puts_it_by_default() -> None:
    from trtflow.recipe.schema import Pipeline

    assert Pipeline.model_fields["store"].default == early_server.DEFAULT_STORE


def test_a_project_the_no_op_memo_may_answer_starts_no_server_early(tmp_path: Path) -> None:
    """A project whose store is elsewhere has no store at the default place: its no-op memo says it has run."""
    from trtflow.run.runmemo import memo_path

    (tmp_path / "pipeline.yaml").write_text("targets: {}\n")
    assert early_server.cold_run_project(["-C", str(tmp_path), "run"]) == tmp_path
    assert memo_path(tmp_path) == tmp_path / early_server.RUN_MEMO
    memo_path(tmp_path).parent.mkdir()
    memo_path(tmp_path).write_text("{}")
    assert early_server.cold_run_project(["-C", str(tmp_path), "run"]) is None


def test_a_cold_run_takes_over_the_model_tools_server_its_command_started(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[str] = []
    real = servers.spawn
    monkeypatch.setattr(servers, "spawn", lambda where, *rest: spawned.append(where) or real(where, *rest))
    early_server.start_for(["-C", str(project), "run"])
    early = early_server._started[0].process
    assert spawned == [servers.TOOLS_SERVER]
    result = trtflow(project, "run")
    assert result.code == 0, result.err
    assert spawned.count(servers.TOOLS_SERVER) == 1  # the run's cleanup ran in the server started first
    assert early.poll() is not None and not early_server._started  # taken, and ended with the run


def test_an_early_server_the_run_never_takes_ends_with_the_command(project: Path) -> None:
    early_server.start_for(["-C", str(project), "run"])
    started = early_server._started[0]
    assert started.process.poll() is None and started.slot.is_dir() and started.shared.is_dir()
    early_server._end_untaken()  # what the command's exit runs
    assert started.process.poll() is not None
    assert not started.slot.exists() and not started.shared.exists() and early_server.take() is None


def test_the_early_start_imports_nothing_heavy() -> None:
    """What the command runs before the CLI is imported: the server's start must not wait for the run's imports."""
    import subprocess
    import sys

    heavy = ("pydantic", "numpy", "onnx", "click", "trtflow.stages", "trtflow.executors", "trtflow.cli")
    probe = f"import sys, trtflow.util.early_server\nprint([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"
