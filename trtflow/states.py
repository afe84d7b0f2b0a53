"""The fixed status vocabulary of plan, run and --json, and a node's state in it (light: no project code imported)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trtflow.store.records import StageRecord


class Status(str, Enum):
    """The fixed status vocabulary shown by plan, run and --json, in one place: each member is its word (a str, so
    JSON, messages and comparisons see "cached", never `Status.CACHED`)."""

    CACHED = "cached"  # found in the store (or the remote cache) under its key
    NEW = "new"  # never built: will run
    STALE = "stale"  # built before with other inputs or settings: will run
    BUILT = "built"  # ran in this run
    FAILED = "failed"  # its stage failed (its own failure, recorded, or the machine's)
    SKIPPED = "skipped"  # below a failure
    WAITING = "waiting"  # another run holds its key's lock

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


CACHED, NEW, STALE, BUILT, FAILED, SKIPPED, WAITING = (
    Status.CACHED,
    Status.NEW,
    Status.STALE,
    Status.BUILT,
    Status.FAILED,
    Status.SKIPPED,
    Status.WAITING,
)
PULLED = "pulled from the remote cache"  # the reason of a cached node the remote supplied


class NodeRef(Protocol):
    """What every state's node has: a stage's node (stages.base.Node) or one the no-op memo remembers
    (runmemo.RememberedNode)."""

    @property
    def id(self) -> str:
        """`build:tiny/fp32/rtx-ada`."""

    @property
    def kind(self) -> str:
        """The stage kind: `build`."""

    @property
    def recipe(self) -> str:
        """The recipe: `tiny`."""


@dataclass(frozen=True)
class NodeState:
    """A node's status in the fixed vocabulary, with its reason, key and (when failed) the exit code its error
    carries. A value: a later state of the node is a new one (dataclasses.replace)."""

    node: NodeRef
    status: Status
    reason: str = ""
    key: str | None = None
    components: dict | None = None
    changes: list[str] = field(default_factory=list)
    seconds: float | None = None
    detail: str = ""
    record: StageRecord | None = field(default=None, repr=False)  # the store record of a cached node
    exit_code: int = 0
    where: dict | None = None  # the node a distributed executor ran it on: {"id": ..., "labels": {...}}
    recorded: bool = False  # a failure of the stage's own (deterministic): recorded under its key, kept in trtflow.lock
    from_cache: bool = False  # a recorded failure found in the store: reported, not redone (--retry-failed redoes it)
    # --frozen: a failure (or skip) exactly as trtflow.lock records it: no reason to fail the run
    expected: bool = False
    peak_rss: int | None = None  # bytes the stage's process peaked at, for a stage this run ran

    @property
    def label(self) -> str:
        """`cached`, `new`, `stale: profile max changed`, `failed (cached): ...`: what the user reads."""
        status = f"{self.status} (cached)" if self.from_cache else self.status
        return f"{status}: {self.reason}" if self.reason else status

    @property
    def settled(self) -> bool:
        """Nothing to run: cached, a recorded failure found in the store, or skipped below one."""
        return self.status in (CACHED, SKIPPED) or self.from_cache

    def to_json(self) -> dict:
        """The node's entry in `--json` output."""
        entry = {
            "id": self.node.id,
            "kind": self.node.kind,
            "recipe": self.node.recipe,
            "status": self.status,
            "reason": self.reason or None,
            "key": self.key,
            "changes": self.changes,
            "seconds": self.seconds,
        }
        if self.peak_rss is not None:
            entry["peak_rss"] = self.peak_rss
        if self.status == FAILED:
            entry.update(failure_cached=self.from_cache, failure_recorded=self.recorded, failure_expected=self.expected)
        return {**entry, "node": self.where} if self.where is not None else entry


def recorded_failure(record: Mapping[str, Any] | None) -> str | None:
    """The one-line reason of a store record that records a stage's failure, or None for an ordinary record."""
    failure = record.get("failure") if isinstance(record, dict) else None
    return failure["reason"] if isinstance(failure, dict) and isinstance(failure.get("reason"), str) else None


def failed_as_recorded(state: NodeState, failure: str, record: Mapping[str, Any]) -> NodeState:
    """The failed state of a node whose stage's own failure is recorded under its key (found, or made meanwhile)."""
    return NodeState(
        state.node,
        FAILED,
        failure,
        key=state.key,
        components=state.components,
        exit_code=1,
        detail=record["failure"].get("log") or "",
        recorded=True,
        from_cache=True,
    )
