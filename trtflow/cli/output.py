"""What the CLI prints: run summaries, package manifests, engine evidence, and the live progress of a run."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from trtflow.states import BUILT, CACHED, FAILED, PULLED, SKIPPED, NodeState

if TYPE_CHECKING:
    from trtflow.services.running import RunResult


def counts(states: list[NodeState]) -> str:
    """How many stages are in each status, e.g. `3 cached, 1 stale` (`nothing to do` if none)."""
    counts: dict[str, int] = {}
    for state in states:
        counts[state.status] = counts.get(state.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items()) or "nothing to do"


def print_summary(result: RunResult, as_json: bool) -> None:
    """Print the end of `trtflow run`: failures and totals, the would-run table of --dry-run, or JSON."""
    states = list(result.nodes)
    if as_json:
        for warning in result.warnings:
            click.echo(f"warning: {warning}", err=True)
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    if result.dry_run:
        for state in states:
            click.echo(f"{'would run' if not state.settled else state.status:<10} {state.node.id:<48} {state.label}")
        click.echo(
            f"dry run: {sum(not s.settled for s in states)} stage(s) would run, "
            f"{sum(s.status == CACHED for s in states)} cached" + _failed_before(states)
        )
        return
    for state in states:
        if state.status in (FAILED, SKIPPED):
            click.echo(f"{state.label.split(':')[0]:<8} {state.node.id}: {state.reason}", err=True)
    click.echo(_totals(states, result.seconds))
    if result.frozen is not None:
        equivalent = result.frozen["equivalent"]
        named = f": {', '.join(equivalent[:10])}{' ...' if len(equivalent) > 10 else ''}" if equivalent else ""
        click.echo(
            f"frozen: {result.frozen['identical']} stage(s) identical to trtflow.lock, {len(equivalent)} engine(s) "
            f"equivalent, not identical (only the backend's generated numbering differs: same canonical digest){named}"
        )
    _print_repro(result.repro, result.repro_skipped)


def _failed_before(states: list[NodeState]) -> str:
    """`, 2 failed before (recorded: --retry-failed runs them again)` when recorded failures were found."""
    found = sum(s.status == FAILED and s.from_cache for s in states)
    return f", {found} failed before (recorded: --retry-failed runs them again)" if found else ""


def _totals(states: list[NodeState], seconds: float) -> str:
    """`3 built, 4 cached, 1 failed (1 cached), 2 skipped in 2.31 s` and what that means."""
    built = sum(s.status == BUILT for s in states)
    failed = [s for s in states if s.status == FAILED]
    cached_failures = sum(s.from_cache for s in failed)
    shown = f"{len(failed)} failed" + (f" ({cached_failures} cached)" if cached_failures else "")
    line = (
        f"{built} built, {sum(s.status == CACHED for s in states)} cached, {shown}, "
        f"{sum(s.status == SKIPPED for s in states)} skipped in {seconds:.2f} s"
    )
    pulled = sum(s.status == CACHED and s.reason == PULLED for s in states)
    expected = sum(s.expected for s in failed)
    if pulled:
        line += f" ({pulled} pulled from the remote cache)"
    elif not built and all(s.status == CACHED for s in states):
        line += " (all stages cached, nothing to do)"
    elif not built and all(s.settled for s in states):
        line += " (nothing to do: the failures are recorded; --retry-failed runs them again)"
    if failed and expected == len(failed):
        line += f"; the {expected} failure(s) are the ones trtflow.lock records"
    return line


def _print_repro(repro: Sequence[Any], skipped: Mapping[str, str]) -> None:
    """The --check-repro verdict per engine rebuilt, then the engines it could not rebuild and why."""
    if repro:
        click.echo(f"reproducibility ({repro[0].rebuilds} hermetic rebuild(s) per engine):")
        for check in repro:
            click.echo(f"  {repro_line(check)}")
    if skipped:
        click.echo(f"reproducibility not checked for {len(skipped)} engine(s) that did not build:")
        for node_id, why in skipped.items():
            click.echo(f"  {node_id}: {why}")


def repro_line(check: Any) -> str:
    """`identical   build:x/fp32/t: 3/3 byte-identical` (or equivalent, or different with the first failure)."""
    detail = (
        f"{check.identical}/{check.rebuilds} byte-identical, {check.equivalent}/{check.rebuilds} same canonical digest"
    )
    if check.failures:
        detail += f"; {len(check.failures)} rebuild(s) failed: {check.failures[0]}"
    return f"{check.verdict:<11} {check.node_id}: {detail}"


def print_manifest(path: str, manifest: dict, layers: bool = False) -> None:
    """Print a package manifest for `trtflow inspect`: each engine's target, backend, tensors and evidence."""
    click.echo(f"package {manifest['recipe']}  ({path})")
    click.echo(
        f"  trtflow {manifest['trtflow_version']}, manifest schema {manifest['schema_version']}, source sha256 "
        f"{manifest['source']['sha256'][:16]}"
    )
    for line in missing_lines(manifest):
        click.echo(f"  {line}")
    for engine in manifest["engines"]:
        click.echo(f"  {engine['file']}")
        click.echo(
            f"    target {engine['target']} ({', '.join(engine['compute_capabilities'])}), {engine['precision']}, "
            f"{engine['backend']} {engine['backend_version']}"
        )
        click.echo(f"    {engine['size']} bytes, sha256 {engine['sha256']}")
        for tensor in engine["tensors"]:
            ranges = "; ".join(f"{p['min']}..{p['max']} opt {p['opt']}" for p in tensor["profiles"])
            click.echo(
                f"    {tensor['mode']:<6} {tensor['name']} {tensor['dtype']} {tensor['shape']}"
                + (f"  profiles: {ranges}" if ranges else "")
            )
        for line in evidence_lines(engine):
            click.echo(f"    {line}")
        for line in network_lines(engine.get("network"), layers):
            click.echo(f"    {line}")


