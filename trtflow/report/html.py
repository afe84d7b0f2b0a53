"""The HTML report: one self-contained file (styles inline, charts as inline SVG, no script) drawn from a run record.

Its Content-Security-Policy forbids every fetch (`default-src 'none'`), so opening it never touches the network
and a resource that slipped in would show as a console error instead of loading.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from trtflow.report import svg
from trtflow.report.record import composition_line, engines_not_run, fallback_line, totals
from trtflow.stages.base import NodeId

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}h1{font-size:22px}
h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f4f4f4}
.num{text-align:right}.scroll{overflow:auto;max-height:720px;border:1px solid #eee}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;border-radius:3px}
svg text{font:11px system-ui,sans-serif}svg .recipe{font-weight:bold}svg .kind{fill:#666}
.edges path{fill:none;stroke:#bbb}
.node rect{stroke:#555;stroke-width:.6}.built rect,span.built{fill:#74c476;background:#74c476}
.cached rect,span.cached{fill:#d9d9d9;background:#d9d9d9}
.failed rect,span.failed{fill:#ef3b2c;background:#ef3b2c;color:#fff}
.failed-cached rect,span.failed-cached{fill:#a50f15;background:#a50f15;color:#fff}
.skipped rect,span.skipped{fill:#fff7bc;background:#fff7bc;stroke-dasharray:3 2}
.failed text,.failed-cached text{fill:#fff}
.bar.critical rect{stroke:#000;stroke-width:2}.bar.failed rect{stroke:#ef3b2c;stroke-width:2}line.tick{stroke:#eee}
text.tick{fill:#888}
.acc.pass rect{fill:#74c476}.acc.fail rect{fill:#ef3b2c}line.limit{stroke:#a50f15;stroke-width:2}.pass{color:#006d2c}
.fail{color:#a50f15;font-weight:bold}
.stat{display:inline-block;margin-right:22px}.stat b{font-size:20px;display:block}
"""


def render(record: dict) -> str:
    """The whole page for one run record."""
    sections = [_summary(record), _dag(record), _timeline(record), _accuracy(record), _engines(record), _fleet(record)]
    title = f"trtflow run report: {escape(record.get('project', ''))}"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" '
        f'content="{CSP}">'
        f'<meta name="viewport" content="width=device-width"><title>{title}</title><style>{STYLE}</style></head>'
        f"<body><h1>{title}</h1>{''.join(sections)}</body></html>\n"
    )


