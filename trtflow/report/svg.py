"""Inline SVG drawn in Python: the DAG by recipe, the timeline per job slot, accuracy bars and composition bars.

Why SVG drawn here rather than a charting library in the page: the report must open with no network and fast at
thousands of stages. A trtflow DAG needs no general graph layout: every recipe is the same chain of stage kinds,
so a column per kind and a row block per recipe is the layout (what Mermaid/ELK would compute, in microseconds).
The page carries no script at all, so a browser has nothing to run: 1000 stages open in well under a second.
"""

from __future__ import annotations

import math
from html import escape

KINDS = ("export", "cleanup", "precision", "build", "verify", "package")
COLUMN, ROW, BOX_W, BOX_H, HEADER = 150, 22, 128, 17, 18
KIND_COLOURS = {
    "export": "#8c6bb1",
    "cleanup": "#6baed6",
    "precision": "#fd8d3c",
    "build": "#31a354",
    "verify": "#9e9ac8",
    "package": "#636363",
}


def status_class(node: dict) -> str:
    """The CSS class of a node's status: built, cached, failed, failed-cached, skipped."""
    if node["status"] == "failed" and node.get("failure_cached"):
        return "failed-cached"
    return node["status"] if node["status"] in ("built", "cached", "failed", "skipped") else "other"


def _short(node: dict) -> str:
    """`fp16/rtx-ada` for build:tiny/fp16/rtx-ada, the kind for cleanup:tiny."""
    rest = node["id"].split(":", 1)[-1]
    return rest.split("/", 1)[1] if "/" in rest else node["kind"]


def _tooltip(node: dict) -> str:
    seconds = f", {node['seconds']:.2f} s" if node.get("seconds") is not None else ""
    lines = [f"{node['id']}: {status_class(node)}{seconds}", node.get("reason") or "", *node.get("changes", [])[1:]]
    return escape("\n".join(line for line in lines if line))


def dag_svg(nodes: list[dict]) -> str:
    """The DAG: one block per recipe, one column per stage kind, nodes coloured by status, edges from each input."""
    places: dict[str, tuple[float, float]] = {}
    parts, y = [], 0.0
    for recipe in sorted({n["recipe"] for n in nodes}):
        block, height = _recipe_block([n for n in nodes if n["recipe"] == recipe], y, places)
        parts.append(f'<text class="recipe" x="4" y="{y + 13:.0f}">{escape(recipe)}</text>' + block)
        y += height
    edges = "".join(
        _edge(places[d], places[n["id"]]) for n in nodes for d in n.get("deps", []) if d in places and n["id"] in places
    )
    heads = "".join(f'<text class="kind" x="{i * COLUMN + 4}" y="12">{k}</text>' for i, k in enumerate(KINDS))
    width = len(KINDS) * COLUMN
    return (
        f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + HEADER:.0f}" viewBox="0 0 '
        f'{width} {y + HEADER:.0f}">'
        f'{heads}<g transform="translate(0,{HEADER})"><g class="edges">{edges}</g>{"".join(parts)}</g></svg>'
    )


def _recipe_block(nodes: list[dict], top: float, places: dict[str, tuple[float, float]]) -> tuple[str, float]:
    """One recipe's nodes in their kinds' columns from `top`; returns the SVG and the block's height."""
    columns: dict[int, list[dict]] = {}
    for node in sorted(nodes, key=lambda n: n["id"]):
        columns.setdefault(KINDS.index(node["kind"]) if node["kind"] in KINDS else len(KINDS) - 1, []).append(node)
    parts = []
    for column, members in columns.items():
        for row, node in enumerate(members):
            x, y = column * COLUMN + 4, top + HEADER + row * ROW
            places[node["id"]] = (x, y)
            parts.append(
                f'<g class="node {status_class(node)}" data-id="{escape(node["id"])}"><title>{_tooltip(node)}</title>'
                f'<rect x="{x}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="3"/>'
                f'<text x="{x + 5}" y="{y + 12:.0f}">{escape(_short(node)[:22])}</text></g>'
            )
    rows = max(len(members) for members in columns.values())
    return "".join(parts), HEADER + rows * ROW + 8


def _edge(start: tuple[float, float], end: tuple[float, float]) -> str:
    x1, y1 = start[0] + BOX_W, start[1] + BOX_H / 2
    x2, y2 = end[0], end[1] + BOX_H / 2
    middle = (x1 + x2) / 2
    return f'<path d="M{x1:.0f},{y1:.0f} C{middle:.0f},{y1:.0f} {middle:.0f},{y2:.0f} {x2:.0f},{y2:.0f}"/>'


def critical_path(nodes: list[dict]) -> list[str]:
    """The chain that decided the run's length: from the last stage to end, back through the input that ended last."""
    timed = {n["id"]: n for n in nodes if n.get("end") is not None}
    if not timed:
        return []
    chain = [max(timed.values(), key=lambda n: n["end"])]
    while True:
        inputs = [timed[d] for d in chain[-1].get("deps", []) if d in timed and timed[d] not in chain]
        if not inputs:
            return [n["id"] for n in reversed(chain)]
        chain.append(max(inputs, key=lambda n: n["end"]))


