"""Accuracy of a reduced-precision ONNX against the fp32 model, both run on ONNX Runtime (CPU) over the same feeds.

Per output: max abs error, mean relative error (sum |a - e| / sum |e|: an L1 ratio that stays finite where
outputs are near zero), cosine similarity (the lowest over the feeds), and for 2-D outputs [rows, classes]
top-1 agreement (the share of rows whose argmax is the same). Each is gated by the precision's tolerance.

A model holding fp16 or bf16 runs as an emulation (stages.emulation): values rounded to the reduced type after every
op, fp32 arithmetic inside each, as on tensor cores. The record says so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from trtflow.errors import required
from trtflow.stages import compare, precomputed
from trtflow.stages.emulation import ort_runnable

# The magnitudes each reduced type holds: (smallest subnormal, largest finite); int8/fp8 hold what calibration scaled.
RANGES = {"fp16": (5.96e-08, 65504.0), "bf16": (9.18e-41, 3.39e38)}


def emulation_note(types: list[str]) -> str:
    """` (fp16 emulated: fp16 values after every op, fp32 arithmetic)` for the reduced types a model was run as."""
    return "".join(f" ({name} emulated: {name} values after every op, fp32 arithmetic)" for name in types)


def report(
    candidate: Path,
    reference: Path,
    feeds: list[dict],
    tolerance: dict,
    data: str,
    want: list[dict] | None = None,
    keep: Callable[[list[dict]], None] | None = None,
) -> dict:
    """Run both model files over `feeds` and compare every output (`want`: the reference's outputs, if known; else
    computed, and handed to `keep`).

    The candidate's feeds are spread over every core, a session each, while the models are small enough (the
    reference's run, when needed, takes one of them first): its emulation is what the check spends most on. Its
    constant Q/DQ chains are computed once before the runs (stages.precomputed) when there is more than one: for a
    single run that only adds the cost of a session of its own (BERT-base's int8 stage checking one sample: 53.7 s
    without, 57.8 s with, a run each), and the numbers are the same either way."""
    runnable, emulated = candidate_runnable(candidate)
    made = precomputed.prepared(candidate, runnable) if len(feeds) > 1 else precomputed.Prepared(runnable)
    threads = compare.threads_for(compare.model_bytes(candidate), compare.model_bytes(reference))
    got, expected = compare.run_spread(
        lambda: precomputed.session(candidate, made),
        feeds,
        threads,
        (lambda: compare.run_all(compare.session(reference), feeds)) if want is None else None,
    )
    if want is None and keep is not None:
        keep(required(expected, "the reference's outputs"))
    outputs = judged(
        got,
        want if want is not None else required(expected, "the reference's outputs"),
        set_outputs(reference),
        tolerance,
    )
    return {
        "runtime": compare.RUNTIME + emulation_note(emulated),
        "reference": "fp32 model (cleanup output)",
        "data": data,
        "samples": len(feeds),
        "tolerance": tolerance,
        "outputs": outputs,
        "passed": bool(outputs) and all(o["passed"] for o in outputs),
    }


def judged(got: list[dict], want: list[dict], sets: dict[str, int], tolerance: dict) -> list[dict]:
    """Per output, its numbers over all feeds and whether they meet `tolerance`."""
    rows = [_per_feed(g, w, sets) for g, w in zip(got, want, strict=True)]
    return [_judge(_fold(name, [r[name] for r in rows]), tolerance) for name in rows[0]] if rows else []


def failed_for_good(outputs: list[dict], tolerance: dict) -> bool:
    """Whether outputs judged over some of the feeds already miss a limit no further feed can meet again: a
    non-finite value or a shape that differs, the lowest cosine below min_cosine, the largest error above
    max_abs_error (the shares, top-1 and the mean relative error, can still move either way)."""
    for output in outputs:
        cosine, worst = output.get("cosine_similarity"), output.get("max_abs_error")
        low, high = tolerance.get("min_cosine"), tolerance.get("max_abs_error")
        if output.get("non_finite") or any(p.startswith("shape ") for p in output.get("problems", [])):
            return True
        if (cosine is not None and low is not None and cosine < low) or (
            worst is not None and high is not None and worst > high
        ):
            return True
    return False


def top1_out_of_reach(got: list[dict], want: list[dict], sets: dict[str, int], tolerance: dict) -> bool:
    """Whether some output's top-1 agreement over all of `want`'s feeds must fall below min_top1, whatever the feeds
    after the first len(got) give: the rows that already disagree are more than the limit lets all the rows hold
    (the agreement can only be lower than if every later row agreed)."""
    bound = tolerance.get("min_top1")
    if bound is None or not got:
        return False
    for name in want[0]:
        pairs = [(np.asarray(g[name]), np.asarray(w[name])) for g, w in zip(got, want, strict=False)]
        if name in sets or any(mine.shape != theirs.shape for mine, theirs in pairs):
            continue  # a set output is judged by its elements; failed_for_good judges a shape that differs
        counts = [count for mine, theirs in pairs if (count := _top1(mine, theirs)) is not None]
        if len(counts) < len(pairs):
            continue  # not [rows, classes]
        rows = sum(np.shape(feed[name])[0] for feed in want)
        disagreeing = sum(total - agreeing for agreeing, total in counts)
        if _rounded((rows - disagreeing) / rows) < bound:
            return True
    return False


AGREEMENTS = {"cosine_similarity": "min_cosine", "top1_agreement": "min_top1", "set_agreement": "min_set_agreement"}


def badness(outputs: list[dict], metrics: tuple[str, ...] = tuple(AGREEMENTS)) -> float:
    """One number for how far a model is from fp32 (0: identical): the worst output's 1 - cosine plus its share of
    rows or set elements that disagree (of `metrics`, all three by default). What the fallback search ranks by."""
    worst = 0.0
    for output in outputs:
        agreements = [output.get(name) for name in metrics]
        worst = max(worst, sum(1.0 - float(value) for value in agreements if value is not None))
    return worst


def missed(outputs: list[dict], tolerance: dict) -> tuple[str, ...]:
    """The agreements (cosine, top-1, set) whose limit some output misses; all three when none does (another limit
    missed: an error bound, a task's max_drop). What the fallback search ranks by: a metric already within its limit
    only adds noise (a row whose top-1 flips between near-tied classes on a few ranking samples)."""
    misses = tuple(
        metric
        for metric, limit in AGREEMENTS.items()
        if tolerance.get(limit) is not None
        and any(o.get(metric) is not None and o[metric] < tolerance[limit] for o in outputs)
    )
    return misses or tuple(AGREEMENTS)


def candidate_session(path: Path) -> tuple[Any, list[str]]:
    """A CPU session of a reduced-precision model file as the GPU would round it (ort_runnable), and the reduced
    types it emulates."""
    runnable, emulated = candidate_runnable(path)
    return precomputed.session(path, precomputed.prepared(path, runnable)), emulated


def candidate_runnable(path: Path) -> tuple[Any, list[str]]:
    """A reduced-precision model file's graph as ONNX Runtime runs it the way the GPU would round it (stages.emulation),
    and the reduced types it emulates. Only the graph is loaded here: the weights stay where the file keeps them (a
    model past 2 GB in its external data) and ONNX Runtime reads them from beside it (compare.session_beside)."""
    from trtflow.util.onnxio import load_graph_only

    return ort_runnable(load_graph_only(path))


def failure_message(precision: str, accuracy: dict) -> str:
    """`int8 accuracy out of tolerance: output logits cosine 0.93 < 0.99 (max abs 0.8, ...) over 8 samples`."""
    bad = next((o for o in accuracy["outputs"] if not o["passed"]), None)
    if bad is None:
        return f"{precision} accuracy: no output was compared"
    numbers = ", ".join(
        f"{k.replace('_', ' ')} {_short(bad[k])}"
        for k in ("max_abs_error", "mean_rel_error", "cosine_similarity", "top1_agreement", "set_agreement")
        if bad.get(k) is not None
    )
    return (
        f"{precision} accuracy out of tolerance: output {bad['name']} {'; '.join(bad['problems'])} ({numbers}) over "
        f"{accuracy['samples']} samples of {accuracy['data']}{range_note(precision, bad)}; loosen "
        f"accuracy.{precision} in the recipe "
        "or set verify: {on_fail: warn}"
    )


def range_note(precision: str, output: dict) -> str:
    """`; the fp32 reference's largest |value| is 1.2e-09, below fp16's smallest subnormal 5.96e-08 (it underflows
    to 0)` when an output's reference lies outside what the precision holds; else empty."""
    low, high = RANGES.get(precision, (None, None))
    peak = output.get("reference_abs_max")
    if low is None or peak is None:
        return ""
    if 0 < peak < low:
        return (
            f"; the fp32 reference's largest |value| is {_short(peak)}, below {precision}'s smallest subnormal {low:g} "
            "(every value underflows to 0): scale the output, or keep its producer in fp32 (autocast.keep_nodes)"
        )
    if peak > high:
        return (
            f"; the fp32 reference's largest |value| is {_short(peak)}, above {precision}'s largest {high:g} "
            "(it overflows)"
        )
    return ""


def _short(value: float) -> str:
    return f"{value:.6g}"


# Ops whose output is a set whose size depends on the data, and the axis along which its elements lie: NMS's
# selected [batch, class, box] rows, NonZero's index columns. Such an output is compared as a set, never elementwise.
SET_OUTPUT_OPS = {"NonMaxSuppression": 0, "NonZero": 1}


def set_outputs(model: Path) -> dict[str, int]:
    """Graph output -> the axis its set elements lie along, for outputs made directly by a SET_OUTPUT_OPS op."""
    from trtflow.util.onnxio import load_graph_only

    graph = load_graph_only(model).graph
    made_by = {out: node.op_type for node in graph.node for out in node.output}
    return {o.name: SET_OUTPUT_OPS[made_by[o.name]] for o in graph.output if made_by.get(o.name) in SET_OUTPUT_OPS}


def _set_rows(value: Any, axis: int) -> set[tuple]:
    """The elements of a set output (rows along `axis`) as hashable tuples."""
    elements = np.moveaxis(np.asarray(value), axis, 0)
    return {tuple(row) for row in elements.reshape(elements.shape[0], -1).tolist()}


def _per_feed(got: dict, want: dict, sets: dict[str, int]) -> dict:
    """Raw sums per output for one feed, folded later (so no metric is an average of averages); a set output's shared
    and total elements."""
    rows: dict[str, dict[str, Any]] = {}
    for name, expected in want.items():
        if name in sets:
            mine, theirs = _set_rows(got[name], sets[name]), _set_rows(expected, sets[name])
            rows[name] = {"shared": len(mine & theirs), "union": len(mine | theirs)}
            continue
        a = np.asarray(got[name], dtype=np.float64)
        e = np.asarray(expected, dtype=np.float64)
        if a.shape != e.shape:
            rows[name] = {"problem": f"shape {list(a.shape)} != {list(e.shape)}"}
            continue
        finite = np.isfinite(a)
        error = np.abs(np.where(finite, a, 0.0) - e)
        rows[name] = {
            "non_finite": int((~finite).sum()),
            "max_abs": float(error.max(initial=0.0)),
            "abs_sum": float(error.sum()),
            "ref_sum": float(np.abs(e).sum()),
            "cosine": _cosine(np.where(finite, a, 0.0).ravel(), e.ravel()),
            "top1": _top1(a, e),
            "ref_max": float(np.abs(e).max(initial=0.0)),
        }
    return rows


def _cosine(a: np.ndarray, e: np.ndarray) -> float:
    norms = float(np.linalg.norm(a) * np.linalg.norm(e))
    if norms == 0.0:
        return 1.0 if not a.any() and not e.any() else 0.0
    return float(np.dot(a, e) / norms)


def _top1(a: np.ndarray, e: np.ndarray) -> tuple[int, int] | None:
    """(agreeing rows, rows) for a [rows, classes] output with more than one class; None otherwise."""
    if a.ndim != 2 or a.shape[1] < 2:
        return None
    return int((a.argmax(axis=1) == e.argmax(axis=1)).sum()), int(a.shape[0])


def _fold(name: str, per_feed: list[dict]) -> dict:
    if per_feed and "union" in per_feed[0]:  # a set output: the share of elements both models selected (Jaccard)
        union = sum(r["union"] for r in per_feed)
        return {
            "name": name,
            "compared_as": "set",
            "set_agreement": _rounded(sum(r["shared"] for r in per_feed) / union if union else 1.0),
            **dict.fromkeys(("max_abs_error", "mean_rel_error", "cosine_similarity", "top1_agreement")),
            "non_finite": 0,
            "problems": [],
        }
    problems = [r["problem"] for r in per_feed if "problem" in r]
    if problems:
        return {
            "name": name,
            "max_abs_error": None,
            "mean_rel_error": None,
            "cosine_similarity": None,
            "top1_agreement": None,
            "non_finite": 0,
            "problems": [problems[0]],
        }
    ref_sum = sum(r["ref_sum"] for r in per_feed)
    tops = [r["top1"] for r in per_feed if r["top1"] is not None]
    return {
        "name": name,
        "max_abs_error": _rounded(max(r["max_abs"] for r in per_feed)),
        "mean_rel_error": _rounded(sum(r["abs_sum"] for r in per_feed) / ref_sum if ref_sum > 0 else 0.0),
        "cosine_similarity": _rounded(min(r["cosine"] for r in per_feed)),
        "top1_agreement": _rounded(sum(t[0] for t in tops) / sum(t[1] for t in tops)) if tops else None,
        "non_finite": sum(r["non_finite"] for r in per_feed),
        "reference_abs_max": _rounded(max(r["ref_max"] for r in per_feed)),
        "problems": [],
    }


def _rounded(value: float) -> float:
    """8 significant digits: what the numbers mean, without the last bits a CPU's vector width can change
    (the report is an output whose digest downstream keys hold)."""
    return float(f"{value:.8g}")


def _judge(row: dict, tolerance: dict) -> dict:
    """Add `passed` and one problem line per tolerance the output misses."""
    problems = list(row["problems"])
    if row["non_finite"]:
        problems.append(f"{row['non_finite']} non-finite values (overflow?)")
    checks = [
        ("cosine_similarity", "min_cosine", "<"),
        ("top1_agreement", "min_top1", "<"),
        ("max_abs_error", "max_abs_error", ">"),
        ("mean_rel_error", "max_mean_rel_error", ">"),
        ("set_agreement", "min_set_agreement", "<"),
    ]
    for metric, limit, worse in checks:
        value, bound = row.get(metric), tolerance.get(limit)
        if value is not None and bound is not None and (value < bound if worse == "<" else value > bound):
            problems.append(f"{metric.replace('_', ' ')} {_short(value)} {worse} {bound}")
    return {**row, "problems": problems, "passed": not problems}
