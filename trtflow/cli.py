"""The `trtflow` command. The only place that reads arguments, prints, and maps errors to exit codes.

Exit codes: 0 success; 1 a stage failed; 2 bad command line; 3 invalid project, recipe or file;
4 something missing from this machine (a package, a GPU); 5 no engine fits the device (provision);
70 a bug in trtflow (please report it).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import click

from trtflow import __version__
from trtflow.errors import InternalError, TrtflowError
from trtflow.plan import BUILT, CACHED, FAILED, SKIPPED, NodeState


class Context:
    def __init__(self, project_dir: Path, verbose: bool):
        self.project_dir = project_dir
        self.verbose = verbose

    def session(self, recipes: tuple[str, ...] = ()):
        from trtflow.session import Session

        return Session.open(self.project_dir, recipes)

    def store(self):
        """(project, its store or None if nothing has run yet), for the cache commands."""
        from trtflow.recipe import load_project
        from trtflow.store import Store

        project = load_project(self.project_dir)
        return project, Store.existing(project.store_dir)


pass_context = click.make_pass_decorator(Context)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-C", "--project", "project_dir", type=click.Path(file_okay=False, path_type=Path), default=".", show_default=True, help="Folder holding pipeline.yaml.")
@click.option("-v", "--verbose", is_flag=True, help="Show details (tracebacks of failed stages, build logs).")
@click.version_option(__version__, prog_name="trtflow")
@click.pass_context
def cli(ctx: click.Context, project_dir: Path, verbose: bool) -> None:
    """Build TensorRT engines for a GPU fleet from declarative recipes, rebuilding only what changed."""
    ctx.obj = Context(project_dir, verbose)


@cli.command()
@pass_context
def validate(ctx: Context) -> None:
    """Check pipeline.yaml, every recipe, and that each model parses and fits its profiles."""
    session = ctx.session()
    session.check_models()
    project = session.project
    click.echo(f"ok: {len(project.recipes)} recipe(s), {len(project.pipeline.targets)} target(s), {len(session.dag)} stage(s)")


@cli.command()
@click.argument("recipes", nargs=-1)
@click.option("--explain", is_flag=True, help="Name what changed since the last run for every stale stage.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_context
def plan(ctx: Context, recipes: tuple[str, ...], explain: bool, as_json: bool) -> None:
    """Show every stage and whether it is cached, new, or stale (and why). Writes nothing."""
    session = ctx.session(recipes)
    try:
        states = list(session.plan().values())
    finally:
        session.close()
    if as_json:
        click.echo(json.dumps({"nodes": [s.to_json() for s in states]}, indent=2))
        return
    for state in states:
        click.echo(f"{state.node.id:<48} {state.label}")
        if explain:
            for change in state.changes[1:] if state.reason else []:
                click.echo(f"{'':<48}   also: {change}")
    click.echo(_counts(states))


@cli.command()
@click.argument("recipes", nargs=-1)
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Stages to run at once (TensorRT-RTX builds use one core each).")
@click.option("--force", is_flag=True, help="Run every selected stage even if cached.")
@click.option("--dry-run", is_flag=True, help="Show what would run, run nothing.")
@click.option("--frozen", is_flag=True, help="Fail before building anything if the plan differs from trtflow.lock (for CI).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary (no progress display).")
@click.option("--remote-required", is_flag=True, help="Fail if the remote cache of pipeline.yaml cannot be reached (default: warn and build locally).")
@pass_context
def run(ctx: Context, recipes: tuple[str, ...], jobs: int, force: bool, dry_run: bool, frozen: bool, as_json: bool, remote_required: bool) -> None:
    """Run the stale stages of the selected recipes (all by default) and write their packages."""
    from trtflow.runner import RunOptions

    session = ctx.session(recipes)
    try:
        if dry_run:
            if frozen:
                session.frozen_keys()  # the same check a frozen run makes before building anything
            states = list(session.plan(force).values())
            _print_summary(states, as_json, 0.0, dry_run=True)
            return
        started = time.perf_counter()
        view = None if as_json else _progress_view(ctx.verbose)
        try:
            options = RunOptions(jobs=jobs, force=force, frozen=frozen, remote_required=remote_required)
            states = list(session.run(options, view).values())
        finally:
            if view is not None:
                view.close()
    finally:
        session.close()
    _print_summary(states, as_json, time.perf_counter() - started, warnings=session.warnings)
    if any(s.status == FAILED for s in states):
        sys.exit(1)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def inspect(path: Path, as_json: bool) -> None:
    """Show a package (folder or .tar.gz), a manifest.json, or an engine file."""
    from trtflow.inspection import inspect_path

    info = inspect_path(path)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    elif info["kind"] == "engine":
        _print_engine(info)
    else:
        _print_manifest(info["path"], info["manifest"])


@cli.command()
@click.argument("what", type=click.Choice(["manifest", "recipe", "pipeline"]))
def schema(what: str) -> None:
    """Print the JSON Schema of a manifest, a recipe or pipeline.yaml (for editors and validators)."""
    if what == "manifest":
        from trtflow.manifest import manifest_json_schema

        click.echo(json.dumps(manifest_json_schema(), indent=2))
        return
    from trtflow.recipe import Pipeline, recipe_json_schema

    click.echo(json.dumps(recipe_json_schema() if what == "recipe" else Pipeline.model_json_schema(), indent=2))


@cli.command()
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--gpu", default="auto", show_default=True, help="auto (nvidia-smi), a compute capability (sm_86 or 8.6), or a target name of the package.")
@click.option("--runtime-version", help="TensorRT or TensorRT-RTX version on the device, e.g. 10.13.3; without it version rules are not applied.")
@click.option("--backend", type=click.Choice(["tensorrt-rtx", "tensorrt"]), help="Consider only engines of this backend.")
@click.option("--precision", help="Consider only engines of this precision (default: the first in manifest order that fits).")
@click.option("--dest", required=True, type=click.Path(file_okay=False, path_type=Path), help="Folder to write <recipe>-<precision>.engine and .json into.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON record.")
def provision(package: Path, gpu: str, runtime_version: Optional[str], backend: Optional[str], precision: Optional[str], dest: Path, as_json: bool) -> None:
    """Pick the engine of PACKAGE (folder, .tar.gz or manifest.json) that fits a GPU, verify it, write it to DEST."""
    from trtflow import provision as prov

    loaded = prov.load_package(package)
    device = prov.device_from_options(gpu, loaded.manifest, runtime_version, backend, precision)
    record = prov.provision(loaded, device, dest)
    if as_json:
        click.echo(json.dumps(record, indent=2))
        return
    _print_provision(record)


@cli.group()
def cache() -> None:
    """The store: what it holds (ls), whether its objects are intact (verify), what can be deleted (gc)."""


@cache.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def cache_ls(ctx: Context, as_json: bool) -> None:
    """Records and bytes per recipe and stage, how many of them trtflow.lock uses, and store totals."""
    from trtflow import housekeeping

    info = _on_store(ctx, as_json, lambda project, store: housekeeping.usage(store, housekeeping.lock_keys(project.root)))
    if info is None:
        return
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"{'recipe':<24} {'stage':<10} {'records':>7} {'in lock':>7} {'size':>10}")
    for row in info["stages"]:
        click.echo(f"{row['recipe']:<24} {row['stage']:<10} {row['records']:>7} {row['in_lock']:>7} {_size(row['bytes']):>10}")
    objects, loose = info["objects"], info["unreferenced"]
    click.echo(f"objects: {objects['count']} ({_size(objects['bytes'])}); used by no record: {loose['count']} ({_size(loose['bytes'])}); "
               f"quarantined: {_size(info['corrupt'])}; work dirs: {_size(info['tmp'])}  [{info['store']}]")


@cache.command("verify")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def cache_verify(ctx: Context, as_json: bool) -> None:
    """Re-hash every object; name corrupt ones (exit 1) and move them aside so the next run rebuilds them."""
    from trtflow import housekeeping

    report = _on_store(ctx, as_json, lambda project, store: housekeeping.verify(store))
    if report is None:
        return
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_verify(report)
    if report["corrupt"]:
        sys.exit(1)


def _print_verify(report: dict) -> None:
    for bad in report["corrupt"]:
        users = ", ".join(f"{u['node']} (key {u['key'][:12]})" for u in bad["used_by"]) or "no record"
        click.echo(f"corrupt  {bad['path']}: used by {users}; moved to {bad['moved_to']}; the next run rebuilds it")
    for gone in report["missing"]:
        click.echo(f"missing  {gone['digest']} of {gone['node']} (key {gone['key'][:12]}): the next run rebuilds it")
    for path in report["leftovers"]:
        click.echo(f"leftover {path} (a killed write; `trtflow cache gc --yes` removes it)")
    click.echo(f"verified {report['objects']} objects ({_size(report['bytes'])}) in {report['seconds']:.2f} s: "
               f"{len(report['corrupt'])} corrupt, {len(report['missing'])} missing  [{report['store']}]")


@cache.command("gc")
@click.option("--keep-last", type=click.IntRange(min=0), default=0, show_default=True, help="Also keep what the last N runs used.")
@click.option("--yes", is_flag=True, help="Delete (without it, only say what would be deleted).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def cache_gc(ctx: Context, keep_last: int, yes: bool, as_json: bool) -> None:
    """Delete what trtflow.lock, the current packages (and --keep-last N runs) do not use. A dry run without --yes."""
    from trtflow import housekeeping

    def sweep(project, store) -> dict:
        keep = housekeeping.live_keys(store, project.root, project.packages_dir, keep_last)
        return housekeeping.collect_garbage(store, keep) if yes else housekeeping.garbage(store, keep)

    report = _on_store(ctx, as_json, sweep)
    if report is None:
        return
    report["dry_run"] = not yes
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    verb = "deleted" if yes else "would delete"
    freed = report["freed"]
    click.echo(f"{verb} {len(report['records'])} records, {len(report['objects'])} objects ({_size(freed['objects'])}), "
               f"{_size(freed['corrupt'])} quarantined, {_size(freed['tmp'])} of dead runs' work dirs: {_size(report['freed_bytes'])} in all")
    kept = "trtflow.lock and the packages use" + (f", and the last {keep_last} run(s) used" if keep_last else "")
    click.echo(f"kept {report['kept_records']} records, {report['kept_objects']} objects ({_size(report['kept_bytes'])}): what {kept}")
    if not yes:
        click.echo("dry run: pass --yes to delete")


def _on_store(ctx: Context, as_json: bool, work: Callable[[Any, Any], dict]) -> Optional[dict]:
    """`work(project, store)` on the project's store, closed afterwards; None (said to the user) if nothing has run yet."""
    project, store = ctx.store()
    if store is None:
        _no_store(project.store_dir, as_json)
        return None
    try:
        return work(project, store)
    finally:
        store.close()


