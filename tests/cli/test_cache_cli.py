"""`trtflow cache ls|verify|gc` on real stores, and a full disk during a real run."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import trtflow, write_project

from trtflow.store.locks import RunLease

STORE = Path("artifacts/store")


@pytest.fixture
def project(built_project: Path) -> Path:
    return built_project


def cli_json(root: Path, *args: str) -> dict:
    result = trtflow(root, *args, "--json")
    assert result.code == 0, result.out + result.err
    return json.loads(result.out)


def objects(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (root / STORE / "objects").glob("*/*")}


def lock_outputs(root: Path) -> set[str]:
    nodes = json.loads((root / "trtflow.lock").read_text())["nodes"]
    return {digest for entry in nodes.values() for digest in entry["outputs"].values()}


def supersede_builds(root: Path) -> None:
    """Change a profile and run again: the old builds, verifies and package become garbage."""
    recipe = root / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text().replace("max: [8, 3, 32, 32]", "max: [16, 3, 32, 32]"))
    assert trtflow(root, "run").code == 0


def test_ls_sizes_per_recipe_and_stage(project: Path) -> None:
    info = cli_json(project, "cache", "ls")
    rows = {(row["recipe"], row["stage"]): row for row in info["stages"]}
    assert rows[("tiny", "build")]["records"] == 2 and rows[("tiny", "build")]["in_lock"] == 2
    assert rows[("tiny", "build")]["bytes"] > 2 * 10_000
    assert info["objects"] == {"count": len(objects(project)), "bytes": sum(objects(project).values())}
    human = trtflow(project, "cache", "ls").out
    assert "tiny" in human and "build" in human and "KiB" in human


def test_gc_frees_superseded_builds_and_keeps_what_the_lock_uses(project: Path) -> None:
    supersede_builds(project)
    leftover = project / STORE / "objects" / "00" / ".incoming-killed"
    leftover.parent.mkdir(exist_ok=True)
    leftover.write_bytes(b"half")
    (project / STORE / "tmp" / "run-1-1").mkdir()  # a dead run's work dir: no live process holds its lock
    before = objects(project)
    superseded = {d for d in before if d not in lock_outputs(project) and not d.startswith(".")}
    assert superseded  # the old engines and package

    dry = cli_json(project, "cache", "gc")
    assert dry["dry_run"] and {Path(p).name for p in dry["objects"]} == superseded | {".incoming-killed"}
    assert dry["freed"]["objects"] == sum(before[d] for d in superseded) + 4 and objects(project) == before
    assert "would delete" in trtflow(project, "cache", "gc").out

    done = cli_json(project, "cache", "gc", "--yes")
    assert not done["dry_run"] and done["freed_bytes"] == dry["freed_bytes"]
    assert set(objects(project)) == set(before) - superseded - {".incoming-killed"}
    assert lock_outputs(project) <= set(objects(project))
    assert not list((project / STORE / "tmp").iterdir())
    again = cli_json(project, "run")
    assert again["built"] == 0 and trtflow(project, "cache", "verify").code == 0
    assert cli_json(project, "cache", "gc")["freed_bytes"] == 0


def test_gc_keep_last_keeps_the_previous_runs_builds_and_gc_waits_for_live_runs(project: Path) -> None:
    supersede_builds(project)
    assert {Path(p).name for p in cli_json(project, "cache", "gc", "--keep-last", "2")["objects"]} == set()
    assert cli_json(project, "cache", "gc", "--keep-last", "1")["objects"]
    lease = RunLease(project / STORE)  # what every `trtflow run` holds while it runs
    try:
        busy = trtflow(project, "cache", "gc", "--yes")
        assert busy.code == 6 and "run(s) are using the store" in busy.err
    finally:
        lease.close()
    assert cli_json(project, "cache", "gc", "--yes")["objects"]


def test_cache_commands_on_a_project_that_never_ran(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p")
    for command in ("ls", "verify", "gc"):
        result = trtflow(root, "cache", command)
        assert result.code == 0 and "no store" in result.out
    assert not (root / "artifacts").exists()


def limited_run(root: Path, max_file_bytes: int, *args: str) -> subprocess.CompletedProcess:
    """`trtflow run` where no file may grow past `max_file_bytes` (Python ignores SIGXFSZ: writes get EFBIG)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    return subprocess.run(
        [sys.executable, "-m", "trtflow", "-C", str(root), "run", *args],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=120,
    )


def test_a_full_disk_is_one_clear_error_and_leaves_the_store_consistent(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p")
    for limit in (100_000, 300_000):  # the index cannot grow; then an engine (~450 KB) cannot be written
        failed = limited_run(root, limit)
        errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
        assert failed.returncode == 4 and "Traceback" not in failed.stderr, failed.stderr
        assert len(errors) == 1 and errors[0].startswith("error: cannot write to the store"), failed.stderr
    as_json = limited_run(root, 300_000, "--json")
    assert as_json.returncode == 4 and json.loads(as_json.stdout) == {
        "error": as_json.stderr.strip().removeprefix("error: "),
        "exit_code": 4,
    }, (as_json.stdout, as_json.stderr)
    result = trtflow(root, "run", "--json")
    assert result.code == 0 and json.loads(result.out)["failed"] == 0
    verified = cli_json(root, "cache", "verify")
    assert verified["corrupt"] == [] and verified["missing"] == [] and verified["leftovers"] == []


def test_gc_empties_the_exchange_distributed_runs_shipped_through(built_project: Path) -> None:
    shipped = built_project / "artifacts" / "store" / "exchange" / "objects" / "ab" / ("ab" + "0" * 62)
    shipped.parent.mkdir(parents=True)
    shipped.write_bytes(b"an input a Ray task fetched")
    assert str(shipped.parents[1]) in cli_json(built_project, "cache", "gc")["tmp"]
    cli_json(built_project, "cache", "gc", "--yes")
    assert not shipped.exists() and trtflow(built_project, "run").code == 0
