"""Runs that share a store, and runs that die: real `trtflow run` processes, real TensorRT-RTX builds.

"Built exactly once" is counted from each process's own --json report and cross-checked against the
store's records, which name the process that built them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from conftest import TINY_RECIPE, package_files, trtflow, write_project

from trtflow.run.options import RunOptions
from trtflow.run.session import Session
from trtflow.store import Store

ONE_TARGET = TINY_RECIPE.replace("targets: [rtx-ampere, rtx-ada]", "targets: [rtx-ada]")  # 5 stages, 1 engine


def start_run(root: Path, *args: str, **popen: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trtflow", "-C", str(root), "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def verify_ok(root: Path) -> None:
    result = trtflow(root, "cache", "verify", "--json")
    assert result.code == 0, result.out + result.err
    report = json.loads(result.out)
    assert report["corrupt"] == [] and report["missing"] == [] and report["leftovers"] == []


def test_four_concurrent_runs_build_every_key_exactly_once(tmp_path: Path) -> None:
    shared = write_project(tmp_path / "shared")
    runs = [start_run(shared, "--json") for _ in range(4)]
    outputs = [run.communicate(timeout=180) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0, 0], [err for _, err in outputs]
    builders: dict[str, list[int]] = {}
    keys = set()
    for run, (out, _) in zip(runs, outputs, strict=True):
        for node in json.loads(out)["nodes"]:
            keys.add(node["key"])
            if node["status"] == "built":
                builders.setdefault(node["key"], []).append(run.pid)
    assert set(builders) == keys and all(len(pids) == 1 for pids in builders.values()), builders
    store = Store(shared / "artifacts" / "store")
    assert {key: [store.records.get(key)["built_by"]["pid"]] for key in keys} == builders
    store.close()
    reference = write_project(tmp_path / "reference")
    assert trtflow(reference, "run").code == 0
    assert package_files(shared) == package_files(reference)
    verify_ok(shared)
    assert not list((shared / "artifacts" / "store" / "tmp").iterdir())


def test_two_nodes_with_one_key_build_once_in_a_parallel_run(tmp_path: Path) -> None:
    """Two recipes with the same model and settings share every key but the package's."""
    root = write_project(tmp_path / "p", {"a": ONE_TARGET, "b": ONE_TARGET})
    result = trtflow(root, "run", "-j", "2", "--json")
    assert result.code == 0, result.err
    nodes = json.loads(result.out)["nodes"]
    built = Counter(node["key"] for node in nodes if node["status"] == "built")
    assert set(built.values()) == {1} and len(built) == len({node["key"] for node in nodes})
    shared = {node["id"]: node for node in nodes if node["id"].endswith(("a", "b")) and node["kind"] == "cleanup"}
    assert shared["cleanup:a"]["key"] == shared["cleanup:b"]["key"]


def test_threads_of_one_process_share_a_store_safely(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p", {"tiny": ONE_TARGET})
    results: list = []

    def run() -> None:
        session = Session.open(root)
        try:
            results.append(session.run(RunOptions()))
        finally:
            session.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 2
    built = Counter(state.key for result in results for state in result.nodes if state.status == "built")
    keys = {state.key for result in results for state in result.nodes}
    assert set(built) == keys and set(built.values()) == {1}
    verify_ok(root)


def test_a_waiting_run_goes_on_once_the_lock_holder_is_killed(tmp_path: Path) -> None:
    """A live holder blocks the key; SIGKILL drops its flock, so a dead holder blocks nobody."""
    root = write_project(tmp_path / "p", {"tiny": ONE_TARGET})
    session = Session.open(root)
    key = session.plan()["cleanup:tiny"].key
    session.close()
    locks = root / "artifacts" / "store" / "locks"
    locks.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from trtflow.store.locks import KeyLocks;"
            f"locks = KeyLocks(Path({str(locks)!r})); assert locks.claim({key!r}); print('held', flush=True); "
            "time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    try:
        assert holder.stdout.readline().strip() == "held"
        run = start_run(root)
        reader = threading.Thread(target=lambda: said.extend(iter(run.stderr.readline, "")), daemon=True)
        reader.start()
        waiting = "wait     cleanup:tiny  (waiting: another run is building the same stage)\n"
        deadline = time.monotonic() + 60  # however long the run takes to start on a busy machine
        while waiting not in said and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting in said and run.poll() is None, said  # waiting for the key, not building it
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
    out = run.stdout.read()
    assert run.wait(timeout=120) == 0, said
    reader.join(timeout=10)
    run.stdout.close()
    run.stderr.close()
    assert out.startswith("5 built, 0 cached")


def test_a_run_killed_mid_build_leaves_a_store_the_next_run_completes(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p")
    run = start_run(root, "-j", "2", start_new_session=True)
    try:
        for line in run.stderr:
            if line.startswith("run      build:"):
                break
        os.killpg(run.pid, signal.SIGKILL)  # the whole process group: the machine died
    finally:
        run.communicate()
    tmp = root / "artifacts" / "store" / "tmp"
    assert [p.name.startswith("run-") for p in tmp.iterdir()] == [True]  # the dead run's work dirs
    again = trtflow(root, "run", "--json")
    assert again.code == 0, again.err
    summary = json.loads(again.out)
    assert summary["failed"] == 0 and "build:tiny/fp32/rtx-ada" in {
        n["id"] for n in summary["nodes"] if n["status"] == "built"
    }
    assert not list(tmp.iterdir())  # swept: its lock was free
    verify_ok(root)


WRITER = """
import os, sys
from pathlib import Path
from trtflow.hashing import stage_key
from trtflow.store import Store
store = Store.create(Path(sys.argv[1]))
for i in range(1000):
    source = store.tmp / f"f{i}"
    source.write_bytes(os.urandom(2 << 20))
    digest = store.objects.add(source)
    components = {"kind": "build", "node": f"build:w{os.getpid()}/{i}", "inputs": {}}
    key = stage_key(components)
    record = {"key": key, "components": components, "node": components["node"], "outputs": {"engine": digest}}
    store.records.put(key, record)
    store.runs.record([key])
    print(i, flush=True)
"""


def test_kills_during_object_writes_and_index_updates_leave_no_half_object(tmp_path: Path) -> None:
    root = tmp_path / "store"
    for delay in (0.25, 0.35, 0.45, 0.55):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE)
        assert writer.stdout is not None and writer.stdout.readline()  # the first object is in: kill it in mid-stride
        time.sleep(delay - 0.2)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stdout.close()
    store = Store(root)
    from trtflow.store.housekeeping import verify

    report = verify(store)
    assert report["objects"] > 0 and report["corrupt"] == [] and report["missing"] == []
    assert all(store.records.get(key) is not None for key, _ in store.records.all())
    store.close()
    shutil.rmtree(root / "tmp")