def gantt_svg(nodes: list[dict], jobs: int, width: int = 960) -> str:
    """The timeline: one row per job slot, a bar per stage that ran (coloured by kind), the critical path outlined."""
    timed = [n for n in nodes if n.get("start") is not None and n.get("end") is not None]
    slots = max([jobs, *[(n.get("slot") or 0) + 1 for n in timed]])
    span = max([n["end"] for n in timed], default=0.0) or 1.0
    scale, left, row = (width - 70) / span, 60, 26
    critical = set(critical_path(nodes))
    bars = [
        _bar(
            n,
            left + n["start"] * scale,
            max(n["end"] - n["start"], 0.0) * scale,
            24 + (n.get("slot") or 0) * row,
            n["id"] in critical,
        )
        for n in timed
    ]
    lanes = "".join(f'<text class="lane" x="2" y="{24 + i * row + 15}">slot {i + 1}</text>' for i in range(slots))
    height = 24 + slots * row + 6
    return (
        f'<svg class="gantt" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 '
        f'{width} {height}">'
        f"{_axis(span, scale, left, height)}{lanes}{''.join(bars)}</svg>"
    )


def _bar(node: dict, x: float, w: float, y: float, critical: bool) -> str:
    rss = f", peak RSS {node['peak_rss'] / 2**20:.0f} MiB" if node.get("peak_rss") else ", peak RSS not measured"
    title = escape(
        f"{node['id']}: {node['end'] - node['start']:.2f} s from {node['start']:.2f} s{rss}"
        + (" (critical path)" if critical else "")
    )
    classes = "bar" + (" critical" if critical else "") + (" failed" if node["status"] == "failed" else "")
    return (
        f'<g class="{classes}" data-id="{escape(node["id"])}"><title>{title}</title><rect x="{x:.1f}" y="{y}" '
        f'width="{max(w, 1.0):.1f}" '
        f'height="20" fill="{KIND_COLOURS.get(node["kind"], "#999")}"/></g>'
    )


def _axis(span: float, scale: float, left: int, height: int) -> str:
    """Ticks every 1, 2 or 5 x 10^k seconds, about ten of them."""
    raw = span / 10
    step = (
        min((m * 10 ** math.floor(math.log10(raw)) for m in (1, 2, 5, 10)), key=lambda s: abs(s - raw))
        if raw > 0
        else 1.0
    )
    ticks, t = [], 0.0
    while t <= span + 1e-9:
        x = left + t * scale
        ticks.append(
            f'<line class="tick" x1="{x:.1f}" y1="14" x2="{x:.1f}" y2="{height}"/><text class="tick" x="{x + 2:.1f}" '
            f'y="11">{t:g} s</text>'
        )
        t += step
    return "".join(ticks)


def log_bars_svg(
    rows: list[tuple[str, float | None, float | None, bool]], unit: str, floor: float = 1e-9, width: int = 560
) -> str:
    """Horizontal bars on a log scale from `floor` to 1: (label, value, limit, passed); the limit as a red tick."""
    label_w, row = 200, 20
    scale = (width - label_w - 10) / -math.log10(floor)

    def x(value: float) -> float:
        return label_w + (math.log10(max(value, floor)) - math.log10(floor)) * scale

    parts = []
    for i, (label, value, limit, passed) in enumerate(rows):
        y = 18 + i * row
        parts.append(f'<text class="label" x="0" y="{y + 12}">{escape(label[:32])}</text>')
        if value is not None:
            parts.append(
                f'<g class="acc {"pass" if passed else "fail"}"><title>{escape(f"{label}: {unit} {value:.3g}")}</title>'
                f'<rect x="{label_w}" y="{y}" width="{x(value) - label_w:.1f}" height="14"/></g>'
            )
        if limit is not None:
            parts.append(
                f'<line class="limit" x1="{x(limit):.1f}" y1="{y - 2}" x2="{x(limit):.1f}" y2="{y + 16}"><title>limit '
                f"{limit:.3g}</title></line>"
            )
    ticks = "".join(
        f'<text class="tick" x="{x(10.0**e):.0f}" y="11">1e{e}</text>' for e in range(int(math.log10(floor)), 1, 2)
    )
    height = 22 + len(rows) * row
    return (
        f'<svg class="bars" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}">{ticks}{"".join(parts)}</svg>'
    )


def share_bar_svg(shares: dict[str, int], width: int = 320) -> str:
    """One stacked bar: each dtype's share of the total (weight bytes), labelled with its percentage."""
    total = sum(shares.values()) or 1
    parts, x = [], 0.0
    colours = {
        "float32": "#3182bd",
        "float16": "#fd8d3c",
        "bfloat16": "#e6550d",
        "int8": "#31a354",
        "float8e4m3fn": "#756bb1",
    }
    for dtype, count in sorted(shares.items()):
        w = count / total * width
        parts.append(
            f'<g><title>{escape(f"{dtype}: {count / total:.1%}")}</title><rect x="{x:.1f}" y="0" width="{w:.1f}" '
            'height="16" '
            f'fill="{colours.get(dtype, "#999")}"/>{_share_label(dtype, count / total, x, w)}</g>'
        )
        x += w
    return f'<svg class="share" xmlns="http://www.w3.org/2000/svg" width="{width}" height="16">{"".join(parts)}</svg>'


def _share_label(dtype: str, share: float, x: float, w: float) -> str:
    return f'<text x="{x + 3:.1f}" y="12">{escape(dtype)} {share:.0%}</text>' if w > 70 else ""
