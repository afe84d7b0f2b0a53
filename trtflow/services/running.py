"""The project's pipeline below the CLI: validate, plan, run and report, each one call that returns a value.

Run policy lives here, not in the commands: the no-op memo that answers a run without loading the project, the
executor started early (its servers boot while the project loads), and the report a run writes beside its packages.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.errors import TrtflowError
from trtflow.run import runmemo
from trtflow.run.options import RunOptions
from trtflow.run.result import RunResult, frozen_mapping
from trtflow.states import CACHED, FAILED, SKIPPED, NodeState
from trtflow.util.early_server import DEFAULT_STORE
from trtflow.util.reads import recording as reads_recording

if TYPE_CHECKING:
    from trtflow.run.runner import Listener
    from trtflow.run.session import Session

__all__ = ["RunOptions", "RunResult", "plan_project", "render_report", "run_project", "validate_project"]


@dataclass(frozen=True)
class Validation:
    """What `validate` found: counts for its line, and warnings (idle recipes, integer inputs it cannot place)."""

    recipes: int
    targets: int
    stages: int
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """Every selected node's state, and what the store did on its own while planning."""

    nodes: tuple[NodeState, ...]
    notes: tuple[str, ...]


def validate_project(project_dir: Path, export: bool, listener: Listener | None = None) -> Validation:
    """Check pipeline.yaml, every recipe and every model (after running the export stages, if `export`): ProjectError
    listing every refusal at once; the failed export's reason (exit 1) if an export fails."""
    from trtflow.modelcheck import unknown_integer_inputs
    from trtflow.run.session import Session

    session = Session.open(project_dir, keep_refusals=True)
    project = session.project
    if export:
        result = session.run_exports(listener)
        if result.failed:
            raise StageFailed(result)
    project.refuse([refusal for item in project.recipes for refusal in item.refusals] + session.check_models())
    warnings = session.idle_recipes() + [
        line for item in project.recipes for line in unknown_integer_inputs(item, project.root)
    ]
    return Validation(len(project.recipes), len(project.pipeline.targets), len(session.dag), tuple(warnings))


class StageFailed(TrtflowError):
    """A stage `validate --export` ran failed: its reason is already shown by the progress; exit as the run would."""

    def __init__(self, result: RunResult):
        failed = result.failed[0]
        super().__init__(f"{failed.node.id}: {failed.reason}")
        self.exit_code = result.exit_code
        self.result = result


def plan_project(project_dir: Path, recipes: tuple[str, ...] = (), force: bool = False) -> Plan:
    """The plan of the selected recipes (all by default), written nowhere."""
    from trtflow.run.session import Session

    session = Session.open(project_dir, recipes)
    try:
        states = tuple(session.plan(force).values())
        return Plan(states, tuple(session.store_notes()))
    finally:
        session.close()


def run_project(
    project_dir: Path,
    recipes: tuple[str, ...],
    options: RunOptions,
    listener: Callable[[], Listener | None] = lambda: None,
    dry_run: bool = False,
    write_report: bool = True,
) -> RunResult:
    """Run the stale stages of the selected recipes (all by default): a whole-project run the no-op memo knows is
    answered from it; otherwise the run (its executor's servers started before the project loads), then the memo
    updated and the report written if the run did something. `listener` makes the progress view once the run starts
    (not for a memo's answer or a dry run)."""
    started, started_ns = time.perf_counter(), time.time_ns()
    whole_project = not (
        recipes
        or options.force
        or options.retry_failed
        or dry_run
        or options.frozen
        or options.remote_required
        or options.check_repro
    )
    remembered = runmemo.remembered_nodes(project_dir.resolve()) if whole_project else None
    if remembered is not None:  # nothing the last no-op read has changed: that no-op's answer
        nodes = tuple(runmemo.remembered_state(entry) for entry in remembered)
        return RunResult(nodes, time.perf_counter() - started, options.jobs, from_memo=True)
    if dry_run:
        return _dry_run(project_dir, recipes, options)
    early = _early_executor(project_dir, options)  # its servers' imports overlap the run's own, from here on
    try:
        from trtflow.run.session import Session

        with reads_recording() as reads:
            session = Session.open(project_dir, recipes)
            try:
                result = session.run(options, listener(), early)
            finally:
                session.close()
    finally:
        if early is not None:
            early.shutdown()  # done already, unless the run stopped before using it (a project error)
    if whole_project and session.remembers_no_op(result):
        runmemo.remember(
            session.project.root, reads, [s.to_json() for s in result.nodes], started_ns, session.project.store_dir
        )
    elif any(s.status != CACHED for s in result.nodes):
        runmemo.forget(session.project.root)
    # a run that did nothing writes nothing (runmemo), unless the last report shows other failures than this run
    if write_report and (not result.did_nothing or _report_outdated(session.project.packages_dir.parent, result)):
        return _with_report(session, result)
    return result


