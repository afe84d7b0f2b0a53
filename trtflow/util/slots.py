"""Slot folders: each worker server or fresh worker process runs in a folder of its own that no other worker of
any run on this machine uses meanwhile (`/tmp/trtflow-<pool>-<uid>/<n>`), locked while used and emptied when taken
again, so what a killed run left in one goes with its next use, never piling up in /tmp.

Import-light (the standard library and filelock): a run's first server takes its slot before the run imports
anything heavy (util.early_server).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from trtflow.errors import EnvironmentProblem
from trtflow.util.fs import NotRegular, check_private

HERMETIC_SLOTS = "hermetic"  # hermetic workers and build servers (executors.hermetic)
PLAIN_SLOTS = "servers"  # plain servers' folders (executors.forking)
SHARED_SLOTS = "shared"  # the folders a run's model tools' servers share (stages.shared_outputs)


@contextlib.contextmanager
def free_slot(pool: str = HERMETIC_SLOTS) -> Iterator[Path]:
    """An empty slot folder of `pool` no other worker uses meanwhile, emptied and unlocked when the block ends."""
    from filelock import FileLock, Timeout

    root = Path("/tmp") / f"trtflow-{pool}-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    try:
        check_private(root)
    except NotRegular:
        raise EnvironmentProblem(
            f"{root} is not a private (0700) folder of this user's: remove it (trtflow's workers run there)"
        ) from None
    for number in itertools.count():
        lock = FileLock(str(root / f"{number}.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        slot = root / str(number)
        try:
            shutil.rmtree(slot, ignore_errors=True)
            slot.mkdir(mode=0o700)
            yield slot
        finally:
            shutil.rmtree(slot, ignore_errors=True)
            lock.release()
        return
