"""`accuracy.<precision>.fallback: auto`: when a reduced-precision model misses its limits, keep the fewest compute
nodes in high precision until they hold (fp16 for int8/fp8, fp32 for fp16/bf16), chosen by measured sensitivity, never
below `min_share` in the precision. What follows is said of int8/fp8; fp16/bf16 take their candidates and keep them
high as fallback_autocast does, and AutoCast confirms.

1. Sensitivity. A candidate is a node that reads an input through Q/DQ (a Conv, MatMul or Gemm, or a residual Add,
   Mul or Transpose ModelOpt quantized beside them). Candidates are grouped by the model's blocks (fallback_blocks:
   split where a residual connection joins, consecutive blocks joined into about sqrt(candidates) groups). Each
   group is measured with the same emulation as the accuracy check, on the first RANKING_SAMPLES samples, against
   the fp32 outputs computed once, in the agreements whose limits the first try missed (_sensitivity): first by the
   error it removes (the quantized model with the group's nodes off their Q/DQ); for int8/fp8, where that ranking
   keeps too much for `min_share`, every node again by the error it adds alone (only it quantized). An int8/fp8 trial
   is one switched model (fallback_switch, emulated once) wired for it, each tensor read off its Q/DQ as ModelOpt's
   model keeping those nodes reads it (the Adds and ReduceMeans beside kept nodes too, a tensor another reader still
   quantizes not), and a ranking's trials run from where they differ from its baseline (fallback_cuts): the same
   numbers as a rewired copy, bit for bit, for less.
2. Search. In order of sensitivity (ties by the first node's name), the fewest whole groups whose bypassed model
   meets the limits, found by doubling, then bisecting; then the nodes of the last of those groups are ranked alone
   and the fewest of them are found the same way (fallback_ranking); ranked by the error added alone, the fewest
   nodes. A model with no residual connections is ranked node by node. Each choice is made by numbers
   alone. No more nodes are tried than `min_share` allows (read off the quantized graph, without a ModelOpt run);
   only when no ranking meets the limits within it does the last ranking go past it, to say what would (each trial runs
   once).
3. Confirmation. ModelOpt quantizes again with that prefix in `nodes_to_exclude` (so calibration and Q/DQ placement
   are its own; its histograms are the first run's, kept by the stage: modelopt_passes) and the result is checked
   like any other; while it misses, the next nodes join, the step doubling each time (ModelOpt's model can be more
   than a node from its trial: docs/precision.md), at most CONFIRMATIONS times, and never past the point where less
   than `min_share` of the weights or MACs stays in the precision (a step that would go past it is cut short to the
   most that stays within). The best result found is kept either way, and the record says how it was reached.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import required
from trtflow.stages import accuracy, fallback_autocast
from trtflow.stages.composition import LOW_TYPES, shares_keeping
from trtflow.stages.convert import NothingQuantized
from trtflow.stages.emulation import ort_runnable
from trtflow.stages.fallback_blocks import QDQ, balanced, blocks
from trtflow.stages.fallback_cuts import Cuts
from trtflow.stages.fallback_ranking import Choice, Measure, choose, names_of, remembered
from trtflow.stages.fallback_switch import prunable, resolved, switched, wiring
from trtflow.stages.fallback_trial import Judge, Trial
from trtflow.util.onnxio import load_graph_only

CONFIRMATIONS = 3  # ModelOpt runs after the search: the search's count kept high, then 1 more, then 2 more than that
# Sensitivities are ranked on the first samples only (each node costs a trial), prefixes judged on all of them:
# int8/fp8 on one (its trials run several at once, one per core: EfficientNet-B0's int8 ranked on two kept 35 of the
# same 36 nodes, in twice the time); fp16/bf16 on two (one op's rounding shows in fewer rows: the zoo encoder's fp16
# ranked on one found no keep)
RANKING_SAMPLES = {"quantized": 1, "autocast": 2}
DEFAULT_MIN_SHARE = 0.5
SUMMARY = ("cosine_similarity", "top1_agreement", "set_agreement")  # per output, before and after


@dataclass(frozen=True)
class Attempt:
    """One reduced-precision model made and checked: its saved files, how it was made, what it is made of, and its
    accuracy report."""

    files: dict[str, Path]
    details: dict
    made_of: dict
    accuracy: dict
    kept: tuple[str, ...] = ()  # the nodes the fallback kept in high precision

    @property
    def share(self) -> float:
        """The smaller of the weight and MAC shares that run in the precision."""
        return float(min(self.made_of["weight_share"], self.made_of["mac_share"]))


def search(
    first: Attempt, attempt: Callable[[str, tuple[str, ...]], Attempt], trial: Trial, min_share: float | None
) -> tuple[Attempt, dict]:
    """The attempt to keep (the first passing one, else the closest to fp32 within min_share) and what the search
    did; `attempt(folder_name, kept)` quantizes again with `kept` left in high precision."""
    floor = DEFAULT_MIN_SHARE if min_share is None else min_share
    graph = load_graph_only(trial.saved)
    precision = first.made_of["precision"]
    found = fallback_autocast.candidates(graph, precision) if precision in LOW_TYPES else candidates(graph)
    every = [name for name, _ in found]
    split = balanced(blocks(graph, found))
    grouped = 1 < len(split) < len(found)
    units = split if grouped else [[c] for c in found]
    metrics = accuracy.missed(first.accuracy["outputs"], trial.tolerance)
    if precision in LOW_TYPES:
        keeper = fallback_autocast.Keeper(graph, precision, required(trial.source, "the fp32 model"))
        judge = Judge(trial, lambda high: ort_runnable(keeper(graph, high))[0])
        rank_by = functools.partial(_sensitivity, judge, every, metrics, RANKING_SAMPLES["autocast"])
    else:  # one switched model, emulated once, wired for each trial; rankings run from where trials differ
        switched_model, inputs = switched(graph, every)
        board = ort_runnable(switched_model)[0]
        judge = Judge(trial, lambda high: resolved(board, wiring(inputs, high)))
        groups = [names_of([unit]) for unit in units]
        samples = RANKING_SAMPLES["quantized"]
        rank_by = (
            functools.partial(_cut_sensitivity, board, inputs, trial, groups, metrics, samples)
            if prunable(board)
            else functools.partial(_sensitivity, judge, every, metrics, samples)
        )
    trials = 0
    known: dict[tuple[str, ...], bool] = {}
    measures: dict[bool, Measure] = {}

    def passes(names: list[str]) -> bool:
        nonlocal trials
        key = tuple(sorted(names))
        if key not in known:
            trials += 1
            trial.say(f"fallback: trial model {trials}, {len(names)} of {len(every)} candidates kept high")
            known[key] = judge.meets(names)
        return known[key]

    def counted(new: int) -> None:
        nonlocal trials
        trials += new

    def measure(alone: bool) -> Measure:  # each ranking's trials run once, its baseline among them
        if alone not in measures:
            measures[alone] = remembered(rank_by(alone), counted)
            counted(1)
        return measures[alone]

    def allowed(names: list[str]) -> bool:
        return min(shares_keeping(graph, precision, set(names)).values()) >= floor

    def within_share(choice: Choice) -> bool:
        return choice.count is not None and allowed(choice.names[: choice.count])

    def ranked_units(alone: bool) -> tuple[list[list[tuple[str, str]]], bool]:
        """(what a ranking measures, whether those are groups): by the error removed, groups, then the nodes of the
        last one kept; by the error added alone, every node (a node's trial runs one batch from its cut, a fraction of
        a prefix trial's held-out samples: ranking groups first and trying prefixes of them cost EfficientNet-B0's
        int8 more than the nodes of every group it kept, which were all of them)."""
        return ([[c] for c in found], False) if alone else (units, grouped)

    # first by the error a group removes (cheap where a few nodes make it); int8/fp8 where that keeps too much: by
    # the error each node adds alone (where it is spread over many)
    rankings = (False, True) if precision not in LOW_TYPES else (False,)
    for alone in rankings:  # the first whose choice is within min_share
        chosen = choose(measure(alone), *ranked_units(alone), alone, passes, allowed)
        if within_share(chosen):
            break
    else:  # none within min_share: the fewest the last ranking keeps whatever the share, what the failure reports
        # (the last: its node ranking is measured already, where going past with the first would rank its last group's
        # nodes too; EfficientNet-B0's fp8 spent 16 of 99 trial models on that)
        chosen = choose(measure(rankings[-1]), *ranked_units(rankings[-1]), rankings[-1], passes)
    names, count, sensitivity = chosen.names, chosen.count, chosen.sensitivity
    ops = dict(found)
    ranked = [{"name": name, "op": ops[name], "sensitivity": sensitivity[name]} for name in names]
    best, confirmed, too_few, step = first, 0, None, 1
    while count is not None and count <= len(names) and confirmed < CONFIRMATIONS:
        # what keeping them leaves in the precision, read off the quantized graph: no ModelOpt run to find it out
        left = shares_keeping(graph, precision, set(names[:count]))
        if max(left.values()) == 0:  # nothing left to quantize
            too_few = {"kept": count, "outputs": {}, "weight_share": 0.0, "mac_share": 0.0, "passed": False}
            break
        if min(left.values()) < floor:
            trials += 1
            judged = judge.outputs(names[:count])
            too_few = {"kept": count, "outputs": _outputs_summary(judged), **left, "passed": _all_passed(judged)}
            break
        try:
            result = attempt(f"fallback-{count}", tuple(names[:count]))
        except NothingQuantized:  # keeping these left ModelOpt nothing to quantize: no share in the precision at all
            too_few = {"kept": count, "outputs": {}, "weight_share": 0.0, "mac_share": 0.0, "passed": False}
            break
        confirmed += 1
        if result.share < floor:  # passed also weighs the share: the outputs' limits alone here
            too_few = {"kept": count, **_summary(result), "passed": _all_passed(result.accuracy["outputs"])}
            break
        if accuracy.badness(result.accuracy["outputs"]) < accuracy.badness(best.accuracy["outputs"]):
            best = result
        if result.accuracy["passed"]:
            break
        count, step = _next_count(count, step, lambda more: allowed(names[:more])), step * 2
    return best, {
        "candidates": len(ranked),
        "ranked_by": "error added alone" if chosen.alone else "error removed",
        "blocks": len(split) if grouped else len(found),
        "trial_models": trials,
        "modelopt_runs": confirmed,
        "min_share": floor,
        "kept": [row for row in ranked if row["name"] in best.kept],
        "sensitivity": ranked,
        "before": _summary(first),
        "after": _summary(best),
        "passed": best.accuracy["passed"],
        **({"below_min_share": too_few} if too_few else {}),
    }


def _next_count(count: int, step: int, allowed: Callable[[int], bool]) -> int:
    """How many to keep in the next ModelOpt run: `step` more, fewer where that would leave less than `min_share` in
    the precision (the most that `allowed` takes), and one more when even that is too many (the search then judges
    that keep without a ModelOpt run and reports the share it would leave)."""
    more = count + step
    while more > count + 1 and not allowed(more):
        more -= 1
    return more


def _sensitivity(judge: Judge, every: list[str], metrics: tuple[str, ...], samples: int, alone: bool) -> Measure:
    """How units (a group of candidates, or one node) are measured over the first `samples` samples, each trial a
    model of its own, several at once (ONNX Runtime frees the GIL). The error is accuracy.badness of the agreements
    whose limits the first try misses (`metrics`, accuracy.missed).
    - `alone` (int8, fp8, after the error removed kept too much): the error the unit adds alone: the error of the
      model with only its nodes reduced (every other candidate high) less that of the model with none reduced. Each
      unit's own error shows even when the model's error is spread over many small ones, which add up
      (EfficientNet-B0's int8), where the error one unit removes from the quantized model is lost among the
      others'.
    - else (first, for every precision): the error the unit removes from the reduced model, keeping its nodes high.
      Where a few nodes make the error it finds them cheaply, and where errors compound rather than add (BERT-base)
      it finds the node whose own error is tiny. fp16/bf16 rank by it alone: one op's rounding, alone, is below
      what the check resolves (the cosine's 8 significant digits)."""
    baseline = set(every if alone else [])
    base = _error(judge.outputs(sorted(baseline), samples), metrics)

    def error(unit: list[tuple[str, str]]) -> tuple[float, float]:
        return _error(judge.outputs(sorted(baseline ^ set(names_of([unit]))), samples), metrics)

    def measure(units: list[list[tuple[str, str]]]) -> list[tuple[float, float]]:
        judge.trial.say_measuring(units)
        with ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="sensitivity") as pool:
            errors = []
            for done, measured in enumerate(pool.map(error, units), 1):
                errors.append(measured)
                judge.trial.say_measured(done, len(units))
            return _sensitivities(errors, base, alone)

    return measure


def _cut_sensitivity(
    board: Any,
    inputs: dict[str, str],
    trial: Trial,
    groups: list[list[str]],
    metrics: tuple[str, ...],
    samples: int,
    alone: bool,
) -> Measure:
    """_sensitivity's measure for an int8/fp8 model, each trial run from where it differs from the ranking's baseline
    (fallback_cuts): the same numbers, for about half the work, and a session per group instead of per trial."""
    cuts = Cuts(board, inputs, trial, groups, list(inputs) if alone else [], samples)
    base = _error(trial.numbers(cuts.baseline_outputs()), metrics)

    def measure(units: list[list[tuple[str, str]]]) -> list[tuple[float, float]]:
        trial.say_measuring(units)
        errors = [_error(trial.numbers(got), metrics) for got in cuts.run([names_of([u]) for u in units])]
        return _sensitivities(errors, base, alone)

    return measure


def _error(judged: list[dict], metrics: tuple[str, ...]) -> tuple[float, float]:
    """A trial's error as a ranking weighs it: accuracy.badness of the agreements whose limits the first try missed,
    then of every agreement, which orders the trials the first leaves equal (a top-1 that flips one row of the few
    the ranking runs, for many nodes alike: their cosine then says which moved the outputs most)."""
    return accuracy.badness(judged, metrics), accuracy.badness(judged)


def _sensitivities(
    errors: list[tuple[float, float]], base: tuple[float, float], alone: bool
) -> list[tuple[float, float]]:
    """Each trial's error added to (`alone`) or removed from the baseline's."""
    return [
        (error[0] - base[0], error[1] - base[1]) if alone else (base[0] - error[0], base[1] - error[1])
        for error in errors
    ]


def _outputs_summary(judged: list[dict]) -> dict:
    """Per output cosine, top-1 and set agreement of judged outputs."""
    return {o["name"]: {k: o.get(k) for k in SUMMARY if o.get(k) is not None} for o in judged}


def _all_passed(judged: list[dict]) -> bool:
    return all(o["passed"] for o in judged)


def name_kept(chosen: Attempt, searched: dict) -> None:
    """The composition's reason for each node the search kept high: its sensitivity (what inspect and the report
    show)."""
    sensitivity = {row["name"]: row["sensitivity"] for row in searched["kept"]}
    for row in chosen.made_of["kept"]:
        if row["name"] in sensitivity:
            row["reason"] = f"kept by fallback: auto (sensitivity {sensitivity[row['name']]:.6g})"


def candidates(graph: Any) -> list[tuple[str, str]]:
    """(name, op) of every node reading an input through a DequantizeLinear (the compute nodes, and the residual Adds
    and moves ModelOpt quantizes beside them), in graph order."""
    dequantized = {o for n in graph.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return [
        (n.name, n.op_type) for n in graph.graph.node if n.op_type not in QDQ and any(i in dequantized for i in n.input)
    ]


def _summary(attempt: Attempt) -> dict:
    """The numbers a reader compares before and after: per output cosine and top-1, and the shares."""
    return {
        "outputs": _outputs_summary(attempt.accuracy["outputs"]),
        "weight_share": attempt.made_of["weight_share"],
        "mac_share": attempt.made_of["mac_share"],
    }


def said(searched: dict | None) -> str:
    """What a failure line adds about the search: the closest result it found, and within what."""
    if searched is None:
        return ""
    after = searched["after"]
    numbers = ", ".join(
        f"{name} {metric.replace('_', ' ')} {value:.6g}"
        for name, metrics in after["outputs"].items()
        for metric, value in metrics.items()
    )
    said = (
        f"; fallback: auto ({searched['trial_models']} trial models, {searched['modelopt_runs']} ModelOpt runs) "
        f"reached {numbers} with {len(searched['kept'])} node(s) kept in high precision, {after['mac_share']:.0%} of "
        f"the MACs and {after['weight_share']:.0%} of the weights in the precision (min_share {searched['min_share']})"
    )
    rejected = searched.get("below_min_share")
    if rejected and not rejected["outputs"]:
        said += f"; keeping the {rejected['kept']} most sensitive node(s) leaves ModelOpt nothing to quantize"
    elif rejected:
        outcome = "meets the limits" if rejected["passed"] else "does not meet them either"
        said += (
            f"; keeping the {rejected['kept']} most sensitive node(s) {outcome} but leaves {rejected['mac_share']:.0%} "
            f"of the MACs and {rejected['weight_share']:.0%} of the weights in the precision: lower min_share to "
            "accept that"
        )
    return said
