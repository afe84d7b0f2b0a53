"""One job of a run: the node handed to an executor (its inputs, its work dir), and what its ending means: its
outputs and record stored, a failure recorded under its key, a worker the OOM killer took, a store too full to take
its output."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from trtflow.errors import EnvironmentProblem, required
from trtflow.executors import StageResult
from trtflow.run.dag import Node
from trtflow.run.plan import Resolution
from trtflow.stages import described
from trtflow.stages.base import Upstream
from trtflow.stages.modelfile import companions, place_side_by_side
from trtflow.store.layout import write_failure
from trtflow.store.records import StageRecord
from trtflow.store.store import Store
from trtflow.util.memory import oom_kills, shown

# A stage that fails with one of these could not write its output: the store is full, not the stage wrong.
STORE_FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS)


@dataclass
class Job:
    """A node a run handed to its executor, with what the runner needs when it ends."""

    node: Node
    key: str
    components: dict
    workdir: Path
    started: float
    slot: int = 0  # which of the -j job slots it ran in (the report's timeline rows)
    expected: int = 0  # the peak memory it was admitted with (admission.MemoryAdmission)
    oom_kills: int | None = None  # the cgroup's OOM kill count when it started: a kill since then is a lack of memory


def task_inputs(
    resolution: Resolution, finished: dict[str, StageRecord], store: Store, workdir: Path
) -> dict[str, Upstream]:
    """Each input role's files (store objects; a model and its external data side by side), record and digests."""
    node, digests = resolution.node, required(resolution.components, f"{resolution.node.id}: the components")["inputs"]
    # a source model's digests include its external data files'
    inputs = {
        role: Upstream(files={role: path}, sha256=companions(digests, role) | {role: digests[role]})
        for role, path in node.sources
    }
    for dep in node.deps:
        if dep.node in resolution.missing:
            inputs[dep.role] = Upstream(files={}, missing=resolution.missing[dep.node])
            continue
        record = finished[dep.node]
        files = {name: store.objects.path(digest) for name, digest in record["outputs"].items()}
        if companions(files, dep.output):
            files.update(place_side_by_side(files, dep.output, workdir / "inputs" / dep.role))
        inputs[dep.role] = Upstream(files=files, record=record["record"], key=record["key"], sha256=record["outputs"])
    return inputs


def as_lack_of_memory(job: Job, result: StageResult) -> StageResult:
    """A worker the kernel's OOM killer killed (its cgroup counted a kill while the stage ran) fails for lack of
    memory, exit 4, never recorded: said as such, not as a bare signal."""
    now = oom_kills()
    if result.error is None or job.oom_kills is None or now is None or now <= job.oom_kills:
        return result
    return StageResult.failure(
        f"{job.node.id} was killed for lack of memory (the kernel's OOM killer; it was expected to need "
        f"{shown(job.expected)}): run fewer stages at once (-j, --memory) or on a machine with more memory",
        EnvironmentProblem.exit_code,
        result.detail,
        node=result.node,
    )


def store_outputs(store: Store, job: Job, result: StageResult, seconds: float, run_id: str) -> StageRecord:
    """Move a successful stage's files into the store, then write its record naming them (objects first: a crash
    leaves orphan objects, never a record naming a missing one); the record as stored."""
    files = required(result.files, f"{job.node.id}: the files of a successful stage")
    record = required(result.record, f"{job.node.id}: the record of a successful stage")
    outputs = {name: store.objects.add(Path(path)) for name, path in files.items()}
    record = described(job.node.kind, {name: store.objects.path(digest) for name, digest in outputs.items()}, record)
    built: StageRecord = {
        "key": job.key,
        "node": job.node.id,
        "outputs": outputs,
        "record": record,
        "components": job.components,
        "seconds": seconds,
        "peak_rss": result.peak_rss,
        "built_by": {"run": run_id, "pid": os.getpid()},
    }
    return store.records.put(job.key, built)


def raise_if_store_full(store: Store, job: Job, code: int | None) -> None:
    """A stage that could not write its output fails the run with one line, not every stage after it."""
    if code in STORE_FULL_ERRNOS:
        raise write_failure(store.root, OSError(code, os.strerror(code)), f"({job.node.id} writing its output)")


def failure_record(job: Job, result: StageResult, seconds: float, run_id: str) -> StageRecord:
    """The stage record of a stage's own failure: no outputs, its one-line reason, exit code and the log's tail."""
    failure = {"reason": result.error, "exit_code": result.exit_code, "log": result.detail[-4000:]}
    return {
        "key": job.key,
        "node": job.node.id,
        "outputs": {},
        "record": {},
        "failure": failure,
        "components": job.components,
        "seconds": seconds,
        "built_by": {"run": run_id, "pid": os.getpid()},
    }
