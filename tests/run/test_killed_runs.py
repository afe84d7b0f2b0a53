"""What a killed run leaves behind is cleaned up: its workers die with it, the next run (and `cache gc --yes`) removes
half-placed packages and lock temp files, and a package folder is replaced without a moment of absence."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from conftest import ARCHIVE, TINY_RECIPE, package_files, trtflow, write_project

from trtflow.util.archive import replace_dir_atomically


def _leftovers(root: Path) -> list[Path]:
    packages = root / "artifacts" / "packages"
    made = [packages / ".tiny.incoming-abc123", packages / ".tiny.old-def456", root / ".trtflow.lock.k2j3h4.tmp"]
    made[0].mkdir()
    (made[0] / "package.tar.gz").write_bytes(b"half")
    made[1].mkdir()
    made[2].write_text("{")
    return made


def test_the_next_run_sweeps_what_a_killed_run_left(built_project: Path) -> None:
    made = _leftovers(built_project)
    assert trtflow(built_project, "run").code == 0
    assert [p for p in made if os.path.lexists(p)] == []


def test_cache_gc_yes_sweeps_them_too(built_project: Path) -> None:
    made = _leftovers(built_project)
    # a dry run deletes nothing
    assert trtflow(built_project, "cache", "gc").code == 0 and all(os.path.lexists(p) for p in made)
    assert trtflow(built_project, "cache", "gc", "--yes").code == 0
    assert [p for p in made if os.path.lexists(p)] == []


def test_a_package_folder_is_never_absent_while_it_is_replaced(tmp_path: Path) -> None:
    destination = tmp_path / "tiny"
    destination.mkdir()
    missing, stop = [], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if not destination.is_dir():
                missing.append(time.perf_counter())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for index in range(300):
            source = tmp_path / f".tiny.incoming-{index}"
            source.mkdir()
            (source / "manifest.json").write_text(str(index))
            replace_dir_atomically(source, destination)
    finally:
        stop.set()
        watcher.join()
    assert missing == [] and (destination / "manifest.json").read_text() == "299"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_ctrl_c_stops_a_run_with_one_line(tmp_path: Path) -> None:
    """A terminal sends Ctrl-C to every process of the run: each worker printed its own KeyboardInterrupt traceback
    (20 lines). Now the workers leave it to the run, which says one line and exits 130."""
    from conftest import TINY_RECIPE

    root = write_project(tmp_path / "p", {"tiny": TINY_RECIPE.replace("[fp32]", "[fp32, fp16, bf16]")})
    run = subprocess.Popen(
        [sys.executable, "-m", "trtflow", "-C", str(root), "run"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # as a terminal starts it: Ctrl-C not ignored. A native library an earlier test loaded into this process may
        # have set it ignored (below Python's view of its handlers), and a child inherits that: the run then rightly
        # keeps ignoring it, as a background job does
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert run.stderr is not None
    said = []
    for line in run.stderr:  # interrupt while a reduced precision is being made
        said.append(line)
        if line.startswith("run      precision:tiny/fp16"):
            break
    seen = "".join(said)
    os.killpg(run.pid, signal.SIGINT)
    said.append(run.stderr.read())
    run.stderr.close()
    err = "".join(said)
    assert seen.endswith("\n") and "precision:tiny/fp16" in seen.splitlines()[-1], err  # interrupted mid-run
    assert run.wait(timeout=60) == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.rstrip().endswith("interrupted: what finished is kept in the store; run again to go on from there")


def test_workers_die_with_a_killed_run(tmp_path: Path) -> None:
    """SIGKILL the run while its worker builds: the worker must not outlive it (it would hold `| tee` open)."""
    root = write_project(tmp_path / "p")
    run = subprocess.Popen(
        [sys.executable, "-m", "trtflow", "-C", str(root), "run", "-j", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    children: set[int] = set()
    deadline = time.monotonic() + 60
    while not children and time.monotonic() < deadline and run.poll() is None:
        children = {
            int(pid)
            for task in Path(f"/proc/{run.pid}/task").glob("*")
            for pid in (task / "children").read_text().split()
        }
        time.sleep(0.02)
    assert children, "the run started no worker"
    time.sleep(0.5)  # the workers are up and building
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    deadline = time.monotonic() + 10
    while _alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(children) == []


def _alive(pids: set[int]) -> list[int]:
    """The pids that still run (a zombie has died: it only waits to be reaped)."""
    found = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(pid)
        except OSError:
            pass
    return found


# twenty-odd kills ----------------------------------------------------------------------------------------------------

# Where a run is killed on purpose (trtflow/util/faults.py), in an order that reaches each: objects are placed only
# while something builds (the first three runs), the provenance and the lock change whenever the packages do.
CRASH_POINTS = [
    "object-placed",
    "package-extracted",
    "package-swapped",
    "write:trtflow.lock",
    "write:tiny.intoto.jsonl",
    "package-swapped",
    "write:trtflow.lock",
    "package-extracted",
    "run-history-written",  # a run that only placed cached outputs: it had taken no lease before the history write
]
RANDOM_KILLS = 15


def _session_members(session: int) -> list[int]:
    """Live (not zombie) processes of a session: what a killed run left running."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _leftover_files(root: Path) -> list[Path]:
    packages = root / "artifacts" / "packages"
    beside = list(packages.glob(".*")) if packages.is_dir() else []
    return beside + list(root.glob(".trtflow.lock.*"))


