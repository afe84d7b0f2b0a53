"""Precision: the ONNX a build starts from, one per precision and shared by every target.

TensorRT 11 and TensorRT-RTX build strongly typed networks: reduced precision is baked into the ONNX
(fp16/bf16 by ModelOpt AutoCast, int8/fp8 by ModelOpt PTQ with Q/DQ nodes). fp32 passes the cleaned
model through unchanged (the store deduplicates it: same bytes, same object).

A reduced-precision model then proves itself: it and the fp32 model run on ONNX Runtime (CPU) over
held-out samples (files the calibration did not use), or seeded random inputs within the profiles when
no files are declared; out of the precision's tolerance fails the stage unless `verify: {on_fail: warn}`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow import calibration, taskdata
from trtflow.errors import StageError, TrtflowError, required
from trtflow.recipe.precision import AUTOCAST_PRECISIONS, QUANTIZED_PRECISIONS
from trtflow.stages import base, convert, precision_samples
from trtflow.stages.base import MIB, Dep, Node, NodeId, NodeInfo, RecipeContext, Stage, StageOutput, Upstream
from trtflow.stages.composition import composition
from trtflow.stages.fallback_blocks import SEARCH_VERSION
from trtflow.stages.modelfile import FILE_NAMES, MODEL, MODEL_DATA, canonical_order, place_side_by_side, save_model
from trtflow.stages.precision_params import Accuracy, Params, Quantize, TaskCheck
from trtflow.util.inputvalues import mask_carrying_nodes
from trtflow.util.memory import released_after
from trtflow.util.onnxio import load_graph_only
from trtflow.util.servers import TOOLS_SERVER
from trtflow.util.stage_progress import notes_in
from trtflow.util.versions import ort_version, tool_version

if TYPE_CHECKING:
    from trtflow.stages.fallback import Attempt
    from trtflow.stages.shared_outputs import Reference

# versions: 2: fp16 accuracy rounded between ops; 3: AutoCast on the recipe's data; 4: CPU-independent sessions; 5:
# value_info in canonical order; 6: composition shares and kept nodes with reasons, min_share, range diagnosis; 7:
# integer inputs drawn as the graph accepts them, additive attention masks kept out of int8/fp8
KIND, VERSION = "precision", 8


def nodes(ctx: RecipeContext, cleanup: Node) -> dict[str, Node]:
    """One model per precision that some target builds, shared by those targets."""
    return {precision: node(ctx, precision, cleanup.id) for precision in ctx.precisions()}


def node(ctx: RecipeContext, precision: str, model_node: NodeId) -> Node:
    """precision:<recipe>/<precision>: fp32 passes the cleaned model through.

    Reduced precisions read the recipe's calibration files (AutoCast measures value ranges on them to decide what
    stays fp32; PTQ calibrates on them) and its held-out files (for the accuracy report).
    """
    base = Node(
        id=NodeId.of(KIND, ctx.name, precision),
        version=VERSION,
        params=Params(precision=precision),
        deps=(Dep("model", model_node, "model"),),
        info=NodeInfo(precision=precision),
    )
    if precision == "fp32":
        return base
    recipe, spec = ctx.recipe, ctx.recipe.calibration
    data = calibration.reading_params(spec)
    if precision in AUTOCAST_PRECISIONS:
        settings: dict[str, Any] = {"autocast": recipe.autocast}
    else:
        quantizing = required(spec, "calibration")  # the recipe's loader requires it for int8 and fp8
        settings = {
            "quantize": Quantize(
                **recipe.quantize.model_dump(),
                method=quantizing.method_for(precision),
                seed=quantizing.seed,
                percentile=quantizing.percentile_value(),
                samples=quantizing.samples if quantizing.random else None,
            )
        }
    tools: dict[str, Any] = {
        "modelopt": tool_version("nvidia-modelopt"),
        "onnx": tool_version("onnx"),
        "onnxruntime": ort_version(),
        "numpy": tool_version("numpy"),
        **({"pillow": tool_version("pillow")} if data is not None and data["kind"] == "images" else {}),
    }
    params = Params(
        precision=precision,
        profiles=ctx.profiles,
        values=ctx.input_values,
        on_fail=recipe.verify.on_fail,
        data=data,
        **settings,
        **tools,
        accuracy=Accuracy(
            samples=recipe.accuracy.samples,
            seed=recipe.accuracy.seed,
            tolerance=recipe.accuracy.tolerance(precision),
            fallback=recipe.accuracy.fallback(precision),
            search=SEARCH_VERSION if recipe.accuracy.fallback(precision) == "auto" else None,
        ),
        task=_task_check(recipe.accuracy, precision),
    )
    sources = calibration.sources(ctx.calibration_split, ctx.root) + taskdata.sources(
        taskdata.plan_files(ctx.item, ctx.root), ctx.root
    )
    return Node(id=base.id, version=VERSION, params=params, deps=base.deps, sources=sources, info=base.info)


def _task_check(options: Any, precision: str) -> TaskCheck | None:
    """The task metric and this precision's max_drop; None without labelled data."""
    if options.data is None:
        return None
    limit = options.max_drop(precision)
    return TaskCheck(metric=options.metric or (limit[0] if limit else "top1"), max_drop=limit[1] if limit else None)


