"""The `trtflow` command group, what every command gets (Context), and `main`, which maps errors to exit codes.

Exit codes: docs/reference/exit-codes.md (generated from the error classes in trtflow/errors.py).
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from trtflow import __version__
from trtflow.errors import EnvironmentProblem, InternalError, TrtflowError
from trtflow.util.text import printable


class Context:
    """What every command gets: the project folder and -v."""

    def __init__(self, project_dir: Path, verbose: bool):
        self.project_dir = project_dir
        self.verbose = verbose


pass_context = click.make_pass_decorator(Context)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-C",
    "--project",
    "project_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=".",
    show_default=True,
    help="Folder holding pipeline.yaml.",
)
@click.option("-v", "--verbose", is_flag=True, help="Show details (tracebacks of failed stages, build logs).")
@click.version_option(__version__, prog_name="trtflow")
@click.pass_context
def cli(ctx: click.Context, project_dir: Path, verbose: bool) -> None:
    """Build TensorRT engines for a GPU fleet from declarative recipes, rebuilding only what changed."""
    ctx.obj = Context(project_dir, verbose)


def main(argv: list[str] | None = None) -> Any:
    """Entry point: run the CLI, turning expected errors into one line and an exit code."""
    given = argv if argv is not None else sys.argv[1:]
    verbose = "-v" in given or "--verbose" in given
    # --json: a failure before the command printed its own JSON is also a JSON object on stdout
    printed = _Printed(Printable(sys.stdout)) if "--json" in given else None
    # what trtflow prints may quote a file it read (a lock, a run.json, a remote's report): no control character of
    # one reaches the terminal
    with (
        contextlib.redirect_stdout(printed or Printable(sys.stdout)),
        contextlib.redirect_stderr(Printable(sys.stderr)),
    ):
        return _run(argv, verbose, printed)


def _run(argv: list[str] | None, verbose: bool, printed: _Printed | None) -> Any:
    """The CLI, its expected errors turned into one line and an exit code."""
    try:
        return cli.main(args=argv, prog_name="trtflow", standalone_mode=False)
    except click.exceptions.Abort:  # Ctrl-C (click turns KeyboardInterrupt into Abort): one line
        click.echo("interrupted: what finished is kept in the store; run again to go on from there", err=True)
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
        click.echo(error_lines(str(exc)), err=True)
        _json_failure(printed, str(exc), exc.exit_code)
        sys.exit(exc.exit_code)
    except Exception as exc:  # a bug: show everything needed to report it (unless a write found no room)
        _exit_if_write_failed(exc, printed)
        traceback.print_exc()
        click.echo(f"trtflow: internal error: {type(exc).__name__}: {exc} (please report this)", err=True)
        sys.exit(InternalError.exit_code)


def _exit_if_write_failed(exc: Exception, printed: _Printed | None) -> None:
    """A write the disk, a quota or permissions refused (packages, trtflow.lock) is one line, exit 4, not a bug."""
    from trtflow.store import WRITE_ERRNOS

    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
        where = f" {exc.filename}" if exc.filename else ""
        said = f"cannot write{where}: {exc.strerror} (disk full, file size limit or quota reached, or no permission?)"
        click.echo(f"error: {said}", err=True)
        _json_failure(printed, said, EnvironmentProblem.exit_code)
        sys.exit(EnvironmentProblem.exit_code)


def _json_failure(printed: _Printed | None, error: str, exit_code: int) -> None:
    """With --json, unless the command printed its own JSON already: `{"error": ..., "exit_code": ...}` on stdout, so
    a script parsing it is not left with nothing."""
    if printed is not None and not printed.written:
        click.echo(json.dumps({"error": error, "exit_code": exit_code}))


class Printable:
    """A text stream that shows control characters as `\\xNN` (util.text.printable); `raw` is the stream beneath,
    for the live progress bar's own escape sequences."""

    def __init__(self, stream: Any):
        self.raw: Any = stream.raw if isinstance(stream, Printable) else stream

    def write(self, text: str) -> int:
        """Write `text` with its control characters shown, not obeyed."""
        self.raw.write(printable(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class _Printed:
    """stdout, remembering whether anything was written to it."""

    def __init__(self, stream: Any):
        self.stream, self.written = stream, False

    def write(self, text: str) -> int:
        """Write through, and remember it."""
        self.written = self.written or bool(text)
        return int(self.stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def error_lines(text: str) -> str:
    """Each line of an error as `error: <line>`; an indented line continues the one before it and stays as it is,
    so a block to paste (validate's `exclude:`) comes out pasteable."""
    return "\n".join(line if line[:1].isspace() else f"error: {line}" for line in text.split("\n"))
