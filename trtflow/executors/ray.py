"""The Ray executor (`trtflow run --executor ray`): each stage a Ray task, builds routed by their target's node labels.

The driver keeps planning, the local store, the lock and packaging exactly as the local executor leaves them;
Ray only runs stages. Bytes never travel through Ray: a task's input files are put in the exchange (any fsspec
URL, or a folder every node sees) under their sha256 before it is submitted, the task fetches and re-hashes
them on its node, runs the stage (builds in a hermetic process, as locally), and puts its outputs in the
exchange; the driver fetches and re-hashes those into its store. A task names its inputs and outputs by
digest, so a retried task (Ray re-runs a task whose node died, up to MAX_RETRIES times) can only deliver the
same kind of result, and a stage's own failure is returned as a result, never retried.

A target's `runs_on` labels become the build's Ray label selector. Before anything is submitted, each set
of labels the run needs is checked against the live nodes with CPUs (Ray would keep an infeasible task
pending forever): none matching is one line and exit 4, naming the labels and what the nodes have.
"""

from __future__ import annotations

import concurrent.futures as futures
import os
import socket
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trtflow.backends.base import import_or_explain
from trtflow.errors import EnvironmentProblem, required
from trtflow.executors import StageResult, StageTask, run_task
from trtflow.executors.exchange import Exchange
from trtflow.stages.base import Upstream
from trtflow.util.settings import Settings
from trtflow.util.text import clipped

MAX_RETRIES = 3  # re-runs of a task whose worker or node died (Ray's own retry; stage failures are results)
CONNECT_TIMEOUT_S = 5


@dataclass(frozen=True)
class ShippedTask:
    """A StageTask as it travels to a node: every input file named by its digest and the name it must have there."""

    task: StageTask  # with inputs' files emptied (paths of the driver mean nothing on a node)
    files: dict[str, dict[str, tuple[str, str]]]  # role -> file name -> (sha256, file name on disk)