def _no_store(path: Path, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"store": str(path), "exists": False}))
    else:
        click.echo(f"no store at {path} yet (nothing has run): nothing to do")


def _size(count: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def _print_provision(record: dict) -> None:
    click.echo(f"chose {record['chosen']['file']} for {record['device']['gpu']}: {record['chosen']['reason']}")
    if record["runtime"]["version"] is None:
        click.echo("  runtime version not checked (pass --runtime-version to apply the version rules)")
    click.echo(f"wrote {record['written']['engine']} and {Path(record['written']['record']).name}")


# ---------------------------------------------------------------------------------------------
# output


def _counts(states: list[NodeState]) -> str:
    counts: dict[str, int] = {}
    for state in states:
        counts[state.status] = counts.get(state.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items()) or "nothing to do"


def _print_summary(states: list[NodeState], as_json: bool, seconds: float, dry_run: bool = False, warnings: tuple = ()) -> None:
    if as_json:
        for warning in warnings:
            click.echo(f"warning: {warning}", err=True)
        counts = {status: sum(s.status == status for s in states) for status in (BUILT, CACHED, FAILED, SKIPPED)}
        click.echo(json.dumps({"dry_run": dry_run, "seconds": round(seconds, 3), **counts, "warnings": list(warnings),
                               "nodes": [s.to_json() for s in states]}, indent=2))
        return
    if dry_run:
        for state in states:
            click.echo(f"{'would run' if state.status != CACHED else 'cached':<10} {state.node.id:<48} {state.label}")
        click.echo(f"dry run: {sum(s.status != CACHED for s in states)} stage(s) would run, {sum(s.status == CACHED for s in states)} cached")
        return
    for state in states:
        if state.status in (FAILED, SKIPPED):
            click.echo(f"{state.status:<8} {state.node.id}: {state.reason}", err=True)
    built = [s for s in states if s.status == BUILT]
    line = f"{len(built)} built, {sum(s.status == CACHED for s in states)} cached, {sum(s.status == FAILED for s in states)} failed, {sum(s.status == SKIPPED for s in states)} skipped in {seconds:.2f} s"
    from trtflow.runner import PULLED

    pulled = sum(s.status == CACHED and s.reason == PULLED for s in states)
    if pulled:
        line += f" ({pulled} pulled from the remote cache)"
    elif not built and all(s.status == CACHED for s in states):
        line += " (all stages cached, nothing to do)"
    click.echo(line)


def _print_manifest(path: str, manifest: dict) -> None:
    click.echo(f"package {manifest['recipe']}  ({path})")
    click.echo(f"  trtflow {manifest['trtflow_version']}, manifest schema {manifest['schema_version']}, source sha256 {manifest['source']['sha256'][:16]}")
    for engine in manifest["engines"]:
        click.echo(f"  {engine['file']}")
        click.echo(f"    target {engine['target']} ({', '.join(engine['compute_capabilities'])}), {engine['precision']}, {engine['backend']} {engine['backend_version']}")
        click.echo(f"    {engine['size']} bytes, sha256 {engine['sha256']}")
        for tensor in engine["tensors"]:
            ranges = "; ".join(f"{p['min']}..{p['max']} opt {p['opt']}" for p in tensor["profiles"])
            click.echo(f"    {tensor['mode']:<6} {tensor['name']} {tensor['dtype']} {tensor['shape']}" + (f"  profiles: {ranges}" if ranges else ""))
        for line in _evidence_lines(engine):
            click.echo(f"    {line}")


def _evidence_lines(engine: dict) -> list[str]:
    """What stands behind an engine: calibration, the ONNX Runtime proofs, and whether the engine itself ran."""
    lines = []
    calibration = engine.get("calibration")
    if calibration:
        data = "random inputs" if calibration.get("random") else f"data sha256 {str(calibration.get('data_digest'))[:16]}"
        lines.append(f"calibration: {calibration.get('method')}, {calibration.get('samples')} samples, {data}")
    check = engine.get("verification") or {}
    if check.get("cleanup_equality"):
        proof = check["cleanup_equality"]
        worst = max((o["max_abs_error"] or 0.0 for o in proof["outputs"]), default=0.0)
        lines.append(f"cleanup == source: {'passed' if proof['passed'] else 'FAILED'} (max abs error {worst:.3g}, {proof['samples']} samples)")
    accuracy = check.get("precision_accuracy")
    if accuracy:
        cosine = min((o.get("cosine_similarity") or 0.0 for o in accuracy.get("outputs", [])), default=0.0)
        lines.append(f"{engine['precision']} vs fp32: {'passed' if accuracy.get('passed') else 'FAILED'} (min cosine {cosine:.8f}, {accuracy.get('samples')} samples)")
    if check.get("engine_run"):
        lines.append(f"engine run: {check['engine_run']['status']}")
    return lines


def _print_engine(info: dict) -> None:
    click.echo(f"{info['path']}: {info['format']}, {info['size']} bytes, sha256 {info['sha256']}")
    entry = info["manifest_entry"]
    if entry is None:
        click.echo("  no manifest describes it (inspect the package folder it came from for details)")
        return
    click.echo(f"  recipe {info['recipe']}, target {entry['target']} ({', '.join(entry['compute_capabilities'])}), {entry['precision']}, {entry['backend']} {entry['backend_version']}")


class _PlainView:
    """One line per finished stage: for logs and CI, where a live display would be noise."""

    def __init__(self, verbose: bool):
        self.verbose = verbose
        self.done = 0

    def __call__(self, event: str, state: Any) -> None:
        if event == "warning":
            click.echo(f"warning: {state}", err=True)
            return
        if event in ("start", "wait"):
            click.echo(f"{'run' if event == 'start' else 'wait':<8} {state.node.id}  ({state.label})", err=True)
            return
        self.done += 1
        if state.status == CACHED and not (self.verbose or state.reason):
            return
        timing = f" in {state.seconds:.2f} s" if state.seconds is not None else ""
        why = f"  ({state.reason})" if state.status == CACHED and state.reason else ""  # pulled, built by another run
        click.echo(f"{state.status:<8} {state.node.id}{timing}{why}", err=True)
        if self.verbose and state.detail:
            click.echo(state.detail, err=True)

    def close(self) -> None:
        pass


class _RichView(_PlainView):
    """A live progress bar on a terminal, with finished stages printed above it."""

    def __init__(self, verbose: bool):
        super().__init__(verbose)
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed} done"), TimeElapsedColumn(), console=Console(stderr=True))
        self.task = self.progress.add_task("running", total=None)
        self.progress.start()

    def __call__(self, event: str, state: Any) -> None:
        if event == "warning":
            self.progress.console.print(f"warning: {state}", markup=False, highlight=False)
            return
        if event in ("start", "wait"):
            self.progress.update(self.task, description=f"{'running' if event == 'start' else 'waiting for'} {state.node.id}")
            return
        if state.status != CACHED:
            timing = f" in {state.seconds:.2f} s" if state.seconds is not None else ""
            self.progress.console.print(f"{state.status:<8} {state.node.id}{timing}", markup=False, highlight=False)
        self.progress.advance(self.task)

    def close(self) -> None:
        self.progress.stop()


