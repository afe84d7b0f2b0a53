"""The executor boundary: what a worker returns keeps the exit code of the error that failed the stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtflow.errors import EnvironmentProblem, StageError
from trtflow.executors import StageTask, run_task
from trtflow.executors.local import LocalExecutor
from trtflow.stages import build
from trtflow.stages.base import Upstream


def _build_task(tmp_path: Path, backend: str) -> StageTask:
    params = build.Params(
        precision="fp32",
        profiles=[],
        backend=backend,
        backend_version=None,
        compute_capabilities=["sm_86"],
        hardware_compatibility="none",
        version_compatible=False,
    )
    return StageTask(
        "build:m/fp32/t", "build", params, {"model": Upstream(files={"model": tmp_path / "missing.onnx"})}, tmp_path
    )


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("tensorrt") is not None, reason="full TensorRT is installed here"
)
def test_a_missing_backend_in_a_worker_keeps_exit_code_4(tmp_path: Path) -> None:
    executor = LocalExecutor(1)
    try:
        result = executor.submit(_build_task(tmp_path, "tensorrt")).result(timeout=120)
    finally:
        executor.shutdown()  # ends the spare hermetic worker it started
    assert result.exit_code == EnvironmentProblem.exit_code == 4
    assert result.error.startswith("module 'tensorrt' is required: pip install 'trtflow[tensorrt]'")


def test_a_stage_failure_is_exit_code_1_with_its_message(tmp_path: Path) -> None:
    result = run_task(_build_task(tmp_path, "tensorrt-rtx"))
    assert result.exit_code == StageError.exit_code == 1 and result.files is None
    assert result.error.startswith("the ONNX parser rejected the model")


def test_a_hermetic_build_runs_in_a_fresh_process_without_aslr_and_hands_its_engine_back(tmp_path: Path) -> None:
    import numpy as np
    import onnx
    from conftest import example_models

    from trtflow.executors.hermetic import run_hermetic
    from trtflow.util.settings import Settings

    onnx.save(example_models().tiny_cnn(np.random.default_rng(0)), tmp_path / "m.onnx")
    params = build.Params(
        precision="fp32",
        profiles=[{"input": {"min": [1, 3, 32, 32], "opt": [2, 3, 32, 32], "max": [4, 3, 32, 32]}}],
        backend="tensorrt-rtx",
        backend_version=None,
        compute_capabilities=["sm_86"],
        hardware_compatibility="none",
        version_compatible=False,
    )
    work = tmp_path / "work"
    work.mkdir()
    task = StageTask("build:m/fp32/t", "build", params, {"model": Upstream(files={"model": tmp_path / "m.onnx"})}, work)
    result = run_hermetic(
        task, Settings.from_environ({"HOME": "/root", "SECRET_TOKEN": "x", "CUDA_VISIBLE_DEVICES": "0"})
    )
    assert result.error is None, result.error
    assert Path(result.files["engine"]).parent == work and Path(result.files["engine"]).stat().st_size > 10_000
    assert result.record["hermetic"] == (
        "yes: fresh process, ASLR off, minimal environment, passed through: CUDA_VISIBLE_DEVICES, "
        "PYTHONHASHSEED=0, fixed slot folder and names"
    )
    assert Settings.from_environ({"HOME": "/root", "SECRET_TOKEN": "x"}).hermetic_env() == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "PYTHONHASHSEED": "0",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


def test_the_exchange_refuses_bytes_that_do_not_hash_to_their_name(tmp_path: Path) -> None:
    from trtflow.executors.exchange import Exchange

    exchange = Exchange(str(tmp_path / "exchange"))
    source = tmp_path / "model.onnx"
    source.write_bytes(b"weights" * 1000)
    digest = exchange.put(source)
    assert exchange.put(source) == digest  # already there: nothing written again
    assert exchange.get(digest, tmp_path / "fetched").read_bytes() == source.read_bytes()
    stored = tmp_path / "exchange" / "objects" / digest[:2] / digest
    stored.write_bytes(b"tampered")
    with pytest.raises(ValueError, match="holds other bytes"):
        exchange.get(digest, tmp_path / "again")
    assert not (tmp_path / "again").exists() and not list(tmp_path.glob(".again.*"))  # nothing half-written left


def test_a_node_that_cannot_read_the_exchange_fails_its_stage_with_exit_4(tmp_path: Path) -> None:
    from trtflow.executors.exchange import Exchange
    from trtflow.executors.ray import landed_or_failure, ship

    source = tmp_path / "model.onnx"
    source.write_bytes(b"an onnx model")
    task = StageTask("cleanup:m", "cleanup", None, {"model": Upstream(files={"model": source})}, tmp_path / "work")
    shipped = ship(task, Exchange(str(tmp_path / "driver-side")))
    # another folder: not shared
    landed = landed_or_failure(shipped, Exchange(str(tmp_path / "node-side")), tmp_path / "node")
    assert landed.exit_code == 4 and "cannot fetch the inputs of cleanup:m from the exchange" in landed.error
    ok = landed_or_failure(shipped, Exchange(str(tmp_path / "driver-side")), tmp_path / "node2")
    assert (
        ok.inputs["model"].files["model"].read_bytes() == b"an onnx model"
        and ok.inputs["model"].files["model"].name == "model.onnx"
    )


def test_builds_forked_by_two_build_servers_are_byte_identical(zoo_dir: Path, tmp_path: Path) -> None:
    """EfficientNet-style: builds in one process differ in their Myelin numbering (benchmarks/repro.py: 6 distinct
    engines in 6 builds); forked by a build server, started now or later, every build gives the same bytes."""
    import hashlib

    from zoo import zoo_model

    from trtflow.executors.forking import ForkServers
    from trtflow.executors.hermetic import run_hermetic
    from trtflow.util.settings import Settings

    model, digests, records = zoo_model("efficientnet", zoo_dir), set(), set()
    for server in range(2):
        servers = ForkServers.for_builds(Settings.from_environ())
        try:
            for index in range(2):
                result = run_hermetic(model.build_task("sm_89", tmp_path / f"{server}-{index}"), Settings(), servers)
                assert result.error is None, result.error
                digests.add(hashlib.sha256(Path(result.files["engine"]).read_bytes()).hexdigest())
                records.add(result.record["hermetic"])
        finally:
            servers.close()
    assert len(digests) == 1
    assert records == {
        "yes: forked from a build server that did only its imports, ASLR off, minimal environment, PYTHONHASHSEED=0, "
        "fixed slot folder and names"
    }


def test_a_build_server_that_died_is_replaced_and_its_slot_freed(zoo_dir: Path, tmp_path: Path) -> None:
    """Killed while idle (as the OOM killer would): the next task starts a new server; killed during a task: that task
    fails in one line naming the signal, and nothing stays in the slots."""
    import os
    import signal
    import threading

    from zoo import zoo_model

    from trtflow.executors.forking import ForkServers
    from trtflow.executors.hermetic import run_hermetic
    from trtflow.util.settings import Settings

    model, servers = zoo_model("resnet", zoo_dir), ForkServers.for_builds(Settings())
    try:
        servers.fill(1)
        (idle,) = servers._idle
        os.kill(idle.process.pid, signal.SIGKILL)
        idle.process.wait()
        result = run_hermetic(model.build_task("sm_89", tmp_path / "after-idle-death"), Settings(), servers)
        assert result.error is None, result.error
        (again,) = servers._idle
        assert again.process.pid != idle.process.pid and not list(again.slot.iterdir())  # its slot emptied
        assert len(os.listdir(f"/proc/{again.process.pid}/task")) == 1  # it forks from a single-threaded process
        threading.Timer(0.1, os.kill, (again.process.pid, signal.SIGKILL)).start()
        killed = run_hermetic(model.build_task("sm_89", tmp_path / "killed"), Settings(), servers)
        assert killed.error is not None and "died: killed by SIGKILL" in killed.error and not killed.deterministic
        assert servers._idle == [] and not again.slot.exists()  # a dead server's slot is removed
    finally:
        servers.close()


def test_servers_started_before_the_plan_end_when_it_needs_none() -> None:
    """`trtflow run` starts a build server (for a project with no store yet, the model tools' server first) before
    it loads the project; a plan with no stage for a server ends it at once instead of at the end of the run."""
    from trtflow.executors.forking import BUILD_SERVED, TOOLS_SERVED

    cold = LocalExecutor.started_early(1, cold=True)
    try:
        assert TOOLS_SERVED in cold._servers  # cleanup comes first in a project never run
    finally:
        cold.shutdown()
    executor = LocalExecutor.started_early(1, cold=False)
    try:
        assert set(executor._servers) == {BUILD_SERVED}
        (builds,) = executor._servers[BUILD_SERVED]._idle
        assert builds.process.poll() is None
        executor.prepare({"cleanup", "verify"})  # the tools' server starts, the build server goes
        assert set(executor._servers) == {TOOLS_SERVED} and builds.process.wait(timeout=10) is not None
        (tools,) = executor._servers[TOOLS_SERVED]._idle
        executor.prepare({"verify"})
        assert executor._servers == {} and tools.process.wait(timeout=10) is not None
    finally:
        executor.shutdown()


def test_what_a_killed_server_left_in_its_folder_goes_with_the_folders_next_use() -> None:
    """A plain worker server's folder is a locked slot (`/tmp/trtflow-servers-<uid>/<n>`), not a fresh temporary
    folder: a process killed while holding one leaves its files there, and the slot's next user finds it empty."""
    import subprocess
    import sys

    from trtflow.util.slots import PLAIN_SLOTS, free_slot

    killed = (
        "import os, sys\nfrom trtflow.util.slots import free_slot\n"
        f"with free_slot({PLAIN_SLOTS!r}) as slot:\n"
        "    (slot / 'left-behind.pickle').write_bytes(b'task')\n    print(slot, flush=True)\n    os._exit(9)\n"
    )
    done = subprocess.run([sys.executable, "-c", killed], capture_output=True, text=True, timeout=60)
    left = Path(done.stdout.strip())
    assert done.returncode == 9 and (left / "left-behind.pickle").exists()
    with free_slot(PLAIN_SLOTS) as slot:
        assert slot == left and not list(slot.iterdir())
    assert not left.exists()


def test_model_tool_workers_ask_glibc_for_huge_pages_and_keep_the_users_tunables() -> None:
    from trtflow.util.settings import tool_overlay

    assert tool_overlay({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert tool_overlay({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})["GLIBC_TUNABLES"] == (
        "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    )
    assert tool_overlay({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"


@pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage/enabled").is_file()
    or "[madvise]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text(),
    reason="transparent huge pages are not in madvise mode here: the tunable changes nothing",
)
def test_a_model_tool_worker_gets_its_large_arrays_in_huge_pages() -> None:
    """What the tunable is for: 256 MiB of bytes a tool's worker fills (a serialized model, a copy of its weights: the
    C and C++ heap, not numpy, which asks for huge pages itself) sit in 2 MiB pages; in the same process started with
    the user's environment, in 4 KiB ones (the kernel's `madvise` mode: only memory asked for gets them)."""
    import subprocess
    import sys

    from trtflow.util.settings import Settings

    fill = (
        "import re; filled = b'x' * (1 << 28); "
        "print(re.search(r'AnonHugePages:\\s+(\\d+)', open('/proc/self/smaps_rollup').read()).group(1))"
    )

    def huge_kib(env: dict[str, str]) -> int:
        done = subprocess.run([sys.executable, "-c", fill], env=env, capture_output=True, text=True, check=True)
        return int(done.stdout)

    plain = {name: value for name, value in Settings.pinned_env().items() if name != "GLIBC_TUNABLES"}
    assert huge_kib(Settings.pinned_env()) >= 200 * 1024
    assert huge_kib(plain) < 8 * 1024


@pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage/enabled").is_file()
    or "[madvise]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text(),
    reason="transparent huge pages are not in madvise mode here: the tunable changes nothing",
)
@pytest.mark.parametrize("kind", ["cleanup", "export", "precision"])
@pytest.mark.parametrize(("model_bytes", "huge"), [(46_000_000, False), (440_000_000, True)])
def test_a_model_tool_worker_takes_huge_pages_only_for_large_inputs(
    tmp_path: Path, kind: str, model_bytes: int, huge: bool
) -> None:
    """A cleanup, export or precision child of small inputs (ResNet-18's 46 MB) gives huge pages up, the tunable
    notwithstanding: its first ones cost more than they save (docs/memory.md); one of BERT-base's 440 MB keeps them.
    The worker decides from its task's input files, as it does before running the stage."""
    import pickle
    import subprocess
    import sys

    from trtflow.executors import StageTask
    from trtflow.stages.base import Upstream
    from trtflow.util.settings import Settings

    model = tmp_path / "model.onnx"
    with model.open("wb") as sparse:
        sparse.truncate(model_bytes)
    task = StageTask(f"{kind}:m", kind, None, {"model": Upstream(files={"model": model})}, tmp_path)
    (tmp_path / "task.pickle").write_bytes(pickle.dumps(task))
    fill = (
        "import pickle, re, sys; from trtflow.executors.worker import settle_huge_pages; "
        "settle_huge_pages(pickle.load(open(sys.argv[1], 'rb'))); filled = b'x' * (1 << 28); "
        "print(re.search(r'AnonHugePages:\\s+(\\d+)', open('/proc/self/smaps_rollup').read()).group(1))"
    )
    done = subprocess.run(
        [sys.executable, "-c", fill, str(tmp_path / "task.pickle")],
        env=Settings.pinned_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert (int(done.stdout) >= 200 * 1024) is huge


def test_the_model_tools_server_imports_what_the_plan_needs_while_its_first_task_runs(tmp_path: Path) -> None:
    """With a reduced precision planned, the model tools' server imports ModelOpt while the run's first task for it
    runs, in a child forked before the import: that task is answered as it ends, and the server reads the next request
    once the import is done, so the children after start with it. Shown here with a module no stage imports (its
    shared library appears in the server's memory map); the first task carries it, the next none."""
    import shutil

    from trtflow.executors.forking import TOOLS_SERVED
    from trtflow.stages import precision

    model = tmp_path / "model.onnx"
    shutil.copy(Path(__file__).resolve().parents[2] / "models" / "tiny_cnn.onnx", model)
    executor = LocalExecutor(1)
    try:
        executor.prepare({"precision"}, {"precision": {"xxlimited"}})
        (server,) = executor._servers[TOOLS_SERVED]._idle
        maps = Path(f"/proc/{server.process.pid}/maps")
        assert "xxlimited" not in maps.read_text()
        for index in range(2):
            work = tmp_path / f"work-{index}"
            work.mkdir()
            params = precision.Params(precision="fp32")
            task = StageTask("precision:m/fp32", "precision", params, {"model": Upstream(files={"model": model})}, work)
            assert executor.submit(task).result(timeout=120).error is None
            assert TOOLS_SERVED not in executor._later  # the first task carried the imports
        assert "xxlimited" in maps.read_text()
    finally:
        executor.shutdown()


def test_the_model_tools_servers_of_a_run_share_one_private_folder_that_goes_with_the_run() -> None:
    """Every model tools' server a run starts names the same folder (stages.shared_outputs: what one precision stage
    computed for the others), private to this user; the run's end removes it. Servers of other kinds name none."""
    import os
    import stat

    from trtflow.executors.forking import TOOLS_SERVED, USER_CODE_SERVED, ForkServers
    from trtflow.util.servers import SHARED_OUTPUTS_ENV
    from trtflow.util.settings import Settings

    def named(pid: int) -> str | None:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        found = [
            entry.split(b"=", 1)[1].decode() for entry in environ if entry.startswith(f"{SHARED_OUTPUTS_ENV}=".encode())
        ]
        return found[0] if found else None

    tools, user_code = (
        ForkServers(TOOLS_SERVED, Settings(), hermetic=False),
        ForkServers(USER_CODE_SERVED, Settings(), hermetic=False),
    )
    try:
        tools.fill(2)
        user_code.fill(1)
        folders = {named(server.process.pid) for server in tools._idle}
        assert len(folders) == 1 and None not in folders
        folder = Path(str(next(iter(folders))))
        assert folder.is_dir() and stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
        assert named(user_code._idle[0].process.pid) is None
    finally:
        tools.close()
        user_code.close()
    assert not folder.exists()
