"""Every error class trtflow raises on purpose, with its exit code. Core code raises these; only the CLI turns them
into output and exit codes (`exit_code_table` writes the table the docs show).

A user error (bad recipe, missing file, failed stage) prints as one line with no traceback.
An `InternalError` is a broken assumption in trtflow itself and is shown with a traceback.
"""

from __future__ import annotations

from typing import TypeVar

_T = TypeVar("_T")


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


def required(value: _T | None, what: str) -> _T:
    """`value`, which only a bug in trtflow leaves None (an InternalError naming `what` then)."""
    if value is None:
        raise InternalError(f"{what} is missing")
    return value


# store/objects -------------------------------------------------------------------------------------------------


class ObjectMismatch(TrtflowError):
    """A file offered as a known object hashes to something else (a tampered or truncated download)."""

    def __init__(self, expected: str, actual: str):
        super().__init__(f"expected sha256 {expected[:16]}..., got {actual[:16]}...")
        self.expected, self.actual = expected, actual


class StoreWriteError(EnvironmentProblem):
    """A write into the store failed: the disk is full, a size limit or quota was hit, or access is denied."""


# store/locks ---------------------------------------------------------------------------------------------------


class StoreBusy(TrtflowError):
    """gc cannot run now: a run is using the store (or another gc is running). Exit 6: try again later."""

    exit_code = 6


# store/remote --------------------------------------------------------------------------------------------------


class RemoteUnavailable(EnvironmentProblem):
    """The remote cache could not be reached or refused access, and the run was told to require it."""


# util/archive --------------------------------------------------------------------------------------------------


class UnsafeArchive(TrtflowError):
    """An archive member would be written outside the destination or is not a plain file."""


# signing -------------------------------------------------------------------------------------------------------


class SignatureRejected(TrtflowError):
    """An envelope is unsigned, signed by no trusted key, or its signature does not verify."""


# provenance ----------------------------------------------------------------------------------------------------


class UntrustedPackage(TrtflowError):
    """--require-signature: the package has no provenance a trusted key signed for exactly these bytes."""

    exit_code = 3


# report --------------------------------------------------------------------------------------------------------


class NoRunRecord(ProjectError):
    """There is no run record to report on (nothing has run, or the file is not one)."""


# deploy/choice -------------------------------------------------------------------------------------------------


class BadRequest(TrtflowError):
    """A provision option has a value that cannot be understood."""

    exit_code = 2


class NoEngineFits(TrtflowError):
    """No engine of the package can run on the device; the message lists why, per engine."""

    exit_code = 5


# deploy/provision ----------------------------------------------------------------------------------------------


class TamperedEngine(TrtflowError):
    """An engine's bytes do not match the sha256 its manifest records."""

    exit_code = 3


# deploy/install ------------------------------------------------------------------------------------------------


class BadDestination(TrtflowError):
    """--dest cannot be a folder (it is under a file, or somewhere nothing can be made)."""

    exit_code = 3


# deploy/plugins ------------------------------------------------------------------------------------------------


class BadPluginDir(TrtflowError):
    """--plugin-dir is not a folder that can be read."""

    exit_code = 2


# deploy/preflight ----------------------------------------------------------------------------------------------


class PreflightRefused(TrtflowError):
    """The device's runtime or driver cannot load the chosen engine (said before `current` flips)."""

    exit_code = 5


# deploy/remote -------------------------------------------------------------------------------------------------


class NotPublishable(TrtflowError):
    """`trtflow publish` was given something that is not an intact package folder."""

    exit_code = 3


class RemoteUnreachable(EnvironmentProblem):
    """The package URL could not be read or written (network, credentials, permissions)."""


# deploy/channels -----------------------------------------------------------------------------------------------


class BadRollout(TrtflowError):
    """A rollout command cannot be done (nothing to roll back to, an unknown version, a bad share)."""

    exit_code = 2


class BadChannel(TrtflowError):
    """A channel or version on the remote is malformed, or names what it must not."""

    exit_code = 3


# deploy/agent --------------------------------------------------------------------------------------------------


class HealthCheckFailed(TrtflowError):
    """The health command failed on the new engine; `current` was left as it was."""

    exit_code = 1


class AgentBusy(TrtflowError):
    """Another agent holds the destination's lock."""

    exit_code = 6


# deploy/triton -------------------------------------------------------------------------------------------------


class CannotExport(TrtflowError):
    """The packages cannot become the requested deployment (wrong backend, disagreeing I/O, ambiguous choice)."""

    exit_code = 3


# the exit-code table ---------------------------------------------------------------------------------------------

# Codes no class carries: what they mean.
OTHER_EXIT_CODES = {
    0: "success: every selected stage built or was found cached (provision: the engine is installed)",
    2: "bad command line (click), or an option value that cannot be understood",
    130: "interrupted (Ctrl-C)",
}


def error_classes() -> list[type[TrtflowError]]:
    """Every error class defined here, in the order of the file."""
    return [v for v in globals().values() if isinstance(v, type) and issubclass(v, TrtflowError)]


def exit_code_table() -> str:
    """The exit codes as a Markdown table: each code, then the errors that exit with it and what they mean."""
    rows: dict[int, list[str]] = {code: [text] for code, text in OTHER_EXIT_CODES.items()}
    for cls in error_classes():
        doc = (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        rows.setdefault(cls.exit_code, []).append(f"`{cls.__name__}`: {doc}")
    lines = ["| exit code | when |", "|---|---|"]
    lines += [f"| {code} | {'<br>'.join(rows[code])} |" for code in sorted(rows)]
    return "\n".join(lines) + "\n"
