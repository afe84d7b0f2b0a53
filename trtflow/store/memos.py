"""What the store remembers in its throwaway cache (store/cache.py) to keep a no-op cheap: each node's last
resolution (for `plan --explain`), its last peak memory (the scheduler), the lock it saw."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

from trtflow.errors import InternalError
from trtflow.hashing import FileDigests

if TYPE_CHECKING:
    from trtflow.store.cache import Cache


class MemoryView(MutableMapping[str, Any]):
    """One prefix of the cache as a mapping of JSON objects (FileDigests' memory); anything else reads as absent."""

    def __init__(self, cache: Cache, prefix: str):
        self._cache, self._prefix = cache, prefix

    def __getitem__(self, name: str) -> Any:
        value = self._cache.get(self._prefix + name)
        if not isinstance(value, dict):
            raise KeyError(name)
        return value

    def __setitem__(self, name: str, value: Any) -> None:
        self._cache.set(self._prefix + name, value)

    def __delitem__(self, name: str) -> None:
        self._cache.delete(self._prefix + name)

    def __iter__(self) -> Iterator[str]:
        raise InternalError("the cache is not iterated through a view")

    def __len__(self) -> int:
        raise InternalError("the cache is not counted through a view")


class CacheMemos:
    """What one store remembers in its throwaway cache: each node's last resolution and peak memory, what a lock file
    held, and the input files' signatures (file_digests)."""

    def __init__(self, cache: Cache):
        self._cache = cache
        self._stat = MemoryView(cache, "stat:")

    def last_run(self, node_id: str) -> dict | None:
        """What the node resolved to the last time it ran or was found cached (for `plan --explain`)."""
        value = self._cache.get("node:" + node_id)
        return value if isinstance(value, dict) else None

    def set_last_run(self, node_id: str, value: dict) -> None:
        """Remember what the node resolved to (for `plan --explain`); writes nothing if it is unchanged."""
        if self.last_run(node_id) != value:
            self._cache.set("node:" + node_id, value)

    def remembered_peak(self, node_id: str) -> int | None:
        """The peak RSS (bytes) the node's stage reached the last time it ran, if known (the memory-aware scheduler)."""
        value = self._cache.get("peak:" + node_id)
        return value if isinstance(value, int) and value > 0 else None

    def remember_peak(self, node_id: str, peak: int | None) -> None:
        """Remember the node's measured peak RSS for the next run's scheduling (writes only on change)."""
        if peak and self.remembered_peak(node_id) != peak:
            self._cache.set("peak:" + node_id, int(peak))

    def remembered_lock(self, path: str) -> list | None:
        """[file signature, entries digest] of the lock at `path` as this store last wrote or read it; None if
        unknown."""
        value = self._cache.get("lock:" + path)
        return value if isinstance(value, list) else None

    def remember_lock(self, path: str, signature: list[int] | None, digest: str) -> None:
        """Remember what the lock at `path` holds, so an unchanged lock is not read again (writes only on change)."""
        if signature is not None and self.remembered_lock(path) != [signature, digest]:
            self._cache.set("lock:" + path, [signature, digest])

    def file_digests(self) -> FileDigests:
        """A FileDigests whose stat cache lives in the cache, so unchanged inputs are not re-hashed on the next run."""
        return FileDigests(self._stat)
