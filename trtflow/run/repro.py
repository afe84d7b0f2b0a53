"""The release gate behind `trtflow run --check-repro N`: rebuild every selected engine N times in hermetic workers,
from the very inputs its build read, and say per engine whether the rebuilds are identical (bytes), equivalent (only
the backend's generated numbering differs: same canonical digest) or different.

    build:resnet/fp32/rtx-ada   identical   3/3 byte-identical
    build:mobilenet/fp32/rtx-ada equivalent 1/3 byte-identical, 3/3 same canonical digest
"""

from __future__ import annotations

import concurrent.futures as futures
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtflow.errors import required
from trtflow.executors import StageTask
from trtflow.executors.forking import FORKS, ForkServers
from trtflow.executors.hermetic import run_hermetic
from trtflow.hashing import sha256_file
from trtflow.run.dag import Dag, Node
from trtflow.run.jobs import task_inputs
from trtflow.run.plan import Resolver
from trtflow.stages import described
from trtflow.store.records import StageRecord
from trtflow.store.store import Store
from trtflow.util.settings import Settings

IDENTICAL, EQUIVALENT, DIFFERENT = "identical", "equivalent", "different"


@dataclass(frozen=True)
class EngineRepro:
    """One engine against its rebuilds: how many were byte-identical, how many had its canonical digest."""

    node_id: str
    rebuilds: int
    identical: int
    equivalent: int
    failures: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        """identical, equivalent or different (a failed rebuild counts as different)."""
        if self.failures or self.equivalent < self.rebuilds:
            return DIFFERENT
        return IDENTICAL if self.identical == self.rebuilds else EQUIVALENT

    def to_json(self) -> dict:
        """The engine's entry in `--json` output."""
        return {
            "id": self.node_id,
            "verdict": self.verdict,
            "rebuilds": self.rebuilds,
            "identical": self.identical,
            "equivalent": self.equivalent,
            "failures": list(self.failures),
        }


def check_builds(
    dag: Dag,
    finished: dict[str, StageRecord],
    store: Store,
    resolver: Resolver,
    times: int,
    jobs: int,
    progress: Callable[[EngineRepro], None] | None = None,
) -> list[EngineRepro]:
    """Rebuild each finished build node `times` times, `jobs` at once, and compare with the engine in the store."""
    builds = [node for node in dag if node.kind == "build" and node.id in finished]
    settings = Settings.from_environ()
    servers = ForkServers.for_builds(settings) if FORKS else None  # the way the run built them
    try:
        with futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            checks = pool.map(lambda node: _check(node, finished, store, resolver, times, settings, servers), builds)
            found = []
            for check in checks:
                found.append(check)
                if progress is not None:
                    progress(check)
    finally:
        if servers is not None:
            servers.close()
    return found


def _check(
    node: Node,
    finished: dict[str, StageRecord],
    store: Store,
    resolver: Resolver,
    times: int,
    settings: Settings,
    servers: ForkServers | None,
) -> EngineRepro:
    """N hermetic rebuilds of one engine, each compared by bytes and by canonical digest."""
    record = finished[node.id]
    digest, canonical = record["outputs"]["engine"], (record["record"].get("canonical_sha256") or {}).get("engine")
    identical = equivalent = 0
    failures = []
    for _ in range(times):
        workdir = Path(tempfile.mkdtemp(dir=store.tmp, prefix="repro-"))
        try:
            task = StageTask(
                node.id,
                node.kind,
                node.params,
                task_inputs(resolver.resolve(node, finished), finished, store, workdir),
                workdir,
            )
            result = run_hermetic(task, settings, servers)
            if result.error is not None:
                failures.append(result.error)
                continue
            files = required(result.files, "a rebuild's files")
            made = described(node.kind, files, required(result.record, "a rebuild's record"))
            identical += sha256_file(Path(files["engine"])) == digest
            rebuilt = (made.get("canonical_sha256") or {}).get("engine")
            equivalent += canonical is not None and rebuilt == canonical
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return EngineRepro(node.id, times, identical, max(identical, equivalent), tuple(failures))
