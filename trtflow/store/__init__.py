"""The store: content-addressed objects and the stage records (objects), a throwaway cache (cache), per-key and run
locks (locks), the project's lock file (lockfile), a remote cache (remote, imports fsspec only when used), and
listing, verifying and collecting garbage (housekeeping).

A leaf: it imports nothing above it (errors, hashing, util).
"""

from trtflow.errors import ObjectMismatch, StoreWriteError
from trtflow.store.layout import WRITE_ERRNOS, write_failure
from trtflow.store.runs import RUN_HISTORY
from trtflow.store.store import Store

__all__ = ["RUN_HISTORY", "WRITE_ERRNOS", "ObjectMismatch", "Store", "StoreWriteError", "write_failure"]