def network_lines(network: Any, layers: bool) -> list[str]:
    """`network: 18 layers (convolution 2, ...); output types float32 18` and, with `layers`, one line per layer."""
    if not network:
        return []
    counted = ", ".join(f"{kind} {n}" for kind, n in network["by_type"].items())
    types = ", ".join(f"{dtype} {n}" for dtype, n in network["by_output_dtype"].items())
    lines = [
        f"network: {len(network['layers'])} layers ({counted}); output types {types}; device memory "
        f"{network['device_memory']}"
    ]
    return lines + (
        [f"  {layer['type']:<16} {layer['dtype']:<10} {layer['name']}" for layer in network["layers"]] if layers else []
    )


def missing_lines(manifest: dict) -> list[str]:
    """`INCOMPLETE: ...` and one line per engine the package lacks (failed build or verification), or nothing."""
    missing = manifest.get("missing") or []
    if not missing:
        return []
    return [
        f"INCOMPLETE: {len(missing)} engine(s) of the recipe failed and are not in this package:",
        *(f"  missing {m['precision']}/{m['target']}: {m['stage']}: {m['reason']}" for m in missing),
    ]


def evidence_lines(engine: dict) -> list[str]:
    """What stands behind an engine: calibration, the ONNX Runtime proofs, and whether the engine itself ran."""
    lines = []
    calibration = engine.get("calibration")
    if calibration:
        data = (
            "random inputs" if calibration.get("random") else f"data sha256 {str(calibration.get('data_digest'))[:16]}"
        )
        lines.append(f"calibration: {calibration.get('method')}, {calibration.get('samples')} samples, {data}")
    check = engine.get("verification") or {}
    if check.get("cleanup_equality"):
        proof = check["cleanup_equality"]
        worst = max((o["max_abs_error"] or 0.0 for o in proof["outputs"]), default=0.0)
        lines.append(
            f"cleanup == source: {'passed' if proof['passed'] else 'FAILED'} (max abs error {worst:.3g}, "
            f"{proof['samples']} samples)"
        )
    accuracy = check.get("precision_accuracy")
    if accuracy:
        cosine = min((o.get("cosine_similarity") or 0.0 for o in accuracy.get("outputs", [])), default=0.0)
        lines.append(
            f"{engine['precision']} vs fp32: {'passed' if accuracy.get('passed') else 'FAILED'} (min cosine "
            f"{cosine:.8f}, {accuracy.get('samples')} samples)"
        )
        if accuracy.get("task"):
            lines.append(task_line(engine["precision"], accuracy["task"]))
    if check.get("precision_composition"):
        lines.append(composition_line(check["precision_composition"]))
        lines += kept_lines(check["precision_composition"])
    if check.get("engine_run"):
        lines.append(f"engine run: {check['engine_run']['status']}")
    return lines


def task_line(precision: str, task: dict) -> str:
    """`int8 top1 0.962 (fp32 0.970, drop 0.008 <= 0.01) on 256 labelled rows`."""
    from trtflow.taskdata import summary_line

    return summary_line(precision, task)


def composition_line(parts: dict) -> str:
    """`made of: nodes float16 40, float32 3, q/dq 12; weights float16 5.3 MiB, float32 1.2 KiB; Q/DQ-fed Conv 20, Gemm
    1`."""
    nodes = ", ".join(f"{k} {v}" for k, v in parts["nodes_by_dtype"].items())
    weights = ", ".join(f"{k} {size(v)}" for k, v in parts["initializer_bytes_by_dtype"].items())
    covered = ", ".join(f"{k} {v}" for k, v in parts["qdq_covered_ops"].items())
    return f"made of: nodes {nodes}; weights {weights}" + (f"; Q/DQ-fed {covered}" if covered else "")


