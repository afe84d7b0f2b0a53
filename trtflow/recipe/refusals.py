"""Pairs a recipe asks for that cannot be built, known before any work, and the `exclude:` block that drops them.

A fleet project always has some: fp8 on a GPU older than Ada, fp32 GEMMs on Turing with TensorRT-RTX, int8 of a
model with no node ModelOpt quantizes. Loading and `trtflow validate` collect every refusal of every recipe and
print them at once, each with its file and line, then one ready-to-paste `exclude:` block per recipe (its existing
entries kept) so one edit settles them all:

    recipes/lstm.yaml:4: precisions[2]: fp8 needs compute capability >= 8.9, target rtx-turing is sm_75
    ...
    recipes/lstm.yaml: replace its exclude: with
    exclude:
      - {precision: fp8, target: rtx-turing}
      - {precision: int8}
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """One pair (or, with `target` None, every pair of a precision) that cannot be built, and why."""

    recipe: str  # the recipe file as shown (recipes/x.yaml)
    where: str  # `recipes/x.yaml:4: precisions[2]`
    precision: str
    target: str | None
    reason: str

    @property
    def line(self) -> str:
        """`recipes/x.yaml:4: precisions[2]: <reason>`."""
        return f"{self.where}: {self.reason}"


def exclude_entries(
    refusals: list[Refusal], existing: list[tuple[str | None, str | None]], targets: list[str]
) -> list[str]:
    """The `exclude:` entries of one recipe that keep what it excludes and drop every refused pair: a precision
    refused on every target it builds for becomes one `{precision: p}` entry."""
    pairs = list(dict.fromkeys(existing))
    for refusal in refusals:
        pairs.append((refusal.precision, refusal.target))
    refused_targets: dict[str, set[str | None]] = {}
    for precision, target in pairs:
        if precision is not None:
            refused_targets.setdefault(precision, set()).add(target)
    whole = {p for p, found in refused_targets.items() if None in found or set(targets) <= found}
    kept = [(p, None) if p in whole else (p, t) for p, t in pairs]
    return [_entry(p, t) for p, t in dict.fromkeys(kept)]


def _entry(precision: str | None, target: str | None) -> str:
    named = [f"precision: {precision}"] if precision is not None else []
    named += [f"target: {target}"] if target is not None else []
    return "{" + ", ".join(named) + "}"


def refusal_report(refusals: list[Refusal], blocks: dict[str, list[str]]) -> str:
    """Every refusal on its own line, then per recipe the `exclude:` block that drops them (ProjectError text); a
    single refusal is one line ending in the recipe's `exclude:` that drops it."""
    if len(refusals) == 1:
        [entries] = blocks.values()
        return f"{refusals[0].line}; to drop it: exclude: [{', '.join(entries)}]"
    lines = [f"{len(refusals)} pair(s) cannot be built; nothing was run:"] + [f"  {r.line}" for r in refusals]
    for recipe, entries in blocks.items():
        lines.append(f"{recipe}: to drop them, replace its exclude: (if any) with")
        lines += ["  exclude:"] + [f"    - {entry}" for entry in entries]
    return "\n".join(lines)
