"""The run record (`artifacts/run.json`): a finished run as plain JSON, everything the report draws.

Written only by a run that did something (a no-op writes nothing: runmemo); it is not an input of any stage key
and never in trtflow.lock. Times are seconds from the run's start; everything else is sorted so two runs that did
the same thing differ only in their times. Example node entry:
`{"id": "build:tiny/fp32/rtx-ada", "status": "built", "start": 1.92, "end": 2.41, "slot": 1, "peak_rss": 181403648,
"reason": "new", "recorded_seconds": 0.49, ...}`.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow import __version__
from trtflow.errors import NoRunRecord
from trtflow.report import FORMAT, RUN_FILE
from trtflow.states import CACHED, FAILED, NodeState

if TYPE_CHECKING:
    from trtflow.recipe.project import Project
    from trtflow.run.result import RunResult

MAX_RECORD_BYTES = 256 << 20


def run_record(project: Project, result: RunResult) -> dict:
    """The record of a finished run of `project`: nodes, timing, packages, fleet."""
    nodes = [_node_entry(result, state) for state in result.nodes]
    manifests = _manifests(project.packages_dir, sorted({n["recipe"] for n in nodes}))
    targets = {
        name: [str(cc) for cc in target.compute_capabilities] for name, target in project.pipeline.targets.items()
    }
    return {
        "format": FORMAT,
        "trtflow_version": __version__,
        "project": project.root.name,
        "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(result.seconds, 3),
        "jobs": result.jobs,
        "nodes": nodes,
        "packages": manifests,
        "targets": targets,
        "fleet": fleet(targets, manifests),
        "accuracy": accuracy(manifests, nodes),
    }


def _node_entry(result: RunResult, state: NodeState) -> dict:
    """One node: status, reason (the plan's, for a stage that ran), timing, and the seconds its record took to make."""
    node, planned = state.node, result.planned.get(state.node.id)
    reason = state.reason or (planned.label if planned is not None and not planned.settled else "")
    changes = state.changes or (planned.changes if planned is not None else [])
    record: Mapping[str, Any] = result.records.get(node.id) or state.record or {}
    timing = result.timeline.get(node.id)
    return {
        "id": node.id,
        "kind": node.kind,
        "recipe": node.recipe,
        "deps": sorted(d.node for d in getattr(node, "deps", ())),
        "target": getattr(getattr(node, "info", None), "target", None),
        "status": state.status,
        "failure_cached": state.from_cache,
        "reason": reason,
        "changes": list(changes),
        "seconds": state.seconds,
        "recorded_seconds": _seconds(record),
        "start": timing.start if timing else None,
        "end": timing.end if timing else None,
        "slot": timing.slot if timing else None,
        "peak_rss": timing.peak_rss if timing else None,
    }


def _seconds(record: Mapping[str, Any]) -> float | None:
    value = record.get("seconds") if isinstance(record, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def _manifests(packages: Path, recipes: list[str]) -> dict[str, dict]:
    """Each recipe's package manifest as the run left it (a recipe whose package failed has none)."""
    found = {}
    for recipe in recipes:
        try:
            found[recipe] = json.loads((packages / recipe / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
    return found


def fleet(targets: dict[str, list[str]], manifests: dict[str, dict]) -> list[dict]:
    """For each compute capability of the pipeline's targets: the engine `trtflow provision --gpu <cc>` would choose
    from each package (the same rules: provision.choose), why every other was refused, and which failed to build."""
    ccs = sorted({cc for listed in targets.values() for cc in listed}, key=lambda cc: (len(cc), cc))
    return [
        {
            "compute_capability": cc,
            "targets": sorted(t for t, listed in targets.items() if cc in listed),
            "recipes": {recipe: _provision_choice(manifest, cc) for recipe, manifest in sorted(manifests.items())},
        }
        for cc in ccs
    ]


def _provision_choice(data: dict, cc: str) -> dict:
    """{chosen, reason, refused: [{file, why}], failed: [..]} or {error} for one package and one GPU."""
    from pydantic import ValidationError

    from trtflow.deploy.provision import Device, NoEngineFits, choose, chosen_because, failed_for
    from trtflow.manifest import Manifest

    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        return {"error": f"manifest.json does not validate: {exc.error_count()} error(s)"}
    device = Device((cc,), cc, "report")
    failed = [f"{m.target} {m.precision}: {m.stage} failed: {m.reason}" for m in failed_for(manifest, device)]
    try:
        chosen, others = choose(manifest, device)
    except NoEngineFits as exc:
        return {"error": str(exc).splitlines()[0].rstrip(":"), "refused": [], "failed": failed}
    return {
        "chosen": chosen.engine.file,
        "precision": chosen.engine.precision,
        "target": chosen.engine.target,
        "reason": chosen_because(chosen),
        "refused": [{"file": v.engine.file, "why": why} for v, why in others],
        "failed": failed,
    }


def accuracy(manifests: dict[str, dict], nodes: list[dict]) -> list[dict]:
    """Per recipe and reduced precision: the accuracy against fp32 and the limits it was held to, the composition
    (share of weight bytes and nodes per type), or the failure of its precision stage."""
    rows: dict[tuple[str, str], dict] = {}
    for recipe, manifest in manifests.items():
        for engine in manifest.get("engines", []):
            proofs = engine.get("verification") or {}
            if proofs.get("precision_accuracy") and (recipe, engine["precision"]) not in rows:
                rows[(recipe, engine["precision"])] = {
                    "recipe": recipe,
                    "precision": engine["precision"],
                    "passed": proofs["precision_accuracy"]["passed"],
                    "accuracy": proofs["precision_accuracy"],
                    "composition": proofs.get("precision_composition"),
                    "fallback": proofs.get("precision_fallback"),
                }
    for node in nodes:
        if node["kind"] == "precision" and node["status"] == FAILED:
            precision = node["id"].rsplit("/", 1)[-1]
            rows[(node["recipe"], precision)] = {
                "recipe": node["recipe"],
                "precision": precision,
                "passed": False,
                "failure": node["reason"],
            }
    return [rows[key] for key in sorted(rows)]


def totals(record: dict) -> dict:
    """Counts per status, and the seconds the cache saved: what the cached stages took when they were made."""
    nodes = record["nodes"]
    counts = {status: sum(n["status"] == status for n in nodes) for status in ("built", "cached", "failed", "skipped")}
    counts["failed_cached"] = sum(n["status"] == FAILED and n["failure_cached"] for n in nodes)
    saved = sum(n["recorded_seconds"] or 0.0 for n in nodes if n["status"] == CACHED)
    ran = sum(n["seconds"] or 0.0 for n in nodes if n["status"] != CACHED and not n["failure_cached"])
    return {
        **counts,
        "stages": len(nodes),
        "stage_seconds": round(ran, 3),
        "cache_saved_seconds": round(saved, 3),
        "cold_seconds": round(ran + saved, 3),
    }


def write_record(directory: Path, record: dict) -> Path:
    """Write run.json into `directory` (atomically, sorted keys)."""
    from trtflow.util.fs import atomic_write

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RUN_FILE
    atomic_write(path, json.dumps(record, sort_keys=True, indent=1))
    return path


def read_record(path: Path) -> dict:
    """A run record written by `trtflow run`; NoRunRecord (one line) if it is missing or not one."""
    try:
        with open(path, "rb") as stream:
            record = json.loads(stream.read(MAX_RECORD_BYTES))
    except FileNotFoundError:
        raise NoRunRecord(
            f"{path}: no run record: run `trtflow run` first (it writes one after every run that did something)"
        ) from None
    except (OSError, ValueError) as exc:
        raise NoRunRecord(f"{path}: not a run record ({exc})") from exc
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("nodes"), list):
        raise NoRunRecord(f"{path}: not a run record of format {FORMAT}: run `trtflow run` again to write one")
    from trtflow.report.shape import first_problem

    problem = first_problem(record)
    if problem is not None:
        raise NoRunRecord(f"{path}: not a run record: {problem}; run `trtflow run` again to write one")
    return record


def engines_not_run(record: dict) -> tuple[int, int, str | None]:
    """(engines in the packages, how many were not executed, the first reason given): a report says so, never lets a
    checked engine pass for a run one. Read defensively: a record from `--from` may hold anything there."""
    engines = [e for m in (record.get("packages") or {}).values() for e in (m.get("engines") or [])]
    statuses = [_engine_run_status(e) for e in engines]
    not_run = [s for s in statuses if s.startswith("not run")]
    return len(engines), len(not_run), (not_run[0] if not_run else None)


def _engine_run_status(engine: object) -> str:
    """The engine's `verification.engine_run.status` ("" where the record has none)."""
    verification = engine.get("verification") if isinstance(engine, dict) else None
    run = verification.get("engine_run") if isinstance(verification, dict) else None
    status = run.get("status") if isinstance(run, dict) else None
    return status if isinstance(status, str) else ""


def composition_line(composition: dict, precision: str) -> str:
    """`int8: 97% of MACs, 98% of weights` (the share the precision covers; for int8/fp8 through Q/DQ), or "" when
    the record predates these shares."""
    mac, weight = composition.get("mac_share"), composition.get("weight_share")
    if not isinstance(mac, (int, float)) or not isinstance(weight, (int, float)):
        return ""
    return f"{precision}: {mac:.0%} of MACs, {weight:.0%} of weights"


def fallback_line(search: object) -> str:
    """`kept higher by fallback: auto: /fc1/Gemm (Gemm, sensitivity 0.887)` for the nodes a search kept, or ""."""
    kept = search.get("kept") if isinstance(search, dict) else None
    if not isinstance(kept, list) or not kept:
        return ""
    shown = [
        f"{k.get('name')} ({k.get('op')}, sensitivity {k.get('sensitivity')})" for k in kept[:5] if isinstance(k, dict)
    ]
    more = f" and {len(kept) - 5} more" if len(kept) > 5 else ""
    return f"kept higher by fallback: auto: {', '.join(shown)}{more}"
