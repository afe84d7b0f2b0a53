"""The pipeline's commands: validate, plan, run, report, inspect, schema."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from trtflow.cli import output, progress
from trtflow.cli.app import Context, cli, pass_context
from trtflow.services import describing, running


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
    with _progress(ctx.verbose, 1, export) as view:
        done = running.validate_project(ctx.project_dir, export, view())
    output.print_warnings(list(done.warnings))
    click.echo(f"ok: {done.recipes} recipe(s), {done.targets} target(s), {done.stages} stage(s)")


@cli.command()
@click.argument("recipes", nargs=-1)
@click.option("--explain", is_flag=True, help="Name what changed since the last run for every stale stage.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_context
def plan(ctx: Context, recipes: tuple[str, ...], explain: bool, as_json: bool) -> None:
    """Show every stage and whether it is cached, new, or stale (and why). Writes nothing."""
    planned = running.plan_project(ctx.project_dir, recipes)
    states = list(planned.nodes)
    output.print_warnings(list(planned.notes))
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
    options = running.RunOptions(
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
    with _progress(ctx.verbose, jobs, not as_json) as view:
        result = running.run_project(ctx.project_dir, recipes, options, view, dry_run, not no_report)
    if result.report is not None:
        click.echo(f"report: {result.report}", err=True)
    output.print_summary(result, as_json)
    if result.exit_code:
        sys.exit(result.exit_code)


@contextlib.contextmanager
def _progress(verbose: bool, jobs: int, shown: bool) -> Iterator[Callable[[], Any]]:
    """A maker of the progress view (none if not `shown`), closed once the command is done with it."""
    views: list[Any] = []

    def make() -> Any:
        if not shown:
            return None
        views.append(progress.progress_view(verbose, jobs))
        return views[-1]

    try:
        yield make
    finally:
        for view in views:
            view.close()


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
    text, target = running.render_report(ctx.project_dir, source, out, fmt)
    if target is None:
        click.echo(text, nl=False)
        return
    click.echo(f"wrote {target}", err=True)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--layers", is_flag=True, help="Also list every layer of each engine's network (name, type, output type)."
)
def inspect(path: Path, as_json: bool, layers: bool) -> None:
    """Show a package (folder or .tar.gz), a manifest.json, or an engine file."""
    info = describing.inspect(path)
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
    click.echo(json.dumps(describing.json_schema(what), indent=2))


def _size_option(value: str | None) -> int | None:
    """--memory 16G -> bytes; a bad size is a usage error (exit 2) naming it."""
    if value is None:
        return None
    from trtflow.util.memory import parse_size

    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--memory") from exc
