"""Compute capabilities: one type for `sm_86`, parsed from `sm_86`, `sm86` or `8.6`, ordered by number.

>>> ComputeCapability.parse("8.6"), ComputeCapability.parse("sm_120") > "sm_89"
('sm_86', True)
"""

from __future__ import annotations

import re
from typing import Any

_FORM = re.compile(r"sm_?(\d)(\d+)|(\d+)\.(\d+)")


class ComputeCapability(str):
    """A canonical `sm_XY` string that compares by its number (sm_120 > sm_89), usable wherever a str is."""

    @classmethod
    def parse(cls, value: Any) -> ComputeCapability:
        """Accept `sm_86`, `sm86` or `8.6`; ValueError for anything else."""
        text = str(value).strip().lower()
        match = _FORM.fullmatch(text)
        if not match:
            raise ValueError(f"compute capability {value!r} is not of the form sm_86 or 8.6")
        major, minor = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
        return cls(f"sm_{int(major)}{int(minor)}")

    @property
    def number(self) -> int:
        """sm_89 -> 89, sm_120 -> 120."""
        return int(self[3:])

    @property
    def dotted(self) -> str:
        """sm_89 -> 8.9, sm_120 -> 12.0 (how NVIDIA's tables and nvidia-smi write it)."""
        return f"{self[3:-1]}.{self[-1]}"

    def _other(self, other: Any) -> int:
        return (other if isinstance(other, ComputeCapability) else ComputeCapability.parse(other)).number

    def __lt__(self, other: Any) -> bool:
        return self.number < self._other(other)

    def __le__(self, other: Any) -> bool:
        return self.number <= self._other(other)

    def __gt__(self, other: Any) -> bool:
        return self.number > self._other(other)

    def __ge__(self, other: Any) -> bool:
        return self.number >= self._other(other)

    __hash__ = str.__hash__

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """Validate with `parse` in pydantic models; serialize as the plain `sm_XY` string."""
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            cls.parse, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict:
        """What editors see: `sm_86` or `8.6`."""
        return {"type": "string", "pattern": r"^(sm_?\d+|\d+\.\d+)$", "examples": ["sm_86", "8.9"]}


def parse_ccs(values: Any) -> list[ComputeCapability]:
    """Canonical, sorted, distinct-checked compute capabilities (ValueError naming the problem)."""
    ccs = [ComputeCapability.parse(value) for value in values]
    if len(set(ccs)) != len(ccs):
        raise ValueError("compute capabilities must not repeat")
    return sorted(ccs)