def _table(head: list[str], rows: list[list[str]], numeric: tuple[int, ...] = ()) -> str:
    """A table; cells are HTML already (escape them first), columns in `numeric` right-aligned."""
    top = "".join(f"<th>{h}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if i in numeric else ''}>{c}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{top}</tr></thead><tbody>{body}</tbody></table>"


def _stat(label: str, value: str) -> str:
    return f'<div class="stat"><b>{value}</b>{escape(label)}</div>'


def _not_run_stat(record: dict) -> list[str]:
    """`12 of 12 engines not executed (no GPU: ...)`, when some were not."""
    engines, not_run, reason = engines_not_run(record)
    return [_stat(f"of {engines} engines not executed: {reason}", str(not_run))] if not_run else []


def _summary(record: dict) -> str:
    """Counts, wall time, stage time, and what the cache saved (cold = this run's stage time + the cached stages'
    own)."""
    t = totals(record)
    stats = [
        _stat("stages", str(t["stages"])),
        _stat("built", str(t["built"])),
        _stat("cached", str(t["cached"])),
        _stat(f"failed ({t['failed_cached']} recorded before)", str(t["failed"])),
        _stat("skipped", str(t["skipped"])),
        _stat(f"wall seconds at -j {record['jobs']}", f"{record['seconds']:.1f}"),
        *_not_run_stat(record),
        _stat("stage seconds this run", f"{t['stage_seconds']:.1f}"),
        _stat("stage seconds cold (nothing cached)", f"{t['cold_seconds']:.1f}"),
        _stat("seconds the cache saved", f"{t['cache_saved_seconds']:.1f}"),
    ]
    return (
        f'<section id="summary"><p>trtflow {escape(record["trtflow_version"])}, finished '
        f"{escape(record.get('finished_at') or '(time not recorded)')}</p>"
        f"{''.join(stats)}</section>"
    )


def _dag(record: dict) -> str:
    """The DAG coloured by status, then every stage that did not come from the cache with its reason."""
    legend = "".join(f'<span class="{c}">{c}</span>' for c in ("built", "cached", "failed", "failed-cached", "skipped"))
    shown = [n for n in record["nodes"] if n["status"] != "cached"]
    rows = [
        [
            f'<span class="{svg.status_class(n)}">{svg.status_class(n)}</span>',
            escape(n["id"]),
            escape(n["reason"] or "") + "".join(f"<br>also: {escape(c)}" for c in n["changes"][1:]),
        ]
        for n in shown
    ]
    table = _table(["status", "stage", "why (plan --explain)"], rows) if rows else "<p>every stage was cached</p>"
    return (
        f'<section id="dag"><h2>Pipeline DAG</h2><p class="legend">{legend}</p><div '
        f'class="scroll">{svg.dag_svg(record["nodes"])}</div>'
        f"<details{' open' if len(rows) <= 40 else ''}><summary>{len(rows)} stage(s) not from the cache, and "
        f"why</summary>{table}</details></section>"
    )


def _timeline(record: dict) -> str:
    """The Gantt chart per job slot, the critical path, and stage seconds and peak memory per kind."""
    nodes = record["nodes"]
    path = svg.critical_path(nodes)
    kinds: dict[str, list[dict]] = {}
    for n in nodes:
        if n.get("end") is not None:
            kinds.setdefault(n["kind"], []).append(n)
    rows = [
        [escape(k), str(len(ns)), f"{sum(n['end'] - n['start'] for n in ns):.2f}", _peak(ns)]
        for k, ns in sorted(kinds.items())
    ]
    legend = "".join(f'<span style="background:{c};color:#fff">{k}</span>' for k, c in svg.KIND_COLOURS.items())
    return (
        f'<section id="timeline"><h2>Timeline (-j {record["jobs"]})</h2><p '
        f'class="legend">{legend}</p>{svg.gantt_svg(nodes, record["jobs"])}'
        f"<p>critical path ({len(path)} stages): {escape(' -> '.join(path[:12]))}{' ...' if len(path) > 12 else ''}</p>"
        f"{_table(['stage kind', 'ran', 'seconds', 'peak RSS of the worker'], rows, (1, 2, 3))}</section>"
    )


def _peak(nodes: list[dict]) -> str:
    peaks = [n["peak_rss"] for n in nodes if n.get("peak_rss")]
    return f"{max(peaks) / 2**20:.0f} MiB" if peaks else "not measured"


def _accuracy(record: dict) -> str:
    """Per recipe and reduced precision: accuracy vs fp32 against the recipe's limits, and what the model is made of."""
    rows = record.get("accuracy", [])
    if not rows:
        return (
            '<section id="accuracy"><h2>Accuracy</h2><p>no reduced precision in this run: every engine is fp32, the '
            "cleaned model itself</p></section>"
        )
    cosine, error, table = [], [], []
    for row in rows:
        for out in (row.get("accuracy") or {}).get("outputs", []):
            label, limits = f"{row['recipe']} {row['precision']} {out['name']}", row["accuracy"]["tolerance"]
            cos = out.get("cosine_similarity")
            cosine.append(
                (
                    label,
                    None if cos is None else max(1.0 - cos, 0.0),
                    _one_minus(limits.get("min_cosine")),
                    out["passed"],
                )
            )
            error.append((label, out.get("max_abs_error"), limits.get("max_abs_error"), out["passed"]))
        table.append(_accuracy_row(row))
    head = [
        "recipe",
        "precision",
        "verdict",
        "min cosine",
        "max abs error",
        "top-1 agreement",
        "limits",
        "weights by type",
        "nodes by type",
    ]
    charts = (
        (
            f"<h3>1 - cosine similarity (log; red tick: the limit)</h3>{svg.log_bars_svg(cosine, '1 - cosine')}"
            f"<h3>max abs error (log; red tick: the limit)</h3>{svg.log_bars_svg(error, 'max abs error', floor=1e-7)}"
        )
        if cosine
        else ""
    )
    return f'<section id="accuracy"><h2>Accuracy vs fp32 and composition</h2>{_table(head, table)}{charts}</section>'


def _one_minus(value: float | None) -> float | None:
    return None if value is None else max(1.0 - value, 0.0)


def _accuracy_row(row: dict) -> list[str]:
    verdict = '<span class="pass">passed</span>' if row["passed"] else '<span class="fail">failed</span>'
    if row.get("failure") is not None:
        return [
            escape(row["recipe"]),
            escape(row["precision"]),
            verdict,
            f'<span class="fail">{escape(row["failure"])}</span>',
            "",
            "",
            "",
            "",
            "",
        ]
    outs, limits = row["accuracy"]["outputs"], row["accuracy"]["tolerance"]

    def worst(key: str, pick: Callable, style: str = ".6g") -> str:
        return _fmt(pick([o[key] for o in outs if o.get(key) is not None], default=None), style)

    shown = ", ".join(f"{k} {v:g}" for k, v in limits.items() if v is not None) or "none"
    parts = row.get("composition") or {}
    nodes = ", ".join(f"{k} {v}" for k, v in sorted((parts.get("nodes_by_dtype") or {}).items()))
    stored = svg.share_bar_svg(parts["initializer_bytes_by_dtype"]) if parts.get("initializer_bytes_by_dtype") else ""
    # an int8 model stores its weights in float (Q/DQ quantizes them at build time): the share it covers comes first
    covered = "; ".join(filter(None, [composition_line(parts, row["precision"]), fallback_line(row.get("fallback"))]))
    share = f"{escape(covered)}<br>stored as: {stored}" if covered and stored else escape(covered) or stored
    return [
        escape(row["recipe"]),
        escape(row["precision"]),
        verdict,
        worst("cosine_similarity", min, ".8f"),
        worst("max_abs_error", max),
        worst("top1_agreement", min),
        escape(shown),
        share,
        escape(nodes),
    ]


def _fmt(value: float | None, style: str = ".6g") -> str:
    return "n/a" if value is None else format(value, style)


def _engines(record: dict) -> str:
    """Every engine of every package: size, build seconds, target and compatibility."""
    seconds = {n["id"]: n["seconds"] if n["seconds"] is not None else n["recorded_seconds"] for n in record["nodes"]}
    rows = []
    for recipe, manifest in sorted(record.get("packages", {}).items()):
        for e in manifest.get("engines", []):
            built = seconds.get(NodeId.of("build", recipe, e["precision"], e["target"]))
            rows.append(
                [
                    escape(recipe),
                    escape(e["file"]),
                    escape(e["precision"]),
                    escape(f"{e['target']} ({', '.join(e['compute_capabilities'])})"),
                    f"{e['size'] / 2**10:.1f} KiB",
                    "n/a" if built is None else f"{built:.2f}",
                    escape(f"{e['backend']} {e['backend_version']}"),
                    escape(
                        f"hardware {e['hardware_compatibility']}, version compatible: "
                        f"{'yes' if e['version_compatible'] else 'no'}"
                    ),
                ]
            )
        rows += [
            [
                escape(recipe),
                "missing",
                escape(m["precision"]),
                escape(m["target"]),
                "",
                "",
                "",
                f'<span class="fail">{escape(m["stage"])}: {escape(m["reason"])}</span>',
            ]
            for m in manifest.get("missing", [])
        ]
    head = ["recipe", "engine", "precision", "target", "size", "build s", "backend", "compatibility"]
    table = _table(head, rows, (4, 5)) if rows else "<p>no package was written</p>"
    return f'<section id="engines"><h2>Engines</h2>{table}</section>'


def _fleet(record: dict) -> str:
    """What `trtflow provision --gpu <cc>` picks for each GPU of the fleet, and why the others were refused."""
    rows = []
    for gpu in record.get("fleet", []):
        for recipe, choice in gpu["recipes"].items():
            refused = "".join(f"<li>{escape(r['file'])}: {escape(r['why'])}</li>" for r in choice.get("refused", []))
            refused += "".join(f'<li class="fail">{escape(f)}</li>' for f in choice.get("failed", []))
            got = (
                f'<span class="fail">{escape(choice["error"])}</span>'
                if "error" in choice
                else f"{escape(choice['chosen'])}<br><small>{escape(choice['reason'])}</small>"
            )
            rows.append(
                [
                    escape(f"{gpu['compute_capability']} ({', '.join(gpu['targets'])})"),
                    escape(recipe),
                    got,
                    f"<details><summary>{len(choice.get('refused', [])) + len(choice.get('failed', []))}</summary>"
                    f"<ul>{refused}</ul></details>",
                ]
            )
    table = (
        _table(["GPU", "recipe", "gets", "not chosen, and why"], rows)
        if rows
        else "<p>no package to provision from</p>"
    )
    return f'<section id="fleet"><h2>What each GPU of the fleet gets</h2>{table}</section>'
