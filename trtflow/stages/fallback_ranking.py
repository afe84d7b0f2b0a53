"""How `fallback: auto` orders candidates and picks the fewest to keep: a ranking of groups, then of the nodes of the
groups kept, and the shortest prefix that passes (fallback.search runs it once per sensitivity measure).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# groups of (name, op) candidates -> each one's sensitivity, then what orders equal ones
Measure = Callable[[list[list[tuple[str, str]]]], list[tuple[float, float]]]


@dataclass(frozen=True)
class Choice:
    """What one ranking chose: the candidates in the order they would be kept, how many of them meet the limits
    (None: not even all, or none within the share allowed), and each one's sensitivity."""

    names: list[str]
    count: int | None
    sensitivity: dict[str, float]
    alone: bool


def choose(
    measure: Measure,
    groups: list[list[tuple[str, str]]],
    grouped: bool,
    alone: bool,
    passes: Callable[[list[str]], bool],
    allowed: Callable[[list[str]], bool] | None = None,
) -> Choice:
    """Groups ranked by `measure` (`alone`: what measured them, recorded); the fewest whole groups that pass; then,
    where they are `grouped`, the nodes of the last of them ranked alone, and the fewest of them that pass beside the
    groups before. With `allowed` (whether keeping those names leaves enough in the precision), no more nodes than it
    allows are tried, and no more whole groups before the last than it allows: the trials that could only find a keep
    it refuses are not run."""
    ranked_groups = ranked(measure, groups)
    sensitivity = {name: value for value, group in ranked_groups for name, _ in group}
    order = [group for _, group in ranked_groups]
    names, count = names_of(order), None
    whole = shortest_passing_prefix(len(order), lambda n: passes(names_of(order[:n])), _cap(order, grouped, allowed))
    if whole is not None:
        base = names_of(order[: whole - 1])
        inner = names_of(order[:whole])[len(base) :]
        refined = grouped and len(inner) > 1
        if refined:
            ranked_nodes = ranked(measure, [[c] for group in order[:whole] for c in group if c[0] not in base])
            sensitivity.update({group[0][0]: value for value, group in ranked_nodes})
            inner = [group[0][0] for _, group in ranked_nodes]
        names = base + inner + names_of(order[whole:])
        cap = _most(len(inner), lambda n: base + inner[:n], allowed) if refined else None
        within = shortest_passing_prefix(len(inner), lambda n: passes(base + inner[:n]), cap) if refined else None
        count = len(base) + (within or len(inner))
    return Choice(names, count, sensitivity, alone)


def _cap(order: list[list[tuple[str, str]]], grouped: bool, allowed: Callable[[list[str]], bool] | None) -> int | None:
    """How many of the ranked groups are worth trying: ungrouped (each a node), as many as allowed; groups, one more
    than allowed (the ones before the last stay whole, of the last only some nodes may be kept)."""
    most = _most(len(order), lambda n: names_of(order[:n]), allowed)
    return most if most is None or not grouped else most + 1


def _most(total: int, prefix: Callable[[int], list[str]], allowed: Callable[[list[str]], bool] | None) -> int | None:
    """The largest count in 0..total whose prefix `allowed` allows (keeping more never leaves more in the
    precision: bisected); None without `allowed`."""
    if allowed is None:
        return None
    low, high = 0, total  # allowed(prefix(low)) holds, or low is 0
    while low < high:
        middle = (low + high + 1) // 2
        if allowed(prefix(middle)):
            low = middle
        else:
            high = middle - 1
    return low


def ranked(measure: Measure, groups: list[list[tuple[str, str]]]) -> list[tuple[float, list[tuple[str, str]]]]:
    """(sensitivity, group) of each group, most sensitive first (equal ones by what orders them, then by the first
    node's name)."""
    measured = [(_rounded(first), _rounded(then)) for first, then in measure(groups)]
    rows = sorted(zip(measured, groups, strict=True), key=lambda row: (-row[0][0], -row[0][1], row[1][0][0]))
    return [(value, group) for (value, _), group in rows]


def remembered(measure: Measure, counted: Callable[[int], None]) -> Measure:
    """`measure`, each unit measured once (asked again, its value is read back); `counted(n)` hears how many units
    each call measured."""
    seen: dict[tuple[str, ...], tuple[float, float]] = {}

    def again(units: list[list[tuple[str, str]]]) -> list[tuple[float, float]]:
        keys = [tuple(names_of([unit])) for unit in units]
        new = {key: unit for key, unit in zip(keys, units, strict=True) if key not in seen}
        seen.update(zip(new, measure(list(new.values())) if new else [], strict=True))
        counted(len(new))
        return [seen[key] for key in keys]

    return again


def names_of(groups: list[list[tuple[str, str]]]) -> list[str]:
    """The candidates' names, group after group."""
    return [name for group in groups for name, _ in group]


def shortest_passing_prefix(total: int, passes: Callable[[int], bool], cap: int | None = None) -> int | None:
    """The smallest count in 1..total for which `passes` holds: doubling to a passing count, then bisecting below it
    (assuming more passes once a count does); None if even all of them do not pass. With `cap`, counts above it are
    not tried: the doubling stops there. The cap is not tried first, which would take a miss there for a miss at
    every smaller count: on near-tied rows keeping more can flip one more (MobileNetV3-small's int8, ranked by the
    error added alone: the 21 nodes allowed missed top-1, the 4 most sensitive met it)."""
    limit = total if cap is None else min(cap, total)
    if limit == 0:
        return None
    known: dict[int, bool] = {}

    def holds(count: int) -> bool:
        if count not in known:
            known[count] = passes(count)
        return known[count]

    low, high = 0, 1
    while not holds(high):
        if high == limit:
            return None
        low, high = high, min(high * 2, limit)
    while high - low > 1:
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle
    return high


def _rounded(value: float) -> float:
    return float(f"{value:.6g}")