def report_dep(ctx: RecipeContext, precision: str, role: str) -> tuple[Dep, ...]:
    """A reduced precision's report (accuracy, calibration) as an input named `role`; fp32 has none."""
    return () if precision == "fp32" else (Dep(role, NodeId.of(KIND, ctx.name, precision), "report"),)


def run(params: Params, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    """fp32: the cleaned model as is. Others: convert or quantize with ModelOpt, then prove accuracy against fp32."""
    precision = params.precision
    if precision == "fp32":
        return StageOutput(
            files=_pass_through(inputs["model"], workdir), record={"precision": "fp32", "accuracy": None}
        )
    if precision not in AUTOCAST_PRECISIONS + QUANTIZED_PRECISIONS:
        raise StageError(f"unknown precision {precision}")
    # copies: ModelOpt's PTQ rewrites its input in place (onnx.shape_inference.infer_shapes_path(onnx_path)), which
    # through a hard link rewrote the store's object while the recipe's other precisions read it ("Unable to parse");
    # and onnx (1.21) refuses to load external data from a file with more than one link ("potential hardlink attack")
    placed = place_side_by_side(inputs["model"].files, MODEL, workdir / "source", copy=tuple(inputs["model"].files))
    source = placed["model"]
    model_inputs = calibration.model_input_types(source)
    held_out, calibrating = precision_samples.declared_samples(params, inputs, model_inputs, source)
    from trtflow.stages import accuracy, compare, fallback, fallback_trial, shared_outputs, task

    compare.onnxruntime()  # refuse a broken ONNX Runtime install before ModelOpt trips over it
    samples, data = precision_samples.accuracy_samples(params, source, held_out, calibrating)
    feeds = [s.feed for s in samples]
    searching = params.accuracy is not None and params.accuracy.fallback == "auto"
    reference = shared_outputs.Reference(source, digests := inputs["model"].sha256, feeds)  # fp32's outputs, once
    checking = _Checking(feeds, data, bool(held_out), reference, task.rows(params, inputs, source))
    calibrated = _Calibration(calibrating, {} if searching else None, digests)  # histograms made once
    attempt = functools.partial(_attempt, params, inputs, source, calibrated, checking, workdir)
    chosen, searched = attempt("", ()), None
    if not chosen.accuracy["passed"] and searching:
        tolerance = chosen.accuracy["tolerance"]
        limit = task.Limit.of(checking.labelled, source)  # max_drop: trials are held to it too
        sets = accuracy.set_outputs(source)
        trial = fallback_trial.Trial(
            chosen.files[MODEL], feeds, reference.needed(), sets, tolerance, limit, source, notes_in(workdir)
        )
        try:
            chosen, searched = fallback.search(chosen, attempt, trial, tolerance.get("min_share"))
        except TrtflowError:
            raise
        except Exception as exc:  # a trial model ONNX Runtime refused: one line, the cause kept for -v
            first = (str(exc).strip().splitlines() or [""])[0]
            raise StageError(f"fallback: auto could not run a trial model: {type(exc).__name__}: {first}") from exc
        fallback.name_kept(chosen, searched)
    if not chosen.accuracy["passed"] and params.on_fail == "fail":
        raise StageError(_failure_message(precision, chosen.accuracy) + fallback.said(searched))
    record = {
        "precision": precision,
        "tool": f"nvidia-modelopt {tool_version('nvidia-modelopt')}",
        **chosen.details,
        "accuracy": chosen.accuracy,
        "composition": chosen.made_of,
        **({"fallback": searched} if searched is not None else {}),
    }
    return StageOutput(files={**chosen.files, "report": _report(record, workdir)}, record=record)


@dataclass(frozen=True)
class _Calibration:
    """What each ModelOpt run of a stage calibrates on (None: seeded samples), the histograms it collected (kept
    across a fallback search's runs; else None), and the digests of the model's files (what the run's stages share
    is named by them: stages.shared_outputs)."""

    samples: list | None
    histograms: dict | None
    digests: dict[str, str]


@dataclass(frozen=True)
class _Checking:
    """What every accuracy check of one stage compares over: the feeds, what they are, and fp32's outputs
    (shared_outputs.Reference: known, or computed by the first check)."""

    feeds: list[dict]
    data: str
    held_out: bool
    reference: Reference
    labelled: Any = None  # task.Rows: the labelled rows of accuracy.data, when the recipe has them


def _attempt(
    params: Params,
    inputs: dict[str, Upstream],
    source: Path,
    calibrated: _Calibration,
    checking: _Checking,
    workdir: Path,
    folder: str,
    kept: tuple[str, ...],
) -> Attempt:
    """Make the reduced-precision model (with `kept` nodes left in high precision: the fallback), save it into
    `workdir/folder`, and check it."""
    import onnx

    from trtflow.stages import fallback, task

    if kept:  # ModelOpt keeps them itself: PTQ's nodes_to_exclude, AutoCast's (the recipe's own keeps stay first)
        exact = [f"^{re.escape(name)}$" for name in kept]
        if params.autocast is not None:
            autocast = params.autocast.model_copy(update={"keep_nodes": [*params.autocast.keep_nodes, *exact]})
            params = params.model_copy(update={"autocast": autocast})
        else:
            quantize = required(params.quantize, "quantize")
            params = params.model_copy(
                update={"quantize": quantize.model_copy(update={"exclude_nodes": [*quantize.exclude_nodes, *exact]})}
            )
    out, say = workdir / folder, notes_in(workdir)
    out.mkdir(parents=True, exist_ok=True)
    with released_after():  # ModelOpt's graphs and reference outputs, before the accuracy run loads two models
        say(f"ModelOpt making the {params.precision} model" + (f" ({len(kept)} node(s) kept high)" if kept else ""))
        model, details, reasons = _convert(params, source, calibrated, out)
    # a model that came with external data keeps it (so one past 2 GB stays loadable), and is checked from its files
    files, _ = save_model(onnx, canonical_order(model), out, external=MODEL_DATA in inputs["model"].files)
    excluded = (params.quantize.exclude_op_types, params.quantize.exclude_nodes) if params.quantize else ()
    made_of = composition(model, params.precision, reasons, excluded)
    del model  # its weights: the checks below read the saved files
    saved = files[MODEL]
    say(f"checking the {params.precision} model's accuracy on {len(checking.feeds)} sample(s)")
    checked = task.checked(
        _share_checked(_accuracy(params, saved, source, checking), made_of),
        checking.labelled,
        params.precision,
        saved,
        source,
    )
    return fallback.Attempt(files, details, made_of, checked, kept)


def _share_checked(accuracy: dict, made_of: dict) -> dict:
    """The accuracy report failed too when less than `min_share` of the weights or MACs runs in the precision."""
    limit = accuracy["tolerance"].get("min_share")
    share = min(made_of["weight_share"], made_of["mac_share"])
    if limit is None or share >= limit:
        return {**accuracy, "problems": []}
    top = ", ".join(f"{k['name']} ({k['op']}, {k['weights']} weights: {k['reason']})" for k in made_of["kept"][:3])
    problem = (
        f"only {made_of['weight_share']:.1%} of the weights and {made_of['mac_share']:.1%} of the MACs run in "
        f"{made_of['precision']} (min_share {limit}); {made_of['kept_nodes']} node(s) kept higher, the largest: {top}"
    )
    return {**accuracy, "problems": [problem], "passed": False}


def _report(record: dict, workdir: Path) -> Path:
    """The record as an output too: verify and package depend on its digest, so a new accuracy report or
    calibration digest reaches the manifest even when the model came out byte-identical (and builds stay cached)."""
    path = workdir / "precision.json"
    path.write_text(json.dumps(record, sort_keys=True, indent=1) + "\n")
    return path


def _convert(params: Params, source: Path, calibrated: _Calibration, workdir: Path) -> tuple[Any, dict, dict]:
    """The reduced-precision model, what to record about how it was made, and why the tool kept nodes higher."""
    from trtflow.stages import shared_outputs

    precision, printed, calibrating = params.precision, [], calibrated.samples
    try:
        with convert.quiet() as printed:
            if precision in AUTOCAST_PRECISIONS:
                autocast = required(params.autocast, "autocast").model_dump()
                samples = calibrating or precision_samples.range_samples(source, params)
                details = {
                    "autocast": autocast,
                    "autocast_data": precision_samples.autocast_data_record(params, samples, bool(calibrating)),
                    "calibration": None,
                }
                from trtflow.stages.ranges import autocast_ranges

                ranges = autocast_ranges(source, feeds := [s.feed for s in samples])
                shared_outputs.leave_ranges(calibrated.digests, feeds, ranges)  # max calibration's, if the same data
                model, reasons = convert.autocast(source, precision, autocast, ranges)
                return model, details, reasons
            samples = calibrating if calibrating is not None else precision_samples.random_samples(source, params)
            options = required(params.quantize, "quantize").model_dump()
            masked = mask_carrying_nodes(load_graph_only(source))
            options |= {
                "exclude_nodes": sorted({*options["exclude_nodes"], *masked}),
                "external_data": (source.parent / FILE_NAMES[MODEL_DATA]).exists(),
            }
            feeds = [s.feed for s in samples]
            known = shared_outputs.known_ranges(calibrated.digests, feeds) if options["method"] != "entropy" else None
            model = convert.quantize(
                source, workdir / "quantized" / "model.onnx", precision, feeds, options, calibrated.histograms, known
            )
    except TrtflowError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        said = [line for line in printed if "%|" not in line and "\r" not in line][-3:]  # no progress bars
        raise StageError(
            f"ModelOpt failed to make {precision}: {type(exc).__name__}: {first}"
            + (f" [it printed: {' | '.join(said)}]" if said else "")
        ) from exc
    summary = convert.qdq_summary(model)
    convert.check_quantized(summary, precision)
    return (
        model,
        {
            "quantize": required(params.quantize, "quantize").model_dump(),
            **({"kept_for_masks": {"nodes": masked, "why": MASK_REASON}} if masked else {}),
            "qdq": summary,
            "calibration": precision_samples.calibration_record(params, samples, calibrating is None),
        },
        {},
    )


MASK_REASON = (
    "they carry an additive attention mask (finfo(float32).min where masked) to a Softmax: no 8-bit scale holds it"
)


def _accuracy(params: Params, model: Path, source: Path, checking: _Checking) -> dict:
    """The accuracy report of `model` against fp32 over the stage's check feeds."""
    from trtflow.stages import accuracy

    tolerance = required(params.accuracy, "accuracy").tolerance
    reference = checking.reference
    result = accuracy.report(model, source, checking.feeds, tolerance, checking.data, reference.outputs, reference.keep)
    return {**result, "held_out": checking.held_out}


def _failure_message(precision: str, result: dict) -> str:
    from trtflow.stages import accuracy

    task = result.get("task")
    if task and not task["passed"] and all(o["passed"] for o in result["outputs"]):
        return (
            f"{precision} task accuracy out of limits: {result['problems'][-1].removeprefix('task accuracy: ')}; "
            "loosen "
            f"accuracy.{precision}.max_drop or calibrate differently (verify: {{on_fail: warn}} records it)"
        )
    if result.get("problems") and all(o["passed"] for o in result["outputs"]):
        return (
            f"{precision}: {result['problems'][0]}; lower accuracy.{precision}.min_share or keep fewer nodes (verify: "
            f"{{on_fail: warn}} records it)"
        )
    missed = task is not None and not task["passed"]  # both missed: the task's miss is said too, not lost
    return accuracy.failure_message(precision, result) + (f" [{result['problems'][-1]}]" if missed else "")


def _pass_through(model: Upstream, workdir: Path) -> dict[str, Path]:
    return place_side_by_side(model.files, MODEL, workdir)


def expected_memory(node: Node) -> tuple[int, float]:
    """(base bytes, bytes per model byte) a precision node is expected to peak at, by what it does with the model.

    fp16/bf16: trtflow's range pass costs one inference, AutoCast (its whole-model passes on stand-ins, see
    stages.weightless) about three copies of the weights; measured peaks (GiB): Whisper-tiny encoder 0.82 (33 MB),
    BERT-base 2.48 (440 MB), a 142M-parameter UNet 3.87 (571 MB, the check's activations), GPT-2-large size 8.27
    (3.1 GB), where this expects 1.11, 2.43, 2.86 and 11.1. int8/fp8: ModelOpt's PTQ calibrates on ONNX Runtime
    (activations of the calibration batches) and converts what stays higher to fp16: ResNet-18 0.90 (46 MB),
    Whisper-tiny 1.09, BERT-base 5.35-5.70, VGG-19 6.7 (548 MB), where this expects 1.10, 0.95, 5.48 and 7.0 (32 per
    byte expected 13.7 for BERT-base). fp32 links its model through: 0.07 GB measured for a 3.1 GB model."""
    if node.info.precision == "fp32":
        return 200 * MIB, 0.0
    return (1024 * MIB, 3.5) if node.info.precision in AUTOCAST_PRECISIONS else (600 * MIB, 12.0)


STAGE = Stage(
    KIND,
    VERSION,
    run,
    imports=lambda params: convert.modules_for(params.precision),
    runs_in=TOOLS_SERVER,
    warm_imports=("trtflow.stages.precision", "trtflow.stages.compare", "onnx", "onnxruntime"),
    memory=expected_memory,
    # measured (benchmarks/precision_cost.py): ResNet-18's fp16, int8 and fp8 together 9.4 s without them, 10.5 s
    # with, the run's first paying for fresh huge pages in the kernel; EfficientNet-B0's 13.0 s and 13.6 s
    huge_pages_above=base.SMALL_INPUTS,
)
