"""Task accuracy: the fp32 and the reduced-precision model scored on the user's labelled rows, and the drop.

Both run on ONNX Runtime's measuring sessions (the graph as written; fp16/bf16 emulated as in stages/accuracy.py)
over the rows of `accuracy.data`; the model's first output is scored against `accuracy.labels`:

    top1, top5  share of rows whose label is among the k largest outputs ([rows, classes]); drop = fp32 - value
    mse         mean squared error against float targets; drop = value - fp32 (the error grew by that much)

So a positive drop is always worse, and `accuracy.int8: {max_drop: {top1: 0.01}}` bounds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtflow import calibration, taskdata
from trtflow.errors import StageError
from trtflow.stages import accuracy, compare
from trtflow.stages.base import Upstream
from trtflow.stages.precision_params import Params
from trtflow.taskdata import HIGHER_IS_BETTER


@dataclass(frozen=True)
class Rows:
    """The labelled rows of `accuracy.data`, the metric they are scored by and this precision's max_drop."""

    feeds: list[dict]
    labels: np.ndarray
    metric: str
    max_drop: float | None


def rows(params: Params, inputs: dict[str, Upstream], source: Path) -> Rows | None:
    """The labelled rows a precision stage scores (None without labelled data)."""
    if params.task is None:
        return None
    data = {
        role[len(taskdata.DATA_ROLE) :]: up.files[role]
        for role, up in inputs.items()
        if role.startswith(taskdata.DATA_ROLE)
    }
    feeds, labels = taskdata.load(
        data, inputs[taskdata.LABELS_ROLE].files[taskdata.LABELS_ROLE], calibration.model_input_types(source)
    )
    problem = taskdata.metric_problem(labels, params.task.metric)
    if problem:  # validate refuses it first; a labels file edited since must not be scored as something else
        raise StageError(f"accuracy.metric: {problem}")
    return Rows(feeds, labels, params.task.metric, params.task.max_drop)


def checked(accuracy_report: dict, labelled: Rows | None, precision: str, model: Path, source: Path) -> dict:
    """With labelled rows: `task` (the metric for fp32 and this model, the drop) added, failed past max_drop."""
    if labelled is None:
        return accuracy_report
    result = report(model, source, labelled.feeds, labelled.labels, labelled.metric, labelled.max_drop)
    if result["passed"]:
        return {**accuracy_report, "task": result}
    problem = f"task accuracy: {taskdata.summary_line(precision, result)}"
    return {**accuracy_report, "task": result, "problems": [*accuracy_report["problems"], problem], "passed": False}


@dataclass(frozen=True)
class Limit:
    """max_drop as a fallback search judges a trial model: the fp32 score computed once."""

    rows: Rows
    fp32: float

    @classmethod
    def of(cls, labelled: Rows | None, source: Path) -> Limit | None:
        """The limit to search by, None without labelled rows or a max_drop."""
        if labelled is None or labelled.max_drop is None:
            return None
        return cls(
            labelled, score(first_output(compare.session(source), labelled.feeds), labelled.labels, labelled.metric)
        )

    def holds_for(self, run: Callable[[list[dict]], list[dict]]) -> bool:
        """Whether the drop from fp32 of the trial model `run` computes (feeds -> outputs by name, the model's first
        output first) is within max_drop."""
        value = score(_first_of(run(self.rows.feeds)), self.rows.labels, self.rows.metric)
        return drop_from(self.fp32, value, self.rows.metric) <= (self.rows.max_drop or 0.0) + 1e-12


def score(outputs: np.ndarray, labels: np.ndarray, metric: str) -> float:
    """The metric of one model's outputs (rows first) against the labels."""
    if metric == "mse":
        predicted = outputs.astype(np.float64).reshape(labels.shape[0], -1)
        return float(np.mean((predicted - labels.astype(np.float64).reshape(labels.shape[0], -1)) ** 2))
    k = 1 if metric == "top1" else 5
    if outputs.ndim != 2 or outputs.shape[1] < k:
        raise ValueError(
            f"{metric} needs an output of shape [rows, classes >= {k}], the model's is {list(outputs.shape)}"
        )
    top = np.argsort(-outputs, axis=1, kind="stable")[:, :k]
    return float(np.mean((top == labels.reshape(-1, 1)).any(axis=1)))


def first_output(session: Any, feeds: list[dict]) -> np.ndarray:
    """The first output of every feed, rows concatenated."""
    return _first_of(compare.run_all(session, feeds))


def _first_of(results: list[dict]) -> np.ndarray:
    """The first output of each feed's results (by name, in the model's order), rows concatenated."""
    return np.concatenate([next(iter(result.values())) for result in results], axis=0)


def report(
    candidate: Path, reference: Path, feeds: list[dict], labels: np.ndarray, metric: str, max_drop: float | None
) -> dict:
    """`{metric, fp32, value, drop, rows, max_drop, passed}`: fp32 is the reference model's own score, the baseline."""
    try:
        fp32 = score(first_output(compare.session(reference), feeds), labels, metric)
        value = score(first_output(accuracy.candidate_session(candidate)[0], feeds), labels, metric)
    except ValueError as exc:
        raise StageError(f"accuracy.metric: {exc}") from exc
    drop = drop_from(fp32, value, metric)
    return {
        "metric": metric,
        "fp32": _rounded(fp32),
        "value": _rounded(value),
        "drop": _rounded(drop),
        "rows": int(labels.shape[0]),
        "max_drop": max_drop,
        "passed": max_drop is None or drop <= max_drop + 1e-12,
    }


def drop_from(fp32: float, value: float, metric: str) -> float:
    """How much worse than fp32 a score is: positive is worse, whichever way the metric points."""
    return fp32 - value if HIGHER_IS_BETTER[metric] else value - fp32


def _rounded(value: float) -> float:
    """8 significant digits, as the other accuracy numbers (the report's digest is in downstream keys)."""
    return float(f"{value:.8g}")
