"""Finish hooks that place files (a package's archive and folder) run in a thread beside the run.

Extracting a package is I/O and hashing in the runner's process: a cold run of three torchvision-size models spent
0.7 s of its wall there, with every other stage waiting. In a thread of its own (hashing and file I/O release the
GIL) it overlaps the next stages; the runner settles the node when it is done, in its own thread, and a run ends
only when every placement has. One placement at a time: two would compete for the same disk.
"""

from __future__ import annotations

import concurrent.futures as futures
from collections.abc import Callable

from trtflow.errors import TrtflowError
from trtflow.states import NodeState
from trtflow.store.records import StageRecord

# (node state, store record): what the runner settles once the node's files are in place
Placing = tuple[NodeState, StageRecord]


def run_here(place: Callable[[], str | None]) -> futures.Future:
    """`place` run in this thread, its result (or the TrtflowError it raised) in a done future, as if placed
    beside."""
    done: futures.Future = futures.Future()
    try:
        done.set_result(place())
    except TrtflowError as exc:
        done.set_exception(exc)
    return done


class Placements:
    """The finish hooks running in the background, each with the node it places."""

    def __init__(self) -> None:
        self._pool: futures.ThreadPoolExecutor | None = None
        self.pending: dict[futures.Future, Placing] = {}

    def start(self, place: Callable[[], str | None], state: NodeState, record: StageRecord) -> None:
        """Run `place` (a stage's finish hook, bound to its node) in the placing thread."""
        if self._pool is None:
            self._pool = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="placing")
        self.pending[self._pool.submit(place)] = (state, record)

    def take(self, future: futures.Future) -> Placing:
        """The node a finished placement was for (it is no longer pending)."""
        return self.pending.pop(future)

    def close(self) -> None:
        """Wait for the placements under way (a folder is never left half swapped), then stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
