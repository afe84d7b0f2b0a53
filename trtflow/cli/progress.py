"""Progress while a run works: a line per finished stage (PlainView), or a live table with an ETA on a terminal
(RichView)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from trtflow.cli.output import repro_line
from trtflow.states import CACHED, FAILED, SKIPPED, NodeState
from trtflow.util import stage_progress


def outcome(state: NodeState) -> str:
    """What follows a finished stage's line: the one-line reason of a failure or skip, why a cached one was
    (pulled...)."""
    if state.status in (FAILED, SKIPPED):
        return f": {state.reason}"
    return f"  ({state.reason})" if state.status == CACHED and state.reason else ""


class PlainView:
    """One line per started and finished stage: for logs and CI, where a live display would be noise. A stage that
    runs long says so every TRTFLOW_HEARTBEAT_SECONDS (30 by default), so a log never goes quiet for minutes."""

    def __init__(self, verbose: bool, heartbeat: bool = True):
        self.verbose = verbose
        self.done = 0
        self.running: dict[str, float] = {}  # node id -> when it started (monotonic seconds)
        self.workdirs: dict[str, Path] = {}  # node id -> where its stage says what it is doing
        self.every = float(os.environ.get("TRTFLOW_HEARTBEAT_SECONDS", "30"))
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        if heartbeat:
            threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def _beat(self) -> None:
        """Every `every` seconds: `still    <stage>  (running for 95 s)` for each stage running that long."""
        while not self.stopped.wait(self.every):
            now = time.monotonic()
            with self.lock:
                long_running = sorted(
                    (node, now - began, self.workdirs.get(node)) for node, began in self.running.items()
                )
            for node, seconds, workdir in long_running:
                if seconds >= self.every:
                    said = stage_progress.read(workdir) if workdir is not None else None
                    doing = f": {said}" if said else ""
                    click.echo(f"{'still':<8} {node}  (running for {seconds:.0f} s{doing})", err=True)

    def __call__(self, event: str, state: Any) -> None:
        """Show one runner event (a stage started or finished)."""
        if event == "plan":
            return
        if event == "workdir":
            node, workdir = state
            with self.lock:
                self.workdirs[node] = workdir
            return
        if event == "warning":
            click.echo(f"warning: {state}", err=True)
            return
        if event == "repro":
            click.echo(f"repro    {repro_line(state)}", err=True)
            return
        if event in ("start", "wait"):
            click.echo(f"{'run' if event == 'start' else 'wait':<8} {state.node.id}  ({state.label})", err=True)
            if event == "start":
                with self.lock:
                    self.running[state.node.id] = time.monotonic()
            return
        with self.lock:
            self.running.pop(state.node.id, None)
            self.workdirs.pop(state.node.id, None)
        self.done += 1
        if state.status == CACHED and not (self.verbose or state.reason):
            return
        timing = f" in {state.seconds:.2f} s" if state.seconds is not None else ""
        click.echo(f"{state.label.split(':')[0]:<8} {state.node.id}{timing}{outcome(state)}", err=True)
        if self.verbose and state.detail:
            click.echo(state.detail, err=True)

    def close(self) -> None:
        """Stop the heartbeat."""
        self.stopped.set()


class Eta:
    """Total, done, failed and the time left of the stages a run will execute, from the seconds each took last time
    (a stage that never ran is guessed at the mean of its kind's known ones, else of all known ones)."""

    def __init__(self, jobs: int = 1):
        self.jobs, self.total, self.done, self.failed = max(jobs, 1), 0, 0, 0
        self.left: dict[str, float | None] = {}  # node id -> seconds it should take (None: unknown)

    def plan(self, estimates: dict[str, float | None]) -> None:
        """The nodes that will run and their seconds last time (None: unknown)."""
        known = [s for s in estimates.values() if s is not None]
        by_kind: dict[str, list[float]] = {}
        for node_id, seconds in estimates.items():
            if seconds is not None:
                by_kind.setdefault(node_id.split(":")[0], []).append(seconds)
        fallback = sum(known) / len(known) if known else None
        for node_id, seconds in estimates.items():
            kind = by_kind.get(node_id.split(":")[0])
            self.left[node_id] = seconds if seconds is not None else (sum(kind) / len(kind) if kind else fallback)
        self.total = len(estimates)

    def finished(self, state: NodeState) -> None:
        """A node settled: counted when it was one of those to run."""
        if state.node.id in self.left:
            self.left.pop(state.node.id)
            self.done += 1
            self.failed += state.status == FAILED

    def line(self) -> str:
        """`3/12 done, 1 failed, ETA 0:14` (`ETA ?` before anything is known)."""
        known = [s for s in self.left.values() if s is not None]
        if len(known) != len(self.left) or not self.total:
            eta = "?" if self.left else "0:00"
        else:
            left = sum(known) / min(self.jobs, len(known) or 1)
            eta = f"{int(left) // 60}:{int(left) % 60:02d}"
        return f"{self.done}/{self.total} done, {self.failed} failed, ETA {eta}"


class RichView(PlainView):
    """A live progress bar on a terminal (total, done, failed, ETA from earlier runs), with finished stages printed
    above it."""

    def __init__(self, verbose: bool, jobs: int = 1):
        super().__init__(verbose, heartbeat=False)  # the live bar's elapsed time shows a long stage
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.eta = Eta(jobs)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=Console(file=getattr(sys.stderr, "raw", sys.stderr)),  # its own escapes pass (cli.app.Printable)
        )
        self.task = self.progress.add_task("running", total=None, counts="")
        self.progress.start()

    def __call__(self, event: str, state: Any) -> None:
        """Show one runner event (a stage started or finished)."""
        if event == "workdir":  # the live bar shows a long stage by its elapsed time
            return
        if event == "plan":
            self.eta.plan(state)
            self.progress.update(self.task, total=self.eta.total or None, counts=self.eta.line())
            return
        if event in ("warning", "repro"):
            shown = f"warning: {state}" if event == "warning" else f"repro    {repro_line(state)}"
            self.progress.console.print(shown, markup=False, highlight=False)
            return
        if event in ("start", "wait"):
            self.progress.update(
                self.task, description=f"{'running' if event == 'start' else 'waiting for'} {state.node.id}"
            )
            return
        if state.status != CACHED:
            timing = f" in {state.seconds:.2f} s" if state.seconds is not None else ""
            self.progress.console.print(
                f"{state.label.split(':')[0]:<8} {state.node.id}{timing}{outcome(state)}", markup=False, highlight=False
            )
        self.eta.finished(state)
        self.progress.update(self.task, completed=self.eta.done, counts=self.eta.line())

    def close(self) -> None:
        """Stop the live progress display."""
        self.progress.stop()


def progress_view(verbose: bool, jobs: int = 1) -> PlainView:
    """A live progress bar when stderr is a terminal, else one plain line per stage (logs, CI)."""
    return RichView(verbose, jobs) if sys.stderr.isatty() else PlainView(verbose)
