"""JSON that others may write (store records, remote envelopes, provenance, the lock) parsed within bounds.

As for recipes (recipe/yamlfile.py): a size limit before parsing, and a nesting limit, so 200,000 nested arrays
are a one-line refusal rather than a RecursionError. Types are checked by each reader's schema after this.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64  # as for YAML files; a stage record or a manifest nests about 8 levels


class BoundExceeded(ValueError):
    """The JSON is larger or nested deeper than its reader accepts (the message says which bound)."""


def loads_bounded(data: bytes | str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of `data`; ValueError saying which bound if it is over `max_bytes`, nested deeper than
    `max_depth`, or not JSON."""
    if len(data) > max_bytes:
        raise BoundExceeded(f"it is over {max_bytes} bytes")
    try:
        value = json.loads(data)
    except RecursionError:
        raise BoundExceeded(f"it is nested deeper than {max_depth} levels") from None
    if _depth(value) > max_depth:
        raise BoundExceeded(f"it is nested deeper than {max_depth} levels")
    return value


def _depth(value: Any) -> int:
    """How deep lists and objects nest in a parsed value (iteratively: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
