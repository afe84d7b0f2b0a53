"""Error classes. Core code raises these; only the CLI turns them into exit codes and output.

A user error (bad recipe, missing file, failed stage) prints as one line with no traceback.
An `InternalError` is a broken assumption in trtflow itself and is shown with a traceback.
"""

from __future__ import annotations


class TrtflowError(Exception):
    """Base class for every error trtflow expects and explains."""

    exit_code = 1


class ProjectError(TrtflowError):
    """pipeline.yaml or a recipe is malformed, invalid or points at something missing."""

    exit_code = 3


class EnvironmentProblem(TrtflowError):
    """A required package or device is not available here (the message says how to get it)."""

    exit_code = 4


class StageError(TrtflowError):
    """A stage ran and failed; the run goes on with unrelated work and exits non-zero."""

    exit_code = 1


class InternalError(TrtflowError):
    """A broken internal assumption: a bug in trtflow, please report it."""

    exit_code = 70
