"""The pipeline's commands: validate, plan, run, report, inspect, schema."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from trtflow.cli import output, progress
from trtflow.cli.app import Context, cli, pass_context
from trtflow.states import CACHED, FAILED, SKIPPED, NodeState
from trtflow.util.reads import recording as reads_recording


@cli.command()
@click.option(
    "--export",
    "export",
    is_flag=True,
    help="Export torch, Hugging Face and TensorFlow sources first (cached as a run caches them): their models are "
    "checked too.",
)
@pass_context
def validate(ctx: Context, export: bool) -> None:
    """Check pipeline.yaml, every recipe, and that each model parses and fits its profiles."""
    from trtflow.modelcheck import unknown_integer_inputs

    session = ctx.session(keep_refusals=True)
    project = session.project
    if export:
        _export_sources(ctx, session)
    project.refuse([refusal for item in project.recipes for refusal in item.refusals] + session.check_models())
    output.print_warnings(session.idle_recipes())
    output.print_warnings([line for item in project.recipes for line in unknown_integer_inputs(item, project.root)])
    click.echo(
        f"ok: {len(project.recipes)} recipe(s), {len(project.pipeline.targets)} target(s), {len(session.dag)} stage(s)"
    )


def _export_sources(ctx: Context, session: Any) -> None:
    """validate --export: the export stages run (with progress), a failed one ends validation with its reason."""
    view = progress.progress_view(ctx.verbose, 1)
    try:
        states = list(session.run_exports(view).values())
    finally:
        view.close()
    _exit_if_failed(states)


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
        output.print_warnings(session.store_notes())
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
    click.echo(output.counts(states))


@cli.command()
@click.argument("recipes", nargs=-1)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Stages to run at once (TensorRT-RTX builds use one core each).",
)
@click.option("--force", is_flag=True, help="Run every selected stage even if cached.")
@click.option(
    "--retry-failed",
    is_flag=True,
    help="Run again the stages whose own failure is recorded (default: report it, exit 1).",
)
@click.option("--dry-run", is_flag=True, help="Show what would run, run nothing.")
@click.option(
    "--frozen", is_flag=True, help="Fail before building anything if the plan differs from trtflow.lock (for CI)."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary (no progress display).")
@click.option(
    "--remote-required",
    is_flag=True,
    help="Fail if the remote cache of pipeline.yaml cannot be reached (default: warn and build locally).",
)
@click.option(
    "--check-repro",
    type=click.IntRange(min=1),
    metavar="N",
    help="Release gate: then rebuild every selected engine N times in hermetic workers; "
    "exit 1 if one is not equivalent.",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    help="Where stages run (default: executor: in pipeline.yaml, else local processes).",
)
@click.option(
    "--ray-address",
    metavar="HOST:PORT|auto",
    help="The Ray cluster to run on (default: executor.ray.address, else a local Ray instance).",
)
@click.option(
    "--memory",
    metavar="SIZE",
    callback=lambda ctx, param, value: _size_option(value),
    help="Memory the stages running at once may take together, e.g. 16G "
    "(default: 90% of what is available at the start).",
)
@click.option(
    "--no-report",
    is_flag=True,
    help="Do not write run.json and report.html beside the packages (written after a run that did something).",
)
@click.option(
    "--builds-alone",
    is_flag=True,
    help="Run each build with no other stage beside it: TensorRT-RTX engines then come out byte-identical far more "
    "often (a shared CPU changes their numbering); costs about 30% of the wall time at -j 2.",
)
@pass_context
def run(
    ctx: Context,
    recipes: tuple[str, ...],
    jobs: int,
    force: bool,
    retry_failed: bool,
    dry_run: bool,
    frozen: bool,
    as_json: bool,
    remote_required: bool,
    check_repro: int | None,
    executor: str | None,
    ray_address: str | None,
    memory: int | None,
    no_report: bool,
    builds_alone: bool,
) -> None:
    """Run the stale stages of the selected recipes (all by default) and write their packages."""
    from trtflow.run import runmemo

    started, started_ns = time.perf_counter(), time.time_ns()
    whole_project = not (recipes or force or retry_failed or dry_run or frozen or remote_required or check_repro)
    remembered = runmemo.remembered_nodes(ctx.project_dir.resolve()) if whole_project else None
    if remembered is not None:  # nothing the last no-op read has changed: that no-op's answer
        known = [runmemo.remembered_state(entry) for entry in remembered]
        output.print_summary(known, as_json, time.perf_counter() - started)
        _exit_if_failed(known)
        return
    early = None if dry_run else _early_executor(ctx.project_dir, jobs, executor, ray_address)
    from trtflow.run.session import RunOptions

    with reads_recording() as reads:
        options = RunOptions(
            jobs=jobs,
            force=force,
            retry_failed=retry_failed,
            frozen=frozen,
            remote_required=remote_required,
            check_repro=check_repro or 0,
            executor="ray" if ray_address and executor is None else executor,
            ray_address=ray_address,
            memory=memory,
            builds_alone=builds_alone,
        )
        try:
            states, session = _run_session(ctx, recipes, options, dry_run, as_json, early)
        finally:
            if early is not None:
                early.shutdown()  # done already, unless the run stopped before using it (a project error)
    if states is None:
        return  # a dry run: printed already
    if whole_project and session.remembers_no_op(states):
        runmemo.remember(
            session.project.root, reads, [s.to_json() for s in states], started_ns, session.project.store_dir
        )
    elif any(s.status != CACHED for s in states):
        runmemo.forget(session.project.root)
    # a run that did nothing writes nothing (runmemo), unless the last report shows other failures than this run
    if not no_report and (any(not s.settled for s in states) or _report_outdated(session, states)):
        _write_report(session, states, time.perf_counter() - started, jobs)
    output.print_summary(
        states,
        as_json,
        time.perf_counter() - started,
        warnings=session.warnings,
        repro=session.repro,
        repro_skipped=session.repro_skipped,
        frozen=session.frozen,
    )
    _exit_if_failed(states)
    if any(check.verdict == "different" for check in session.repro):
        sys.exit(1)


def _report_outdated(session: Any, states: list) -> bool:
    """Whether the last run.json shows other stages, or other failed and skipped ones, than these states: after a
    failure, a fix found whole in the cache must not leave the old failures on the report as current."""
    from trtflow.report import RUN_FILE

    try:
        shown = json.loads((session.project.packages_dir.parent / RUN_FILE).read_text())["nodes"]
        before = {(n["id"], n["status"] in (FAILED, SKIPPED)) for n in shown}
    except (OSError, ValueError, KeyError, TypeError):
        return True
    return before != {(s.node.id, s.status in (FAILED, SKIPPED)) for s in states}


def _write_report(session: Any, states: list, seconds: float, jobs: int) -> None:
    """run.json and report.html beside the packages; a report that cannot be written is a warning, not a failed run."""
    from trtflow.report import REPORT_FILE
    from trtflow.report.html import render
    from trtflow.report.record import run_record, write_record
    from trtflow.util.fs import atomic_write

    folder = session.project.packages_dir.parent
    try:
        record = run_record(session, states, seconds, jobs)
        write_record(folder, record)
        atomic_write(folder / REPORT_FILE, render(record))
    except OSError as exc:
        output.print_warnings([f"could not write the run report in {folder}: {exc}"])
        return
    click.echo(f"report: {folder / REPORT_FILE}", err=True)


@cli.command()
@click.option(
    "--from",
    "source",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The run record (default: run.json beside the project's packages).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write (default: report.html beside run.json; md: stdout).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["html", "md"]),
    default="html",
    show_default=True,
    help="html: the self-contained report; md: a compact summary for $GITHUB_STEP_SUMMARY.",
)
@pass_context
def report(ctx: Context, source: Path | None, out: Path | None, fmt: str) -> None:
    """Draw the last run: DAG by status, timeline per job slot, accuracy and composition, engines, what each GPU
    gets."""
    from trtflow.report import REPORT_FILE, RUN_FILE, html, markdown
    from trtflow.report.record import read_record
    from trtflow.util.fs import atomic_write

    if source is None:
        from trtflow.recipe import load_project

        source = load_project(ctx.project_dir).packages_dir.parent / RUN_FILE
    record = read_record(source)
    text = markdown.render(record) if fmt == "md" else html.render(record)
    if out is None and fmt == "md":
        click.echo(text, nl=False)
        return
    target = out or source.parent / REPORT_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, text)
    click.echo(f"wrote {target}", err=True)


def _exit_if_failed(states: list) -> None:
    """Exit 1 when a stage failed (4 when it found something missing from this machine); under --frozen, a failure
    exactly as trtflow.lock records it is a known one and does not fail the run."""
    failed = [s.exit_code or 1 for s in states if s.status == FAILED and not s.expected]
    if failed:
        sys.exit(max(failed))


def _early_executor(project_dir: Path, jobs: int, executor: str | None, ray_address: str | None) -> Any:
    """For a run that may be local: an executor whose first servers start now, before the project is loaded (None for
    Ray). Its module is one the run imports anyway; a project without a store yet gets the model tools' server first.
    Best effort: a server that cannot start here (None) is started, and its problem reported, when a stage needs it;
    a run with nothing to build never meets it."""
    if executor == "ray" or (ray_address and executor is None):
        return None
    from trtflow.errors import TrtflowError
    from trtflow.executors.local import LocalExecutor

    try:
        return LocalExecutor.started_early(jobs, cold=not (project_dir / DEFAULT_STORE).is_dir())
    except (TrtflowError, OSError):
        return None


DEFAULT_STORE = "artifacts/store"  # pipeline.yaml's default `store:` (the early guess need not load the project)


def _run_session(
    ctx: Context, recipes: tuple[str, ...], options: Any, dry_run: bool, as_json: bool, early: Any = None
) -> tuple[list[NodeState] | None, Any]:
    """(final states, the session) of a run (in `early`'s servers if it is local); (None, session) after printing a
    dry run's plan."""
    session = ctx.session(recipes)
    try:
        if dry_run:
            if options.frozen:
                session.frozen_keys()  # the same check a frozen run makes before building anything
            output.print_summary(list(session.plan(options.force).values()), as_json, 0.0, dry_run=True)
            return None, session
        view = None if as_json else progress.progress_view(ctx.verbose, options.jobs)
        try:
            return list(session.run(options, view, early).values()), session
        finally:
            if view is not None:
                view.close()
    finally:
        session.close()


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--layers", is_flag=True, help="Also list every layer of each engine's network (name, type, output type)."
)
def inspect(path: Path, as_json: bool, layers: bool) -> None:
    """Show a package (folder or .tar.gz), a manifest.json, or an engine file."""
    from trtflow.inspection import inspect_path

    info = inspect_path(path)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    elif info["kind"] == "engine":
        output.print_engine(info)
    else:
        output.print_manifest(info["path"], info["manifest"], layers)


@cli.command()
@click.argument("what", type=click.Choice(["manifest", "recipe", "pipeline"]))
def schema(what: str) -> None:
    """Print the JSON Schema of a manifest, a recipe or pipeline.yaml (for editors and validators)."""
    if what == "manifest":
        from trtflow.manifest import manifest_json_schema

        click.echo(json.dumps(manifest_json_schema(), indent=2))
        return
    from trtflow.recipe.schema import Pipeline, recipe_json_schema

    click.echo(json.dumps(recipe_json_schema() if what == "recipe" else Pipeline.model_json_schema(), indent=2))


def _size_option(value: str | None) -> int | None:
    """--memory 16G -> bytes; a bad size is a usage error (exit 2) naming it."""
    if value is None:
        return None
    from trtflow.util.memory import parse_size

    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--memory") from None
