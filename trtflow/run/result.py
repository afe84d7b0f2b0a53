"""What a run returns: one immutable value the CLI prints, the report draws, `--json` serializes and the lock is
written from.

`Session.run` makes it; the no-op memo makes one from what it remembers, and a dry run from the plan, so every
caller reads the same shape whatever answered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from trtflow.states import BUILT, CACHED, FAILED, SKIPPED, NodeState
from trtflow.store.records import StageRecord

EMPTY: Mapping = MappingProxyType({})
COUNTED = (BUILT, CACHED, FAILED, SKIPPED)  # the totals of a summary and of `--json`


def frozen_mapping(items: Mapping | Iterable[tuple[Any, Any]]) -> Mapping:
    """A read-only copy (a result never changes after the run)."""
    return MappingProxyType(dict(items))


@dataclass(frozen=True)
class Slot:
    """When a stage that ran did so: seconds from the run's start, the job slot it held, its process's peak RSS."""

    start: float
    end: float
    slot: int
    peak_rss: int | None = None


@dataclass(frozen=True)
class RunResult:
    """A finished (or dry) run: every selected node's final state and what the run found on the way."""

    nodes: tuple[NodeState, ...]
    seconds: float
    jobs: int = 1
    dry_run: bool = False
    warnings: tuple[str, ...] = ()
    # node id -> the store record of each node that ran or was found cached (the lock is written from these)
    records: Mapping[str, StageRecord] = field(default_factory=lambda: EMPTY)
    timeline: Mapping[str, Slot] = field(
        default_factory=lambda: EMPTY
    )  # node id -> when it ran, for the stages this run ran
    planned: Mapping[str, NodeState] = field(
        default_factory=lambda: EMPTY
    )  # the plan the run started from: why each stage ran
    repro: tuple[Any, ...] = ()  # --check-repro: one repro.EngineRepro per engine rebuilt
    repro_skipped: Mapping[str, str] = field(
        default_factory=lambda: EMPTY
    )  # --check-repro: engines not rebuilt, and why
    frozen: Mapping[str, Any] | None = None  # --frozen: identical count, equivalent engines, digests per engine
    from_memo: bool = False  # answered by the no-op memo, without loading the project
    report: str | None = field(default=None, compare=False)  # where the run's report went, if one was written

    @property
    def failed(self) -> list[NodeState]:
        """The nodes that failed and fail the run (under --frozen, a failure as trtflow.lock records it does not)."""
        return [s for s in self.nodes if s.status == FAILED and not s.expected]

    @property
    def exit_code(self) -> int:
        """0; the largest exit code of a failed stage (1, or 4 for something missing from this machine); 1 when
        --check-repro found an engine that is not equivalent."""
        failed = [s.exit_code or 1 for s in self.failed]
        if failed:
            return max(failed)
        return 1 if any(check.verdict == "different" for check in self.repro) else 0

    @property
    def did_nothing(self) -> bool:
        """Every node settled before the run: found cached, a recorded failure found again, or skipped below one."""
        return all(s.settled for s in self.nodes)

    @property
    def packages(self) -> list[str]:
        """The recipes whose package this run wrote or found current."""
        return sorted(s.node.recipe for s in self.nodes if s.node.kind == "package" and s.status in (BUILT, CACHED))

    def counts(self) -> dict[str, int]:
        """Nodes per status of the summary, and the failures found recorded rather than run."""
        counts = {status.value: sum(s.status == status for s in self.nodes) for status in COUNTED}
        counts["failed_cached"] = sum(s.status == FAILED and s.from_cache for s in self.nodes)
        return counts

    def to_json(self) -> dict:
        """The `--json` summary of `trtflow run`."""
        checks: dict[str, object] = {}
        if self.repro or self.repro_skipped:
            checks["reproducibility"] = [check.to_json() for check in self.repro]
        if self.repro_skipped:
            checks["reproducibility_not_checked"] = [{"id": n, "why": why} for n, why in self.repro_skipped.items()]
        if self.frozen is not None:
            checks["frozen"] = dict(self.frozen)
        return {
            "dry_run": self.dry_run,
            "seconds": round(self.seconds, 3),
            **self.counts(),
            "warnings": list(self.warnings),
            "nodes": [s.to_json() for s in self.nodes],
            "packages": self.packages,
            **checks,
        }
