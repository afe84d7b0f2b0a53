"""Issue 23: a writer of the store (CI restores it from other branches' caches) races a live run, replaces every store
folder by a link to a decoy, and leaves what killed runs and provisions left. Nothing outside changes, no code runs.

The static rule comes first: nothing trtflow unpickles may have passed through a path another process can write.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from conftest import trtflow, write_project
from decoys import DECOY_BYTES, make_decoy, tree
from torchsources import CONVNET, torch_recipe, write_torch_project

PACKAGE = Path(__file__).resolve().parents[2] / "trtflow"

# The factory is project code (trusted), used here only as a clock: while the export runs, it starts a process that
# plays the store's writer and keeps planting a crafted pickle and a crafted JSON result in the export's work folder.
ATTACKER = '''\
import os
import pickle
import subprocess
import sys
from pathlib import Path

from models.convnet import make as convnet


class Payload:
    def __reduce__(self):
        return (Path.touch, (Path({marker!r}),))


PLANT = """
import os, sys, time
evil, forged, folder = bytes.fromhex(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]
end = time.time() + 4
while time.time() < end:
    for name, data in ((".hermetic-result.pickle", evil), (".hermetic-result.json", forged)):
        try:
            with open(os.path.join(folder, name + ".x"), "wb") as sink:
                sink.write(data)
            os.replace(os.path.join(folder, name + ".x"), os.path.join(folder, name))
        except OSError:
            pass
    time.sleep(0.001)
