"""How a fallback search judges its trials: a trial keeps some candidates in high precision, and is run over the
accuracy check's samples with the check's emulation, against the fp32 outputs computed once.

Two ways to make a trial, one judge each:
- `Switched` (int8, fp8): one model whose candidates are switched by boolean inputs (fallback_switch); one session per
  thread serves every trial of the search.
- `Rewritten` (fp16, bf16): a copy of the model rewritten per trial (fallback_autocast.Keeper keeps nodes in fp32),
  loaded into sessions of its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.stages import accuracy, compare
from trtflow.stages.emulation import ort_runnable
from trtflow.stages.fallback_switch import switched, switches

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

    def meets(self, run: Run, step: int) -> bool:
        """Whether the trial `run` computes meets every limit: each output's, and max_drop on the labelled rows where
        given. The feeds run `step` at a time, and a trial that already misses a limit no further feed can redeem
        (accuracy.failed_for_good) is judged without the rest: the same answer, for less."""
        got: list[dict] = []
        judged: list[dict] = []
        for start in range(0, len(self.feeds), step):
            got += run(self.feeds[start : start + step])
            judged = accuracy.judged(got, self.want[: len(got)], self.sets, self.tolerance)
            if accuracy.failed_for_good(judged, self.tolerance):
                return False
        if not all(o["passed"] for o in judged):
            return False
        return self.task is None or self.task.holds_for(run)

    def judged(self, run: Run, samples: int | None) -> list[dict]:
        """Per output numbers of the trial `run` computes over the first `samples` feeds (all by default)."""
        return accuracy.judged(run(self.feeds[:samples]), self.want[:samples], self.sets, self.tolerance)

    def threads(self) -> int:
        """As many sessions as the saved model's size allows at once (compare.threads_for)."""
        return compare.threads_for(compare.model_bytes(self.saved))

    def session(self, runnable: Any, threads: int = 1) -> Any:
        """An ONNX Runtime session of a trial model, its weights read from beside the saved model. Each runs on one
        thread, as every comparison trtflow makes: the numbers, and so the nodes chosen, are the same whichever
        session ran a sample."""
        return compare.session_beside(self.saved, runnable, threads)


class Judge(ABC):
    """A search's trials, each named by `high`: the candidates it keeps in high precision."""

    def __init__(self, trial: Trial):
        self.trial = trial
        self._kept = ExitStack()  # what lives as long as the judge

    def meets(self, high: list[str]) -> bool:
        """Whether the trial keeping `high` meets every limit (Trial.meets)."""
        with self._runner(high) as run:
            return self.trial.meets(run, self.trial.threads())

    def outputs(self, high: list[str], samples: int | None = None) -> list[dict]:
        """Per output numbers of the trial keeping `high` over the first `samples` feeds (all by default: a ranking
        takes a few, and runs several trials at once)."""
        with self._runner(high, beside_others=samples is not None) as run:
            return self.trial.judged(run, samples)

    def close(self) -> None:
        """End the sessions the judge keeps."""
        self._kept.close()

    @abstractmethod
    def _runner(self, high: list[str], beside_others: bool = False) -> AbstractContextManager[Run]:
        """What runs the trial keeping `high` (on one thread where it runs `beside_others`)."""


class Switched(Judge):
    """int8/fp8 trials as the switches of one model: its sessions (as many as the model's size allows) live as long
    as the judge, and every trial is a run of them."""

    def __init__(self, trial: Trial, graph: Any, names: list[str]):
        super().__init__(trial)
        model, self._switches = switched(graph, names)
        runnable = ort_runnable(model)[0]
        pool = compare.SessionPool(lambda: trial.session(runnable), trial.threads())
        self._sessions = self._kept.enter_context(pool)

    def _runner(self, high: list[str], beside_others: bool = False) -> AbstractContextManager[Run]:
        fed = switches(self._switches, high)
        return nullcontext(lambda feeds: self._sessions.run([{**feed, **fed} for feed in feeds]))


class Rewritten(Judge):
    """fp16/bf16 trials as copies of the model rewritten by `variant(graph, high)`, each loaded into sessions of its
    own."""

    def __init__(self, trial: Trial, graph: Any, variant: Callable[[Any, list[str]], Any]):
        super().__init__(trial)
        self.graph, self.variant = graph, variant

    @contextmanager
    def _runner(self, high: list[str], beside_others: bool = False) -> Iterator[Run]:
        runnable = ort_runnable(self.variant(self.graph, high))[0]
        threads = 1 if beside_others else self.trial.threads()
        with compare.SessionPool(lambda: self.trial.session(runnable), threads) as sessions:
            yield sessions.run