@pytest.mark.slow
def test_runs_killed_at_twenty_four_points_always_recover(tmp_path: Path) -> None:
    """Each run changes the packages (the model alternates between three weight sets) and is killed: first at named
    points (an object, the package swap, the lock and provenance writes), then at random moments. After each kill:
    no process of the run survives, the next run exits 0, `cache verify` is clean, nothing is left beside the
    packages or the lock, and the package folder, archive and manifest agree."""
    import numpy as np
    from conftest import example_models

    root = write_project(tmp_path / "p", {"tiny": TINY_RECIPE + ARCHIVE})  # the archive's placing is killed too
    variants = [example_models().tiny_cnn(np.random.default_rng(seed)).SerializeToString() for seed in range(3)]
    rng = random.Random(20261123)
    plan = [("point", point) for point in CRASH_POINTS] + [
        ("random", rng.uniform(0.3, 4.0)) for _ in range(RANDOM_KILLS)
    ]
    for index, (how, where) in enumerate(plan):
        (root / "models" / "tiny_cnn.onnx").write_bytes(variants[index % 3])
        env = {**os.environ, **({"TRTFLOW_CRASH_AT": where} if how == "point" else {})}
        run = subprocess.Popen(
            [sys.executable, "-m", "trtflow", "-C", str(root), "run", "-j", "2"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        if how == "random":
            time.sleep(where)
            run.send_signal(signal.SIGKILL)
        code = run.wait(timeout=300)
        assert how == "random" or code == -signal.SIGKILL, f"kill {index}: the run never reached {where} (exit {code})"
        deadline = time.monotonic() + 10
        while _session_members(run.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session_members(run.pid) == [], f"kill {index} ({how} {where}): processes of the run survived"
        _assert_recovers(root, f"kill {index} ({how} {where})")


def _assert_recovers(root: Path, label: str) -> None:
    """The next run exits 0 and leaves a clean store, no leftovers, and a package whose folder matches its archive."""
    result = trtflow(root, "run", "--json")
    assert result.code == 0, f"{label}: {result.err}"
    verify = trtflow(root, "cache", "verify", "--json")
    report = json.loads(verify.out)
    assert verify.code == 0 and report["corrupt"] == [] and report["missing"] == [] and report["leftovers"] == [], (
        f"{label}: {report}"
    )
    assert _leftover_files(root) == [], label
    packages = root / "artifacts" / "packages"
    manifest = json.loads((packages / "tiny" / "manifest.json").read_text())
    with tarfile.open(packages / "tiny.tar.gz") as archive:
        assert json.loads(archive.extractfile("tiny/manifest.json").read()) == manifest, label  # type: ignore[union-attr]
    for engine in manifest["engines"]:
        assert hashlib.sha256((packages / "tiny" / engine["file"]).read_bytes()).hexdigest() == engine["sha256"], label
    outputs = json.loads((root / "trtflow.lock").read_text())["nodes"]["package:tiny"]["outputs"]
    assert outputs.pop("archive") == hashlib.sha256((packages / "tiny.tar.gz").read_bytes()).hexdigest(), label
    assert outputs == package_files(root), label
