"""`trtflow agent`: provision from a channel in a loop, one agent per destination, and say how it went.

Each round polls (deploy/rollout.py), then writes `<dest>/status.json` (version, channel, last check, last error)
and, when asked, sends it to `<url>/devices/<device-id>.json` for `trtflow fleet status`. After a success the next
round is `interval` away (+-10% jitter, so a fleet started together drifts apart); after the n-th failure in a row
it is a random delay in [d/2, d], d = min(cap, base * 2^(n-1)) ("equal jitter": never two retries in lockstep, never
more than `cap`). A health command runs against the new engine before `current` flips (deploy.install's check); a
failing one leaves `current` as it was and is the round's error. `--once` is one round, for cron.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock, Timeout

from trtflow.deploy.install import BadDestination
from trtflow.errors import AgentBusy, HealthCheckFailed, TrtflowError
from trtflow.manifest import Engine
from trtflow.util.fs import read_regular, real_dir, write_nofollow
from trtflow.util.jsondata import loads_bounded
from trtflow.util.text import clipped

STATUS_FILE = "status.json"
MAX_STATUS_BYTES = 64 << 10


@dataclass(frozen=True)
class Schedule:
    """Seconds between rounds after a success, and the backoff after failures."""

    interval: float = 300.0
    base: float = 10.0
    cap: float = 900.0


def next_delay(failures: int, schedule: Schedule, rng: random.Random) -> float:
    """Seconds to the next round: interval +-10% after a success, equal-jitter exponential backoff after failures."""
    if failures <= 0:
        return schedule.interval * rng.uniform(0.9, 1.1)
    ceiling = min(schedule.cap, schedule.base * 2 ** min(failures - 1, 30))
    return rng.uniform(ceiling / 2, ceiling)


def health_check(command: str, timeout: float) -> Callable[[Engine, Path], dict]:
    """A check running `command <engine path>` with TRTFLOW_ENGINE (and _SHA256) set; exit 0 passes."""

    def check(engine: Engine, path: Path) -> dict:
        env = {**os.environ, "TRTFLOW_ENGINE": str(path), "TRTFLOW_ENGINE_SHA256": engine.sha256}
        try:
            done = subprocess.run(
                [*shlex.split(command), str(path)], capture_output=True, text=True, env=env, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise HealthCheckFailed(
                f"--health-cmd {command!r} on {path}: no answer within {timeout:g} s; `current` left as it was"
            ) from None
        except OSError as exc:
            raise HealthCheckFailed(f"--health-cmd {command!r}: cannot run it: {exc.strerror or exc}") from exc
        if done.returncode != 0:
            said = clipped(
                (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1], 300
            )
            raise HealthCheckFailed(
                f"--health-cmd {command!r} on {path}: exit {done.returncode}: {said}; `current` left as it was"
            )
        return {"health": f"passed: {command} (exit 0)"}

    return check


@contextlib.contextmanager
def agent_lock(dest: Path) -> Iterator[None]:
    """Hold `<dest>/.agent.lock` (flock: also seen by an agent reaching the same folder through another mount point)."""
    if dest.is_symlink():
        raise BadDestination(f"--dest {dest}: is a symlink; refusing to install through it (remove it)")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadDestination(f"--dest {dest}: cannot make the folder: {exc.strerror or exc}") from exc
    lock = dest / ".agent.lock"
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        raise BadDestination(f"--dest {dest}: {lock} is not a regular file; remove it")
    try:
        with FileLock(str(lock), timeout=0):
            yield
    except Timeout:
        raise AgentBusy(f"--dest {dest}: another trtflow agent holds {lock}; one agent per destination") from None


def read_status(dest: Path) -> dict:
    """The last status.json of the destination ({} when there is none or it is not one)."""
    try:
        value = loads_bounded(read_regular(dest / STATUS_FILE, MAX_STATUS_BYTES + 1), MAX_STATUS_BYTES)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def one_round(
    poll: Callable[[], dict], dest: Path, identity: dict, now: Callable[[], float] = time.time
) -> tuple[dict, TrtflowError | None]:
    """Poll once; (the new status, written to status.json, and the error if the poll failed)."""
    before = read_status(dest)
    stamp = datetime.fromtimestamp(now(), timezone.utc).isoformat(timespec="seconds")
    kept = {k: before.get(k) for k in ("version", "recipe", "engine_sha256", "last_success")}
    error = None
    try:
        record = poll()
        status = {
            **identity,
            "version": record.get("version"),
            "recipe": record.get("recipe"),
            "engine_sha256": record["written"]["sha256"],
            "action": record.get("action"),
            "share_bp": record.get("share_bp"),
            "last_check": stamp,
            "last_success": stamp,
            "last_error": None,
            "consecutive_failures": 0,
            "transfer_bytes": (record.get("transfer") or {}).get("bytes"),
        }
    except TrtflowError as exc:
        error = exc
        status = {
            **identity,
            **kept,
            "action": "failed",
            "last_check": stamp,
            "last_error": clipped(str(exc).splitlines()[0], 500),
            "consecutive_failures": int(before.get("consecutive_failures") or 0) + 1,
        }
    if real_dir(dest):
        write_nofollow(dest / STATUS_FILE, (json.dumps(status, indent=1) + "\n").encode())
    return status, error


def run(
    round_: Callable[[], tuple[dict, TrtflowError | None]],
    schedule: Schedule,
    max_runtime: float | None,
    rng: random.Random,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict:
    """Rounds until `max_runtime` seconds have passed (forever without it); the last status."""
    deadline = None if max_runtime is None else clock() + max_runtime
    while True:
        status, _ = round_()
        delay = next_delay(int(status.get("consecutive_failures") or 0), schedule, rng)
        if deadline is not None and clock() + delay > deadline:
            return status
        sleep(delay)