def _dry_run(project_dir: Path, recipes: tuple[str, ...], options: RunOptions) -> RunResult:
    """The plan as a dry run's result (under --frozen, after the same check a frozen run makes before building)."""
    from trtflow.run.session import Session

    session = Session.open(project_dir, recipes)
    try:
        if options.frozen:
            session.frozen_keys()
        planned = session.plan(options.force)
        return RunResult(tuple(planned.values()), 0.0, options.jobs, dry_run=True, planned=frozen_mapping(planned))
    finally:
        session.close()


def _early_executor(project_dir: Path, options: RunOptions) -> Any:
    """For a run that may be local: an executor whose first servers start now, before the project is loaded (None for
    Ray). Its module is one the run imports anyway; a project without a store yet gets the model tools' server first.
    Best effort: a server that cannot start here (None) is started, and its problem reported, when a stage needs it;
    a run with nothing to build never meets it."""
    if options.executor == "ray" or (options.ray_address and options.executor is None):
        return None
    from trtflow.executors.local import LocalExecutor

    try:
        return LocalExecutor.started_early(options.jobs, cold=not (project_dir / DEFAULT_STORE).is_dir())
    except (TrtflowError, OSError):
        return None


def _report_outdated(folder: Path, result: RunResult) -> bool:
    """Whether the last run.json shows other stages, or other failed and skipped ones, than this result: after a
    failure, a fix found whole in the cache must not leave the old failures on the report as current."""
    from trtflow.report import RUN_FILE

    try:
        shown = json.loads((folder / RUN_FILE).read_text())["nodes"]
        before = {(n["id"], n["status"] in (FAILED, SKIPPED)) for n in shown}
    except (OSError, ValueError, KeyError, TypeError):
        return True
    return before != {(s.node.id, s.status in (FAILED, SKIPPED)) for s in result.nodes}


def _with_report(session: Session, result: RunResult) -> RunResult:
    """run.json and report.html beside the packages; a report that cannot be written is a warning, not a failed run."""
    from trtflow.report import REPORT_FILE
    from trtflow.report.html import render
    from trtflow.report.record import run_record, write_record
    from trtflow.util.fs import atomic_write

    folder = session.project.packages_dir.parent
    try:
        record = run_record(session.project, result)
        write_record(folder, record)
        atomic_write(folder / REPORT_FILE, render(record))
    except OSError as exc:
        warning = f"could not write the run report in {folder}: {exc}"
        return dataclasses.replace(result, warnings=(*result.warnings, warning))
    return dataclasses.replace(result, report=str(folder / REPORT_FILE))


def render_report(project_dir: Path, source: Path | None, out: Path | None, fmt: str) -> tuple[str, Path | None]:
    """The report of a run record (run.json beside the project's packages by default) as html or md: (text, where it
    was written); md without `out` is only returned, for stdout."""
    from trtflow.recipe import load_project
    from trtflow.report import REPORT_FILE, RUN_FILE, html, markdown
    from trtflow.report.record import read_record
    from trtflow.util.fs import atomic_write

    if source is None:
        source = load_project(project_dir).packages_dir.parent / RUN_FILE
    record = read_record(source)
    text = markdown.render(record) if fmt == "md" else html.render(record)
    if out is None and fmt == "md":
        return text, None
    target = out or source.parent / REPORT_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, text)
    return text, target
