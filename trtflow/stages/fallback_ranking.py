"""How `fallback: auto` orders candidates and picks the fewest to keep: a ranking of groups, then of the nodes of the
groups kept, and the shortest prefix that passes (fallback.search runs it once per sensitivity measure).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Measure = Callable[[list[list[tuple[str, str]]]], list[float]]  # groups of (name, op) candidates -> sensitivities


@dataclass(frozen=True)
class Choice:
    """What one ranking chose: the candidates in the order they would be kept, how many of them meet the limits
    (None: not even all), each one's sensitivity, and the trial models its ranking took."""

    names: list[str]
    count: int | None
    sensitivity: dict[str, float]
    ranking_trials: int
    alone: bool


def choose(
    measure: Measure,
    groups: list[list[tuple[str, str]]],
    grouped: bool,
    alone: bool,
    passes: Callable[[list[str]], bool],
) -> Choice:
    """Groups ranked by `measure`; the fewest whole groups that pass; then the nodes of the groups kept (of the last
    one only when ranking by the error removed, where the groups before it are kept whole) ranked alone, and the
    fewest of them that pass."""
    ranked_groups = ranked(measure, groups)
    trials = 1 + len(ranked_groups)  # and the baseline the measure is taken against
    sensitivity = {name: value for value, group in ranked_groups for name, _ in group}
    order = [group for _, group in ranked_groups]
    names, count = names_of(order), None
    whole = shortest_passing_prefix(len(order), lambda n: passes(names_of(order[:n])))
    if whole is not None:
        base = [] if alone else names_of(order[: whole - 1])
        inner = names_of(order[:whole])[len(base) :]
        refined = grouped and len(inner) > 1
        if refined:
            ranked_nodes = ranked(measure, [[c] for group in order[:whole] for c in group if c[0] not in base])
            trials += len(ranked_nodes)
            sensitivity.update({group[0][0]: value for value, group in ranked_nodes})
            inner = [group[0][0] for _, group in ranked_nodes]
        names = base + inner + names_of(order[whole:])
        within = shortest_passing_prefix(len(inner), lambda n: passes(base + inner[:n])) if refined else None
        count = len(base) + (within or len(inner))
    return Choice(names, count, sensitivity, trials, alone)


def ranked(measure: Measure, groups: list[list[tuple[str, str]]]) -> list[tuple[float, list[tuple[str, str]]]]:
    """(sensitivity, group) of each group, most sensitive first (ties by the first node's name)."""
    measured = measure(groups)
    rows = [(_rounded(value), group) for group, value in zip(groups, measured, strict=True)]
    return sorted(rows, key=lambda row: (-row[0], row[1][0][0]))


def names_of(groups: list[list[tuple[str, str]]]) -> list[str]:
    """The candidates' names, group after group."""
    return [name for group in groups for name, _ in group]


def shortest_passing_prefix(total: int, passes: Callable[[int], bool]) -> int | None:
    """The smallest count in 1..total for which `passes` holds, assuming that more never hurts: doubling to a passing
    count, then bisecting below it; None if even all of them do not pass."""
    if total == 0:
        return None
    low, high = 0, 1
    while not passes(high):
        if high == total:
            return None
        low, high = high, min(high * 2, total)
    while high - low > 1:
        middle = (low + high) // 2
        if passes(middle):
            high = middle
        else:
            low = middle
    return high


def _rounded(value: float) -> float:
    return float(f"{value:.6g}")