def kept_lines(parts: dict, top: int = 5) -> list[str]:
    """`fp16 share: weights 12.0%, MACs 30.1%; 40 node(s) kept higher, the largest:` then one line per kept node."""
    if parts.get("weight_share") is None:
        return []
    lines = [
        f"{parts['precision']} share: weights {parts['weight_share']:.1%}, MACs {parts['mac_share']:.1%}; "
        f"{parts['kept_nodes']} node(s) kept in higher precision" + (", the largest:" if parts["kept"] else "")
    ]
    lines += [
        f"  {k['name']} ({k['op']}, {k['weights']} weights, {k['macs']} MACs): {k['reason']}"
        for k in parts["kept"][:top]
    ]
    return lines


def print_engine(info: dict) -> None:
    """Print `trtflow inspect` of an engine file: format, size, sha256, and the manifest entry describing it if any."""
    click.echo(f"{info['path']}: {info['format']}, {info['size']} bytes, sha256 {info['sha256']}")
    entry = info["manifest_entry"]
    if entry is None:
        click.echo("  no manifest describes it (inspect the package folder it came from for details)")
        return
    click.echo(
        f"  recipe {info['recipe']}, target {entry['target']} ({', '.join(entry['compute_capabilities'])}), "
        f"{entry['precision']}, {entry['backend']} {entry['backend_version']}"
    )


def print_verify(report: dict) -> None:
    """Print `trtflow cache verify`: each corrupt, missing and leftover object, then the totals."""
    for bad in report["corrupt"]:
        users = ", ".join(f"{u['node']} (key {u['key'][:12]})" for u in bad["used_by"]) or "no record"
        click.echo(f"corrupt  {bad['path']}: used by {users}; moved to {bad['moved_to']}; the next run rebuilds it")
    for gone in report["missing"]:
        click.echo(f"missing  {gone['digest']} of {gone['node']} (key {gone['key'][:12]}): the next run rebuilds it")
    for path in report["leftovers"]:
        click.echo(f"leftover {path} (a killed write; `trtflow cache gc --yes` removes it)")
    click.echo(
        f"verified {report['objects']} objects ({size(report['bytes'])}) in {report['seconds']:.2f} s: "
        f"{len(report['corrupt'])} corrupt, {len(report['missing'])} missing, {len(report['set_aside'])} malformed "
        f"records  [{report['store']}]"
    )


def print_warnings(messages: list[str]) -> None:
    """Each message as one `warning:` line on stderr."""
    for message in messages:
        click.echo(f"warning: {message}", err=True)


def size(count: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def print_provision(record: dict) -> None:
    """Print which engine `trtflow provision` chose for the device and why, and the files it wrote."""
    # an engine installed before and switched back to (a second provision, a rollback) has no device or runtime facts:
    # nothing was chosen anew
    device = (record.get("device") or {}).get("gpu") or record.get("device_id") or "this device"
    click.echo(f"chose {record['chosen']['file']} for {device}: {record['chosen']['reason']}")
    for line in missing_lines({"missing": record.get("package_missing", [])}):
        click.echo(f"  {line}")
    if "runtime" in record and record["runtime"]["version"] is None:
        click.echo("  runtime version not checked (pass --runtime-version to apply the version rules)")
    written = record["written"]
    if record["action"] == "unchanged":
        click.echo(f"unchanged: {written['engine']} is already this engine (sha256 {written['sha256'][:16]})")
    else:
        verb = "installed" if record["action"] == "installed" else "switched back to"
        click.echo(f"{verb} {written['version']}; {written['engine']} now points to it")
    for plugin in record.get("plugins", []):
        where = (
            plugin["path"]
            if plugin["source"] == "plugin-dir"
            else f"{written['version']}/{plugin['file']} (carried by the package)"
        )
        click.echo(f"  plugin {plugin['name']}: {where}")
    if record.get("transfer"):
        transfer = record["transfer"]
        click.echo(f"  fetched {transfer['bytes']} bytes from {transfer['from']} ({', '.join(transfer['files'])})")


def print_doctor(rows: list[dict], version: str, hint: str | None) -> None:
    """`trtflow doctor`: each tool the lock names, its locked and installed version, and what to do if they differ."""
    click.echo(f"trtflow {version}, python {sys.version.split()[0]}")
    width = max([len(row["tool"]) for row in rows] + [4])
    click.echo(f"{'tool':<{width}}  {'trtflow.lock':<14} {'installed':<14}")
    for row in rows:
        state = "ok" if row["installed"] == row["locked"] else "DIFFERS"
        click.echo(
            f"{row['tool']:<{width}}  {row['locked']:<14} {str(row['installed'] or 'not installed'):<14} {state}"
        )
    if hint:
        click.echo(f"install the locked tools: {hint}")