class RayExecutor:
    """Runs StageTasks as Ray tasks; at most `jobs` at once (the runner's -j), on a cluster or a local instance."""

    def __init__(
        self,
        jobs: int,
        address: str | None,
        exchange: str,
        labels: dict[str, dict[str, str]],
        exchange_options: dict | None = None,
    ):
        self.jobs, self.address, self.labels = jobs, address, labels
        self.exchange_url, self.exchange_options = exchange, dict(exchange_options or {})
        self.exchange = Exchange(exchange, self.exchange_options)
        # Ray's driver threads print cluster events ("node ... marked dead") to stdout, which carries the --json
        # summary: while connected, stdout is stderr (the summary is printed after shutdown)
        self._stdout, sys.stdout = sys.stdout, sys.stderr
        try:
            self._ray = _connect(address, jobs)
        except BaseException:
            sys.stdout = self._stdout
            raise
        self._remote = self._ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(run_on_node)
        self._threads = futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="ray-task")

    def check_labels(self, needed: dict[str, dict[str, str]]) -> None:
        """Exit 4 (one line) if a node needs labels no live node with CPUs has; `needed`: what -> labels."""
        nodes = [n for n in self._ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        for what, labels in needed.items():
            if labels and not any(all((n.get("Labels") or {}).get(k) == v for k, v in labels.items()) for n in nodes):
                have = sorted(
                    {
                        f"{k}={v}"
                        for n in nodes
                        for k, v in (n.get("Labels") or {}).items()
                        if not k.startswith("ray.io/")
                    }
                )
                raise EnvironmentProblem(
                    f"{what} needs a Ray node labelled {_shown(labels)}; no live node with CPUs has it "
                    f"(labels the nodes have: {', '.join(have) or 'none'})"
                )

    def submit(self, task: StageTask) -> futures.Future[StageResult]:
        """Ship the inputs, run the task on a node that has the labels, fetch the outputs; the future never raises."""
        return self._threads.submit(self._run, task)

    def prepare(self, kinds: set[str], imports: Mapping[str, set[str]] | None = None) -> None:
        """Nothing to warm here: Ray keeps its own workers."""

    def shutdown(self) -> None:
        """Wait for running tasks to be collected, then disconnect (a local instance stops with it)."""
        self._threads.shutdown(cancel_futures=True)
        if self._ray.is_initialized():
            self._ray.shutdown()
        sys.stdout = self._stdout

    def _run(self, task: StageTask) -> StageResult:
        try:
            shipped = ship(task, self.exchange)
            selector = self.labels.get(task.node_id) or {}
            ref = (
                self._remote.options(label_selector=selector).remote(shipped, self.exchange_url, self.exchange_options)
                if selector
                else self._remote.remote(shipped, self.exchange_url, self.exchange_options)
            )
            answer = self._ray.get(ref)
        except EnvironmentProblem as exc:
            return StageResult.failure(str(exc), exc.exit_code)
        except Exception as exc:  # Ray gave up (retries spent, the cluster gone) or the exchange failed
            return StageResult.failure(
                f"Ray task failed: {type(exc).__name__}: {clipped(' '.join(str(exc).split()), 400)}"
            )
        result: StageResult = answer["result"]
        if result.error is not None:
            return replace(result, node=answer["node"])
        outputs = Path(tempfile.mkdtemp(dir=task.workdir, prefix="outputs-"))
        try:
            files = {  # flat names: an output's name may be a path (a package's files)
                name: str(self.exchange.get(digest, outputs / f"output-{number}"))
                for number, (name, digest) in enumerate(sorted(answer["files"].items()))
            }
        except (OSError, ValueError) as exc:
            return StageResult.failure(
                f"fetching the outputs of {task.node_id} from the exchange: {exc}", node=answer["node"]
            )
        return StageResult(files=files, record=result.record, node=answer["node"])


def ship(task: StageTask, exchange: Exchange) -> ShippedTask:
    """Put every input file of `task` in the exchange; the task as it travels (inputs by digest)."""
    files: dict[str, dict[str, tuple[str, str]]] = {}
    for role, upstream in task.inputs.items():
        entries = dict(upstream.files)
        for name in upstream.sha256:  # a source model's external data files travel beside it
            if name.startswith(f"{role}.data:") and role in upstream.files:
                entries[name] = upstream.files[role].parent / name.split(":", 1)[1]
        files[role] = {
            name: (exchange.put(Path(path), upstream.sha256.get(name)), Path(path).name)
            for name, path in entries.items()
        }
    bare = {role: replace(upstream, files={}) for role, upstream in task.inputs.items()}
    return ShippedTask(replace(task, inputs=bare), files)


def land(shipped: ShippedTask, exchange: Exchange, workdir: Path) -> StageTask:
    """The task with its inputs fetched (and re-hashed) into `workdir`, one folder per role, under their names."""
    inputs: dict[str, Upstream] = {}
    for role, upstream in shipped.task.inputs.items():
        folder = workdir / "inputs" / role
        folder.mkdir(parents=True, exist_ok=True)
        fetched = {
            name: exchange.get(digest, folder / on_disk)
            for name, (digest, on_disk) in shipped.files.get(role, {}).items()
        }
        inputs[role] = replace(upstream, files={name: path for name, path in fetched.items() if ".data:" not in name})
    out = workdir / "work"
    out.mkdir()
    return replace(shipped.task, inputs=inputs, workdir=out)


def landed_or_failure(shipped: ShippedTask, exchange: Exchange, workdir: Path) -> StageTask | StageResult:
    """The task with its inputs fetched, or the failure (exit 4) of a node that cannot read them from the exchange."""
    try:
        return land(shipped, exchange, workdir)
    except (OSError, ValueError) as exc:
        return StageResult.failure(
            f"cannot fetch the inputs of {shipped.task.node_id} from the exchange {exchange.location} on "
            f"{socket.gethostname()}: {exc} (executor.ray.exchange must be storage every node reads)",
            EnvironmentProblem.exit_code,
        )


def run_on_node(shipped: ShippedTask, exchange_url: str, exchange_options: dict) -> dict[str, Any]:
    """The Ray task: fetch the inputs, run the stage as the local executor would, put the outputs in the exchange."""
    import ray

    from trtflow.executors.hermetic import run_hermetic, run_isolated
    from trtflow.executors.local import HERMETIC_KINDS, ISOLATED_KINDS

    context = ray.get_runtime_context()
    node = {"id": context.get_node_id(), "labels": dict(sorted(context.get_node_labels().items()))}
    exchange = Exchange(exchange_url, exchange_options)
    with tempfile.TemporaryDirectory(prefix=f"trtflow-ray-{os.getpid()}-") as scratch:  # which worker: for ps and kill
        task = landed_or_failure(shipped, exchange, Path(scratch))
        if isinstance(task, StageResult):
            return {"result": task, "node": node, "files": {}}
        if task.kind in HERMETIC_KINDS:
            result = run_hermetic(task, Settings.from_environ())
        elif task.kind in ISOLATED_KINDS:
            result = run_isolated(task)
        else:
            result = run_task(task)
        if result.error is not None:
            return {"result": result, "node": node, "files": {}}
        digests = {name: exchange.put(Path(path)) for name, path in required(result.files, "a result's files").items()}
    return {"result": replace(result, files=None), "node": node, "files": digests}


def _connect(address: str | None, jobs: int) -> Any:
    """The ray module, connected: to `address` (host:port or auto), or to a new local instance of `jobs` CPUs."""
    ray = import_or_explain("ray", "ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address and address != "auto":
        _reachable(address)
    try:
        if address:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        else:
            ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except Exception as exc:  # ConnectionError, RuntimeError: no cluster there
        raise EnvironmentProblem(
            f"cannot connect to the Ray cluster at {address or 'a new local instance'}: "
            f"{clipped(' '.join(str(exc).split()), 300)}"
        ) from exc
    return ray


def _reachable(address: str) -> None:
    """One line and exit 4 for an address nothing answers on, in seconds (Ray itself retries for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except (OSError, ValueError) as exc:
        raise EnvironmentProblem(f"cannot reach the Ray cluster at {address}: {exc}") from exc


def _shown(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
