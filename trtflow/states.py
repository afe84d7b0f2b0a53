"""The fixed status vocabulary of plan, run and --json, and a node's state in it (light: no project code imported)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

# The fixed status vocabulary shown by plan, run and --json, in one place.
CACHED, NEW, STALE, BUILT, FAILED, SKIPPED, WAITING = "cached", "new", "stale", "built", "failed", "skipped", "waiting"
PULLED = "pulled from the remote cache"  # the reason of a cached node the remote supplied


@dataclass
class NodeState:
    """A node's status in the fixed vocabulary, with its reason, key and (when failed) the exit code its error carries."""

    node: Any  # a dag.Node; a summary needs only its id, kind and recipe (runmemo.RememberedNode has just those)
    status: str
    reason: str = ""
    key: Optional[str] = None
    components: Optional[dict] = None
    changes: list[str] = field(default_factory=list)
    seconds: Optional[float] = None
    detail: str = ""
    record: Optional[dict] = field(default=None, repr=False)  # the store record of a cached node
    exit_code: int = 0
    where: Optional[dict] = None  # the node a distributed executor ran it on: {"id": ..., "labels": {...}}  # of a failed node: the exit code of the error class that failed it (4: environment)

    @property
    def label(self) -> str:
        """`cached`, `new`, `stale: profile max changed`, `failed: ...`: what the user reads."""
        return f"{self.status}: {self.reason}" if self.reason else self.status

    def to_json(self) -> dict:
        """The node's entry in `--json` output."""
        entry = {"id": self.node.id, "kind": self.node.kind, "recipe": self.node.recipe, "status": self.status,
                 "reason": self.reason or None, "key": self.key, "changes": self.changes, "seconds": self.seconds}
        return {**entry, "node": self.where} if self.where is not None else entry
