"""Labelled data for task accuracy: `accuracy: {data: val/*.npz, labels: val/labels.npy, metric: top1}`.

The data files are read in sorted path order and their rows concatenated along the batch axis; `labels` holds
one label per row in that order (integer class ids for top1/top5, float targets for mse). Every file is a source
of each reduced-precision node (`task:data/val/a.npz`, `task:labels`), so its digest is in the key:

    >>> sources(TaskFiles(("val/a.npz",), "val/labels.npy"), Path("/p"))[1]
    ('task:labels', PosixPath('/p/val/labels.npy'))
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow.calibration import DATA_SUFFIXES, arrays_from_file
from trtflow.errors import ProjectError, StageError, required
from trtflow.util.reads import note_glob

if TYPE_CHECKING:
    import numpy as np

    from trtflow.recipe.project import RecipeFile

DATA_ROLE, LABELS_ROLE = "task:data/", "task:labels"
HIGHER_IS_BETTER = {"top1": True, "top5": True, "mse": False}


@dataclass(frozen=True)
class TaskFiles:
    """The labelled data files (relative, sorted) and the labels file."""

    data: tuple[str, ...]
    labels: str


def plan_files(item: RecipeFile, root: Path) -> TaskFiles | None:
    """The files `accuracy.data`/`labels` name; None when the recipe declares none. Missing files are a ProjectError."""
    options = item.recipe.accuracy
    if options.data is None:
        return None
    labels = required(options.labels, "accuracy.labels")  # the recipe's model pairs it with accuracy.data
    matches = glob.glob(str(root / options.data), recursive=True)
    note_glob("glob", str(root / options.data), matches)
    data = sorted(
        Path(os.path.relpath(p, root)).as_posix()
        for p in matches
        if Path(p).is_file() and Path(p).suffix.lower() in DATA_SUFFIXES
    )
    if not data:
        raise ProjectError(f"{item.where('accuracy', 'data')}: no .npy/.npz file matches {options.data!r}")
    if not (root / labels).is_file():
        raise ProjectError(f"{item.where('accuracy', 'labels')}: {labels} not found (a .npy of one label per data row)")
    return TaskFiles(tuple(data), Path(labels).as_posix())


def sources(files: TaskFiles | None, root: Path) -> tuple[tuple[str, Path], ...]:
    """A reduced precision's task sources: every data file, then the labels."""
    if files is None:
        return ()
    return tuple((DATA_ROLE + relative, root / relative) for relative in files.data) + (
        (LABELS_ROLE, root / files.labels),
    )


def load(data: dict[str, Path], labels: Path, model_inputs: dict[str, dict]) -> tuple[list[dict], np.ndarray]:
    """(one feed per data file in sorted path order, the labels) after checking they pair up row for row."""
    import numpy as np

    feeds = [arrays_from_file(relative, data[relative], model_inputs) for relative in sorted(data)]
    try:
        values = np.load(labels, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise StageError(
            f"accuracy.labels: cannot read it: {(str(exc).splitlines() or [type(exc).__name__])[0]}"
        ) from exc
    rows = sum(int(next(iter(feed.values())).shape[0]) for feed in feeds)
    if values.ndim < 1 or values.shape[0] != rows:
        raise StageError(
            f"accuracy.labels: holds {values.shape[0] if values.ndim else 0} label(s) but the data holds {rows} "
            "row(s); "
            "give one label per row, in sorted file order"
        )
    return feeds, values


def metric_problem(labels: np.ndarray, metric: str) -> str | None:
    """Why `metric` cannot measure these labels, or None."""
    if metric in ("top1", "top5") and (labels.dtype.kind not in "iu" or labels.ndim != 1):
        return (
            f"{metric} needs integer class ids of shape [rows], the labels are {labels.dtype} {list(labels.shape)} "
            "(use metric: mse for float targets)"
        )
    if metric == "mse" and labels.dtype.kind not in "fiu":
        return f"mse needs numeric targets, the labels are {labels.dtype}"
    return None


def check_task_data(item: RecipeFile, root: Path) -> None:
    """Read the labelled data and labels and check they pair up and fit the metric (ProjectError naming the field)."""
    files = plan_files(item, root)
    if files is None:
        return
    from trtflow.calibration import model_input_types

    onnx_source = getattr(item.recipe.source, "onnx", None)
    model_inputs = (
        model_input_types(item.source_path(root)) if onnx_source else {"input": {"dtype": None, "dims": None}}
    )
    try:
        _, labels = load({r: root / r for r in files.data}, root / files.labels, model_inputs)
    except StageError as exc:
        field = "labels" if str(exc).startswith("accuracy.labels") else "data"
        raise ProjectError(f"{item.where('accuracy', field)}: {str(exc).removeprefix('accuracy.labels: ')}") from exc
    problem = metric_problem(labels, item.recipe.accuracy.metric or "top1")
    if problem:
        raise ProjectError(
            f"{item.where('accuracy', 'metric' if item.recipe.accuracy.metric else 'labels')}: {problem}"
        )


def summary_line(precision: str, task: dict) -> str:
    """`int8 top1 0.962 (fp32 0.970, drop 0.008 <= 0.01) on 256 labelled rows`: what `inspect` and failures print."""
    limit = "" if task.get("max_drop") is None else f" {'<=' if task['passed'] else '>'} {task['max_drop']:g}"
    shown = "{:.3f}" if HIGHER_IS_BETTER[task["metric"]] else "{:.4g}"
    value, fp32, drop = (shown.format(task[k]) for k in ("value", "fp32", "drop"))
    return f"{precision} {task['metric']} {value} (fp32 {fp32}, drop {drop}{limit}) on {task['rows']} labelled rows"
