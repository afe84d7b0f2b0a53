"""How a fallback search judges its trials: a trial keeps some candidates in high precision, and is run over the
accuracy check's samples with the check's emulation, against the fp32 outputs computed once.

Each trial is a model of its own (int8/fp8: the switched model wired for it, fallback_switch; fp16/bf16: a copy
rewritten by fallback_autocast.Keeper), loaded into sessions of its own. An int8/fp8 ranking runs its trials from
where they differ (fallback_cuts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from trtflow.stages import accuracy, compare, precomputed
from trtflow.util.stage_progress import Notes, silent

Run = Callable[[list[dict]], list[dict]]  # feeds -> each feed's outputs by name, in feed order


@dataclass(frozen=True)
class Trial:
    """What a search judges its trials by: the same samples, fp32 outputs and limits as the accuracy check."""

    saved: Path  # the first reduced-precision model, beside whose files the trial models are written
    feeds: list[dict]
    want: list[dict]
    sets: dict[str, int]
    tolerance: dict
    task: Any = None  # task.Limit: with labelled rows and a max_drop, a trial must hold it too
    source: Path | None = None  # the fp32 model: the weights of nodes an fp16/bf16 trial keeps in fp32
    say: Notes = silent  # what the search is doing now, for the run's heartbeat (stage_progress)
    # the trial models' weight chains computed so far (precomputed.prepared): most are the same in every trial
    chain_values: dict[bytes, Any] = field(default_factory=dict, compare=False, repr=False)

    def say_measuring(self, units: list[list[Any]]) -> None:
        """The heartbeat's line as a ranking starts: how many groups or nodes it measures."""
        what = "groups" if any(len(unit) > 1 for unit in units) else "nodes"
        self.say(f"fallback: measuring the sensitivity of {len(units)} {what}")

    def say_measured(self, done: int, total: int) -> None:
        """The heartbeat's line as a ranking goes: how many of its units are measured."""
        self.say(f"fallback: sensitivity measured for {done} of {total}")

    def meets(self, run: Run, step: int) -> bool:
        """Whether the trial `run` computes meets every limit: each output's, and max_drop on the labelled rows where
        given. The feeds run `step` at a time, and a trial that already misses a limit no further feed can redeem
        (accuracy.failed_for_good, accuracy.top1_out_of_reach) is judged without the rest: the same answer, for
        less."""
        got: list[dict] = []
        judged: list[dict] = []
        for start in range(0, len(self.feeds), step):
            got += run(self.feeds[start : start + step])
            judged = accuracy.judged(got, self.want[: len(got)], self.sets, self.tolerance)
            if accuracy.failed_for_good(judged, self.tolerance) or accuracy.top1_out_of_reach(
                got, self.want, self.sets, self.tolerance
            ):
                return False
        if not all(o["passed"] for o in judged):
            return False
        return self.task is None or self.task.holds_for(run)

    def judged(self, run: Run, samples: int | None) -> list[dict]:
        """Per output numbers of the trial `run` computes over the first `samples` feeds (all by default)."""
        return self.numbers(run(self.feeds[:samples]))

    def numbers(self, got: list[dict]) -> list[dict]:
        """Per output numbers of a trial's outputs over the first feeds, one per feed."""
        return accuracy.judged(got, self.want[: len(got)], self.sets, self.tolerance)

    @cached_property
    def threads(self) -> int:
        """As many sessions as the saved model's size allows at once (compare.threads_for); its files are sized once
        for every trial of the search."""
        return compare.threads_for(compare.model_bytes(self.saved))

    def sessions(self, runnable: Any) -> Callable[[], Any]:
        """A maker of ONNX Runtime sessions of a trial model, its weights read from beside the saved model, its
        constant Q/DQ chains computed once for all of them (stages.precomputed). Each runs on one thread, as every
        comparison trtflow makes: the numbers, and so the nodes chosen, are the same whichever session ran a sample."""
        made = precomputed.prepared(self.saved, runnable, self.chain_values)
        return lambda: precomputed.session(self.saved, made)


class Judge:
    """A search's trials, each named by `high` (the candidates it keeps in high precision) and made by `model(high)`
    as the check's emulation runs it, each loaded into sessions of its own."""

    def __init__(self, trial: Trial, model: Callable[[list[str]], Any]):
        self.trial, self.model = trial, model

    def meets(self, high: list[str]) -> bool:
        """Whether the trial keeping `high` meets every limit (Trial.meets)."""
        with self._runner(high) as run:
            return self.trial.meets(run, self.trial.threads)

    def outputs(self, high: list[str], samples: int | None = None) -> list[dict]:
        """Per output numbers of the trial keeping `high` over the first `samples` feeds (all by default: a ranking
        takes a few, and runs several trials at once, each on one thread)."""
        with self._runner(high, 1 if samples is not None else self.trial.threads) as run:
            return self.trial.judged(run, samples)

    @contextmanager
    def _runner(self, high: list[str], threads: int | None = None) -> Iterator[Run]:
        with compare.SessionPool(self.trial.sessions(self.model(high)), threads or self.trial.threads) as sessions:
            yield sessions.run
