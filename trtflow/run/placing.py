"""Work that runs in a thread beside the run: storing a finished stage's outputs, and the finish hooks that place
files (a package's archive and folder).

Both are I/O and hashing in the runner's process: a cold run of three torchvision-size models spent 0.7 s of its
wall extracting packages and 0.9 s moving its stages' 210 MB of outputs into the store (hashing, then `fsync`), with
every other stage waiting. In a thread of their own (hashing and file I/O release the GIL) they overlap the next
stages; the runner settles the node when its work is done, in its own thread, and a run ends only when all of it
has. One piece of work at a time in each: two would compete for the same disk. Small outputs are stored in the
runner's thread (`stored_beside`): their dependents then start at once.
"""

from __future__ import annotations

import concurrent.futures as futures
import os
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from trtflow.executors import StageResult

Payload = TypeVar("Payload")  # what the runner settles once the work is done (the node, its job or record)


# Outputs under this size are stored in the runner's thread: they take milliseconds, leave nothing to overlap, and
# their dependents then start at once instead of a turn of the loop later.
STORED_BESIDE_FROM = 1 << 20


def stored_beside(result: StageResult) -> bool:
    """Whether a finished stage's outputs are large enough to be stored in the storing thread (one that is missing
    or not a file is stored at once, where adding it says what is wrong)."""
    try:
        return sum(os.lstat(path).st_size for path in (result.files or {}).values()) >= STORED_BESIDE_FROM
    except OSError:
        return False


def run_here(work: Callable[[], Any]) -> futures.Future:
    """`work` run in this thread, its result (or what it raised) in a done future, as if run beside."""
    done: futures.Future = futures.Future()
    try:
        done.set_result(work())
    except Exception as exc:  # noqa: BLE001 - handed on as the thread's future would: its reader raises it
        done.set_exception(exc)
    return done


class Beside(Generic[Payload]):
    """Work running in a thread of its own (`name`), each piece with what the runner settles when it is done."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool: futures.ThreadPoolExecutor | None = None
        self.pending: dict[futures.Future, Payload] = {}

    def start(self, work: Callable[[], Any], payload: Payload) -> None:
        """Run `work` in the thread, after the work started before it."""
        if self._pool is None:
            self._pool = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self.pending[self._pool.submit(work)] = payload

    def take(self, future: futures.Future) -> Payload:
        """What a finished piece of work was for (it is no longer pending)."""
        return self.pending.pop(future)

    def close(self) -> None:
        """Wait for the work under way (an object or a folder is never left half placed), then stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
