"""The Markdown summary of a run, for a CI job summary ($GITHUB_STEP_SUMMARY): counts, failures, engines, fleet.

GitHub keeps at most 1 MiB of summary per step; every list here is cut at a fixed number of rows (the HTML report
has them all), so a project of any size stays a few KiB.
"""

from __future__ import annotations

from trtflow.report.record import engines_not_run, totals
from trtflow.stages.base import NodeId
from trtflow.util.text import clipped, markdown_text

MAX_ROWS = 25


def render(record: dict) -> str:
    """The summary: one line of totals, then failures, engines with their accuracy, and what each GPU gets."""
    t = totals(record)
    lines = [
        f"## trtflow run: {_cell(record.get('project', ''))}",
        "",
        f"**{t['stages']} stages**: {t['built']} built, {t['cached']} cached, {t['failed']} failed "
        f"({t['failed_cached']} recorded before), "
        f"{t['skipped']} skipped; {record['seconds']:.1f} s at -j {record['jobs']}; the cache saved "
        f"{t['cache_saved_seconds']:.1f} s "
        f"of {t['cold_seconds']:.1f} s cold."
        + (f" Finished {_cell(record['finished_at'])}." if record.get("finished_at") else ""),
        "",
        *_not_run(record),
    ]
    lines += _failures(record) + _engines(record) + _fleet(record)
    lines += ["The full report (DAG, timeline, accuracy charts) is `report.html` in the run's artifacts."]
    return "\n".join(lines) + "\n"


def _not_run(record: dict) -> list[str]:
    """A line saying how many engines were not executed and why (verification then checked models and engine I/O)."""
    engines, not_run, reason = engines_not_run(record)
    if not not_run:
        return []
    return [f"**{not_run} of {engines} engines were not executed**: {_cell(reason)}.", ""]


def _cell(text: object, limit: int = 300) -> str:
    """Text from a model, a recipe, a path or a run.json as literal Markdown: one line, at most `limit` characters,
    Markdown and HTML escaped (a cell never holds a link, an element or a pipe)."""
    return markdown_text(clipped(" ".join(str(text).split()), limit))


def _cut(rows: list[str], what: str) -> list[str]:
    """At most MAX_ROWS rows and a line saying how many more the HTML report has."""
    extra = [f"| ... and {len(rows) - MAX_ROWS} more {what} (see report.html) |"] if len(rows) > MAX_ROWS else []
    return rows[:MAX_ROWS] + extra


def _failures(record: dict) -> list[str]:
    failed = [n for n in record["nodes"] if n["status"] == "failed"]
    if not failed:
        return []
    rows = [
        f"| {_cell(n['id'])} | {'recorded before' if n['failure_cached'] else 'now'} | {_cell(n['reason'])} |"
        for n in failed
    ]
    return ["### Failures", "", "| stage | failed | reason |", "|---|---|---|", *_cut(rows, "failures"), ""]


def _engines(record: dict) -> list[str]:
    seconds = {n["id"]: n["seconds"] if n["seconds"] is not None else n["recorded_seconds"] for n in record["nodes"]}
    cosine = {(row["recipe"], row["precision"]): _min_cosine(row) for row in record.get("accuracy", [])}
    rows = []
    for recipe, manifest in sorted(record.get("packages", {}).items()):
        for e in manifest.get("engines", []):
            built = seconds.get(NodeId.of("build", recipe, e["precision"], e["target"]))
            rows.append(
                f"| {_cell(recipe)} | {_cell(e['precision'])} | {_cell(e['target'])} "
                f"({_cell(', '.join(e['compute_capabilities']))}) | "
                f"{e['size'] / 2**10:.1f} KiB | {'n/a' if built is None else f'{built:.2f}'} | "
                f"{cosine.get((recipe, e['precision']), 'fp32')} |"
            )
    if not rows:
        return []
    return [
        "### Engines",
        "",
        "| recipe | precision | target | size | build s | min cosine vs fp32 |",
        "|---|---|---|---:|---:|---:|",
        *_cut(rows, "engines"),
        "",
    ]


def _min_cosine(row: dict) -> str:
    values = [
        o["cosine_similarity"]
        for o in (row.get("accuracy") or {}).get("outputs", [])
        if o.get("cosine_similarity") is not None
    ]
    return "failed" if row.get("failure") is not None else (f"{min(values):.8f}" if values else "n/a")


def _fleet(record: dict) -> list[str]:
    rows = [
        f"| {_cell(gpu['compute_capability'])} | {_cell(recipe)} | {_choice(choice)} |"
        for gpu in record.get("fleet", [])
        for recipe, choice in gpu["recipes"].items()
    ]
    if not rows:
        return []
    return [
        "### What each GPU gets (`trtflow provision`)",
        "",
        "| GPU | recipe | engine |",
        "|---|---|---|",
        *_cut(rows, "choices"),
        "",
    ]


def _choice(choice: dict) -> str:
    extra: str | None = f"; {len(choice['failed'])} failed to build" if choice.get("failed") else ""
    if "error" in choice:
        return f"none: {_cell(choice['error'], 200)}{extra}"
    return f"{_cell(choice['chosen'])} ({_cell(choice['reason'])}){extra}"