"""


def make():
    forged = {forged!r}
    quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.Popen([sys.executable, "-c", PLANT, pickle.dumps(Payload()).hex(), forged, os.getcwd()],
                     start_new_session=True, **quiet)
    return convnet()
'''


def test_nothing_unpickles_what_another_process_can_write() -> None:
    """Grep-level rule: no marshal or cloudpickle at all; the one pickle load is the worker reading the task its parent
    wrote into a private folder (read_private checks it is a real 0700 folder of this user's, O_NOFOLLOW)."""
    loads = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        assert not re.search(r"\b(marshal|cloudpickle|dill|shelve)\b", text), path
        assert "allow_pickle=True" not in text, path
        loads += [
            (path.name, line.strip())
            for line in text.splitlines()
            if re.search(r"pickle\.(load|loads|Unpickler)\b", line)
        ]
    assert loads == [("worker.py", "task = pickle.loads(read_private(task_file.absolute(), 1 << 30))")]
    hermetic = (PACKAGE / "executors" / "hermetic.py").read_text()
    assert "pickle.load" not in hermetic and "read_private(channel / RESULT_FILE" in hermetic


@pytest.mark.slow  # a torch export (about 5 s) and the planter's 4 s
def test_a_crafted_result_planted_during_an_export_is_never_unpickled(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    marker, outside = tmp_path / "pwned", make_decoy(tmp_path / "decoy")
    # names an outside file as the export's output
    forged = json.dumps(
        {
            "files": {"onnx": str(outside / "engine.bin")},
            "record": {},
            "error": None,
            "exit_code": 0,
            "errno": None,
            "detail": "",
            "node": None,
        }
    )
    attacker = ATTACKER.format(marker=str(marker), forged=forged)
    root = write_torch_project(
        tmp_path / "proj",
        {"net": torch_recipe("models.attacker:make")},
        {"convnet.py": CONVNET, "attacker.py": attacker, "__init__.py": ""},
    )
    result = trtflow(root, "run", "--json")
    time.sleep(4.2)  # the planter's whole life: it must not have been read at any point
    assert result.code == 0, result.err
    assert not marker.exists(), "the trtflow process unpickled a file from the store"
    assert tree(outside) == tree(make_decoy(tmp_path / "fresh-decoy")), "an outside file was moved into the store"
    nodes = {node["id"]: node for node in json.loads(result.out)["nodes"]}
    assert nodes["package:net"]["status"] == "built"


STORE_FOLDERS = ["objects", "records", "runs", "tmp", "locks", "corrupt", "exchange"]


@pytest.fixture(scope="module")
def built_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_project(tmp_path_factory.mktemp("links") / "proj")
    assert trtflow(root, "run").code == 0
    return root


@pytest.mark.parametrize("sub", STORE_FOLDERS)
def test_a_whole_build_with_a_store_folder_linked_outside(sub: str, built_once: Path, tmp_path: Path) -> None:
    """Each store folder in turn replaced by a link to a decoy: a forced build, `cache verify` and `cache gc --yes`
    leave the decoy as it was, and the link is set aside with a warning, never followed."""
    root = Path(shutil.copytree(built_once, tmp_path / "proj", symlinks=True))
    decoy = make_decoy(tmp_path / "decoy")
    (decoy / "run-1-1").mkdir()  # what a dead run's work folder would look like, in case tmp/ is followed
    (decoy / "ab").mkdir()
    store = root / "artifacts" / "store"
    if (store / sub).exists():
        shutil.rmtree(store / sub)
    (store / sub).symlink_to(decoy, target_is_directory=True)
    before = tree(decoy)
    results = [trtflow(root, "run", "--force"), trtflow(root, "cache", "verify"), trtflow(root, "cache", "gc", "--yes")]
    for result in results:
        assert "Traceback" not in result.out + result.err, result.err
    assert [r.code for r in results] == [0, 0, 0], [r.err for r in results]
    assert "never followed it" in "".join(r.err for r in results)
    assert tree(decoy) == before
    assert sorted(p.name for p in decoy.iterdir()) == sorted(
        {"ab", "run-1-1", *(name.split("/")[0] for name in before)}
    )
    assert not (store / sub).is_symlink()


def test_a_remembered_no_op_sweeps_a_dead_runs_folder_and_writes_nothing_else(built_once: Path, tmp_path: Path) -> None:
    from conftest import settle

    root = Path(shutil.copytree(built_once, tmp_path / "proj", symlinks=True))
    settle()
    assert trtflow(root, "run").code == 0  # remembered from here on
    tmp = root / "artifacts" / "store" / "tmp"
    assert trtflow(root, "run").code == 0 and sorted(os.listdir(tmp)) == []
    dead = tmp / "run-1-1"  # a killed run's work folder: its lock is free
    (dead / "export-x").mkdir(parents=True)
    (dead / "export-x" / "partial.onnx").write_bytes(b"half")
    started = time.perf_counter()
    result = trtflow(root, "run")
    assert result.code == 0 and not dead.exists(), result.err
    assert time.perf_counter() - started < 2


def test_provision_removes_what_a_killed_provision_left(built_once: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    package = built_once / "artifacts" / "packages" / "tiny"
    assert trtflow(built_once, "provision", str(package), "--gpu", "sm_89", "--dest", str(dest)).code == 0
    incoming = dest / "tiny" / ".incoming-0123456789abcdef"  # a provision killed mid-transfer
    incoming.mkdir()
    (incoming / "tiny.engine").write_bytes(DECOY_BYTES[:10])
    result = trtflow(built_once, "provision", str(package), "--gpu", "sm_86", "--dest", str(dest))
    assert result.code == 0, result.err
    assert not incoming.exists() and not list((dest / "tiny").glob(".incoming-*"))


def test_a_writer_planting_files_in_every_run_folder_never_fails_the_run(built_once: Path, tmp_path: Path) -> None:
    """A store writer keeps planting files in every folder under tmp/run-* while a run works: the run still exits 0
    (before: exit 70, `Directory not empty`, when it removed its own folder), and a later run sweeps what was left."""
    import threading

    root = Path(shutil.copytree(built_once, tmp_path / "proj", symlinks=True))
    store_tmp = root / "artifacts" / "store" / "tmp"
    done = threading.Event()

    def plant() -> None:
        count = 0
        while not done.is_set():
            try:
                folders = [p for p in store_tmp.rglob("*") if p.is_dir() and not p.is_symlink()]
            except OSError:  # a folder went while it was listed
                continue
            for folder in folders:
                try:
                    (folder / f"planted-{count}").write_bytes(b"x")
                    count += 1
                except OSError:
                    pass

    planter = threading.Thread(target=plant)
    planter.start()
    try:
        results = [trtflow(root, "run", "--force", "--no-report") for _ in range(3)]
    finally:
        done.set()
        planter.join()
    assert [r.code for r in results] == [0, 0, 0], [r.err[-800:] for r in results]
    assert trtflow(root, "run").code == 0
    assert trtflow(root, "cache", "gc", "--yes").code == 0 and not list(store_tmp.glob("run-*"))