def _progress_view(verbose: bool) -> _PlainView:
    return _RichView(verbose) if sys.stderr.isatty() else _PlainView(verbose)


def main(argv: Optional[list[str]] = None) -> Any:
    """Entry point: run the CLI, turning expected errors into one line and an exit code."""
    verbose = "-v" in (argv if argv is not None else sys.argv[1:]) or "--verbose" in (argv or sys.argv[1:])
    try:
        return cli.main(args=argv, prog_name="trtflow", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except InternalError as exc:
        traceback.print_exc()
        click.echo(f"trtflow: internal error: {exc} (please report this)", err=True)
        sys.exit(exc.exit_code)
    except TrtflowError as exc:
        if verbose:
            traceback.print_exc()
        click.echo("\n".join(f"error: {line}" for line in str(exc).splitlines()), err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # a bug: show everything needed to report it (unless a write found no room)
        _exit_if_write_failed(exc)
        traceback.print_exc()
        click.echo(f"trtflow: internal error: {type(exc).__name__}: {exc} (please report this)", err=True)
        sys.exit(InternalError.exit_code)


def _exit_if_write_failed(exc: Exception) -> None:
    """A write the disk, a quota or permissions refused (packages, trtflow.lock) is one line, exit 4, not a bug."""
    from trtflow.errors import EnvironmentProblem
    from trtflow.store import WRITE_ERRNOS

    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
        where = f" {exc.filename}" if exc.filename else ""
        click.echo(f"error: cannot write{where}: {exc.strerror} (disk full, file size limit or quota reached, or no permission?)", err=True)
        sys.exit(EnvironmentProblem.exit_code)
