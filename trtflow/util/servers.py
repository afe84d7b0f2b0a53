"""Where a stage kind's nodes run (Stage.runs_in; executors.local), named here so that a run can start its first
server before it imports the stages (util.early_server), and how a server is started and ended.

Forked by a hermetic build server (its own environment, pinned threads), forked by the model tools' server (they are
imported once; the leftovers leave with each child), forked by a server of their own that runs user code (a child per
node, so a crash names itself; the server imports only the fixed modules a node names, so every child of a source
kind starts alike; a fresh process each where processes cannot fork), or a pool of spawned workers.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from trtflow.util.proc import die_with_parent
from trtflow.util.settings import Settings

BUILD_SERVER, TOOLS_SERVER, USER_CODE_SERVER, POOL = "build-server", "tools-server", "user-code-server", "pool"
# A folder the model tools' servers of one run share (its path in this variable): what one stage computed that the
# run's other stages would compute again (stages.shared_outputs: the fp32 outputs over the check feeds).
SHARED_OUTPUTS_ENV = "TRTFLOW_SHARED_OUTPUTS"


def spawn(where: str, hermetic: bool, slot: Path, env: dict[str, str], preexec: Callable[[], None]) -> subprocess.Popen:
    """A worker server for the stage kinds that run in `where` (executors.worker), in its slot folder, talking on its
    stdin and stdout."""
    return subprocess.Popen(
        [sys.executable, "-m", "trtflow.executors.worker", "--serve" if hermetic else "--serve-plain", where],
        env=env,
        cwd=slot,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        preexec_fn=preexec,
    )


def spawn_plain(where: str, slot: Path, shared: Path | None) -> subprocess.Popen:
    """A plain (non-hermetic) worker server: this process's environment with the tools' overlay
    (util.settings.Settings.pinned_env), naming the folder the run's model tools' servers share where given, and
    dying with this process. The one way both a run and the command's early start (util.early_server) start one, so
    the server a run takes over is the one it would have started."""
    env = {**Settings.pinned_env(), **({SHARED_OUTPUTS_ENV: str(shared)} if shared is not None else {})}
    return spawn(where, False, slot, env, die_with_parent)


def end(process: subprocess.Popen) -> None:
    """End a server that holds no task (idle, or its task has ended): killed, not left to unload its libraries (0.6 s
    with torch, at the end of every run); its pipes closed, reaped."""
    process.kill()
    process.communicate()
