"""What `trtflow run` was asked for, as one value the session, the runner and the CLI share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunOptions:
    """What `trtflow run` was asked for: parallel stages, rebuild everything, hold to the lock, need the remote."""

    jobs: int = 1
    force: bool = False
    retry_failed: bool = False  # run again the stages whose own failure is recorded under their key
    memory: int | None = None  # bytes the stages running at once may take together (None: no limit)
    frozen: bool = False
    remote_required: bool = False
    check_repro: int = 0  # after the run, rebuild every selected engine this many times in hermetic workers (repro.py)
    executor: str | None = None  # "local" or "ray"; None: what pipeline.yaml says (local if nothing)
    ray_address: str | None = None  # overrides executor.ray.address of pipeline.yaml
    builds_alone: bool = False  # a build runs with no other stage beside it (admission.beside_builds): same bytes
