"""What a killed run leaves behind is cleaned up: its workers die with it, the next run (and `cache gc --yes`) removes
half-placed packages and lock temp files, and a package folder is replaced without a moment of absence."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import trtflow, write_project
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
    assert trtflow(built_project, "cache", "gc").code == 0 and all(os.path.lexists(p) for p in made)  # a dry run deletes nothing
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


def test_workers_die_with_a_killed_run(tmp_path: Path) -> None:
    """SIGKILL the run while its worker builds: the worker must not outlive it (it would hold `| tee` open)."""
    root = write_project(tmp_path / "p")
    run = subprocess.Popen([sys.executable, "-m", "trtflow", "-C", str(root), "run", "-j", "2"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    children: set[int] = set()
    deadline = time.monotonic() + 60
    while not children and time.monotonic() < deadline and run.poll() is None:
        children = {int(pid) for task in Path(f"/proc/{run.pid}/task").glob("*") for pid in (task / "children").read_text().split()}
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
