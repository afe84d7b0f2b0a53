"""Run two ONNX models on ONNX Runtime (CPU) over the same seeded inputs and compare their outputs.

Every model transformation proves itself with this, where it happens: cleanup (cleaned == source within
fp32 tolerances), precision (reduced precision close to fp32), and verify (the engine, on a GPU).
Inputs are drawn at each profile's opt, min and max shapes in turn, so dynamic dimensions are exercised.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import numpy as np

from trtflow.backends.base import import_or_explain
from trtflow.errors import EnvironmentProblem, StageError, required
from trtflow.util.inputvalues import UNKNOWN, Values, values_for
from trtflow.util.onnxio import ModelIO, load_graph_only, model_io_of_file
from trtflow.util.versions import tool_version

ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(bfloat16)": "bfloat16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}
RUNTIME = "onnxruntime CPUExecutionProvider"
# Two models up to this size each run side by side (each session on one thread, so the numbers are the same either
# way): a proof takes half the wall time on two cores. Larger ones run one after the other, so a multi-GB model is in
# memory once, not twice.
SIDE_BY_SIDE_MAX_BYTES = 512 << 20
T = TypeVar("T")
U = TypeVar("U")


def onnxruntime() -> Any:
    """The onnxruntime module, refusing an environment that has both the CPU and the GPU distribution."""
    if tool_version("onnxruntime") and tool_version("onnxruntime-gpu"):
        raise EnvironmentProblem(
            "both onnxruntime and onnxruntime-gpu are installed; they overwrite each other's files: "
            "pip uninstall -y onnxruntime onnxruntime-gpu, then install a trtflow extra that brings ONNX Runtime "
            "(quant and verify both bring onnxruntime, the CPU build)"
        )
    return import_or_explain("onnxruntime", "verify")


def session(model: Path | bytes, threads: int = 1, in_node_order: bool = False) -> Any:
    """A CPU session (on one core by default: comparisons run beside parallel builds), from a file or a serialized
    model. `in_node_order`: nodes run in the graph's order (ONNX Runtime's priority-based order; its default order,
    a reverse depth-first walk from the outputs, can run a node far from its inputs' producers and keep them alive)."""
    ort = onnxruntime()
    options = _cpu_options(ort, threads)
    if in_node_order:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    return ort.InferenceSession(
        model if isinstance(model, bytes) else str(model), options, providers=["CPUExecutionProvider"]
    )


def session_beside(model_path: Path, graph: Any, threads: int = 1) -> Any:
    """A session, in node order, of `graph`: a variant of the model at `model_path` whose weights may stay in the
    external file beside it (read through a temporary model file written there, removed once loaded)."""
    handle, name = tempfile.mkstemp(suffix=".onnx", prefix=".variant-", dir=model_path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(graph.SerializeToString())
        return session(Path(name), threads=threads, in_node_order=True)
    finally:
        os.unlink(name)


def _cpu_options(ort: Any, threads: int) -> Any:
    """Session options that run the graph as written, so a report varies as little as possible between CPUs.

    ONNX Runtime's default (ORT_ENABLE_ALL) rewrites convolutions into the NCHWc layout, blocked by the vector width
    (8 channels with AVX2, 16 with AVX-512), and its level-2 fusions swap LayerNorm, Gelu and MatMul+Add for
    kernels of their own: the sums, and every number a report derives from them, then follow the machine (measured:
    the example's fp16 max abs error 4.6855e-4 with the default, 4.6870e-4 without; the zoo's LSTM and encoder
    differ by 1e-8 and 1e-7 with the fusions). No rewrite at all, as ModelOpt's calibration sessions run, costs
    little (6 samples of the zoo's ResNet: 0.12 s against 0.09 s). Kernels ONNX Runtime itself picks by CPU
    (Softmax, Tanh, Erf) remain.

    No CPU memory arena (ModelOpt's calibration sessions run without it too): the arena keeps every block it ever
    took and extends itself by powers of two, so a model with large activations held several times its working set
    for the session's life (the accuracy check of a 142M-parameter UNet at fp16: 5.15 GiB with the arena, 2.9 GiB
    without, the same numbers, no slower). What a run allocates then goes back to the system when it is freed.
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_cpu_mem_arena = False
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return options


@dataclass(frozen=True)
class Signature:
    """A model's inputs and outputs named and typed as ONNX Runtime shows them (`tensor(float)`), read from the
    graph."""

    inputs: list[Any]
    outputs: list[Any]

    def get_inputs(self) -> list[Any]:
        """Like InferenceSession.get_inputs: objects with .name and .type."""
        return self.inputs

    def get_outputs(self) -> list[Any]:
        """Like InferenceSession.get_outputs: objects with .name and .type."""
        return self.outputs


def signature(path: Path) -> Signature:
    """I/O of a model without an ONNX Runtime session: also for what its CPU provider cannot run (bf16 kernels)."""
    return signature_of(model_io_of_file(path))


def signature_of(io: ModelIO) -> Signature:
    """A Signature (what an InferenceSession answers) of a model's inputs and outputs."""
    return Signature(
        [SimpleNamespace(name=t.name, type=t.ort_type, shape=t.dims or []) for t in io.inputs],
        [SimpleNamespace(name=t.name, type=t.ort_type, shape=t.dims or []) for t in io.outputs],
    )


def output_names(sess: Any) -> list[str]:
    """Output names in the model's order, from an InferenceSession or a Signature."""
    return [o.name for o in sess.get_outputs()]


def run_all(sess: Any, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Outputs by name for each feed. Only the inputs the model declares are passed, each cast to the dtype it
    declares (an fp16-I/O model takes fp16 from the same fp32 feeds)."""
    names = output_names(sess)
    wanted = [(i.name, ORT_DTYPES.get(i.type, "float32")) for i in sess.get_inputs()]
    return [
        dict(
            zip(
                names,
                sess.run(None, {k: np.asarray(feed[k]).astype(dtype, copy=False) for k, dtype in wanted}),
                strict=True,
            )
        )
        for feed in feeds
    ]


def input_values(model: Path, overrides: Mapping[str, tuple[int, int]]) -> dict[str, Values]:
    """What each integer input of a model file accepts: the recipe's `inputs:` values, else read from its graph."""
    return values_for(load_graph_only(model), overrides)


def sample_feeds(
    sess: Any, profiles: list[dict], samples: int, seed: int, values: Mapping[str, Values] | None = None
) -> list[dict[str, np.ndarray]]:
    """Seeded inputs: sample i uses profile i % P at its opt, min or max shape in turn (static shapes if no profile).
    Integer inputs take `values` (input_values: token ids within their table, masks of ones with a padded tail)."""
    rng = np.random.default_rng(seed)
    feeds = []
    for index in range(samples):
        profile = profiles[index % len(profiles)] if profiles else {}
        which = ("opt", "min", "max")[(index // max(len(profiles), 1)) % 3]
        feeds.append(
            {i.name: _random(rng, i, profile.get(i.name, {}).get(which), values or {}) for i in sess.get_inputs()}
        )
    return feeds


def _random(rng: np.random.Generator, meta: Any, shape: list[int] | None, values: Mapping[str, Values]) -> np.ndarray:
    shape = shape or [d if isinstance(d, int) else 1 for d in meta.shape]
    dtype = ORT_DTYPES.get(meta.type)
    if dtype is None or dtype == "bfloat16":
        raise StageError(f"input {meta.name!r} has type {meta.type}, which verification cannot generate yet")
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return values.get(meta.name, UNKNOWN).draw(rng, shape, dtype)


def compare_outputs(
    actual: dict[str, np.ndarray],
    expected: dict[str, np.ndarray],
    rtol: float,
    atol: float,
    of_magnitude: bool = False,
) -> list[dict]:
    """Per output: max abs error, max rel error, and whether |a-e| <= atol + rtol*|e| everywhere (`of_magnitude`:
    atol + rtol*max|e|, the output's largest magnitude, where elements are all computed alike)."""
    results: list[dict] = []
    for name, want in expected.items():
        got = np.asarray(actual[name], dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            results.append(
                {
                    "name": name,
                    "max_abs_error": None,
                    "max_rel_error": None,
                    "passed": False,
                    "problem": f"shape {list(got.shape)} != {list(want.shape)}",
                }
            )
            continue
        error = np.abs(got - want)
        results.append(
            {
                "name": name,
                "max_abs_error": float(error.max(initial=0.0)),
                "max_rel_error": float((error / np.maximum(np.abs(want), 1e-12)).max(initial=0.0)),
                "passed": bool(
                    np.all(error <= atol + rtol * (np.abs(want).max(initial=0.0) if of_magnitude else np.abs(want)))
                ),
            }
        )
    return results


def worst(per_sample: list[list[dict]]) -> list[dict]:
    """Fold per-sample results into one row per output: the largest errors, passed only if every sample passed."""
    folded: dict[str, dict] = {}
    for rows in per_sample:
        for row in rows:
            seen = folded.setdefault(row["name"], dict(row))
            for key in ("max_abs_error", "max_rel_error"):
                if row[key] is None or seen[key] is None:
                    seen[key] = None
                else:
                    seen[key] = max(seen[key], row[key])
            seen["passed"] = seen["passed"] and row["passed"]
    return list(folded.values())


def side_by_side(*sizes: int) -> bool:
    """Whether models of these sizes (bytes, weights included) may run at once: each small enough, two cores."""
    return (os.cpu_count() or 1) >= 2 and all(size <= SIDE_BY_SIDE_MAX_BYTES for size in sizes)


class SessionPool:
    """`threads` threads, each running feeds on a session of its own, made by `make_session` on its first feed (one
    thread inside each, so every output is what any one session gives: the same numbers whatever the split). With one
    thread, a single session runs them in this thread. Sessions live as long as the pool: several `run`s reuse them."""

    def __init__(self, make_session: Callable[[], Any], threads: int):
        self._make, self._threads = make_session, max(1, threads)
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(self._threads, "compare") if self._threads > 1 else None

    def run(self, feeds: list[dict]) -> list[dict]:
        """Each feed's outputs, in feed order (ONNX Runtime releases the GIL: the threads run at once)."""
        return list(self.each(feeds))

    def each(self, feeds: list[dict]) -> Iterator[dict]:
        """Each feed's outputs, in feed order, as they come: every feed is started at once."""
        if self._pool is None:
            return (self._one(feed) for feed in feeds)
        return self._pool.map(self._one, feeds)

    def submit(self, work: Callable[[], T]) -> Future:
        """Run `work` on one of the threads (a pool of more than one)."""
        return required(self._pool, "a pool of threads").submit(work)

    def _one(self, feed: dict) -> dict:
        if not hasattr(self._local, "session"):
            self._local.session = self._make()
        return run_all(self._local.session, [feed])[0]

    def close(self) -> None:
        """End the threads, and with them their sessions."""
        if self._pool is not None:
            self._pool.shutdown()
        self._local = threading.local()

    def __enter__(self) -> SessionPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def run_spread(
    make_session: Callable[[], Any], feeds: list[dict], threads: int, beside: Callable[[], T] | None = None
) -> tuple[list[dict], T | None]:
    """run_all over `feeds` by a SessionPool of `threads`, in feed order; `beside` (the reference's run) is taken first
    by one of its threads (with one thread: after the feeds, once their session is freed). Returns (outputs, what
    `beside` returned)."""
    if threads <= 1:
        with SessionPool(make_session, 1) as sessions:
            outputs = sessions.run(feeds)
        return outputs, beside() if beside is not None else None
    with SessionPool(make_session, threads) as sessions:
        later = sessions.submit(beside) if beside is not None else None
        outputs = sessions.run(feeds)
        return outputs, later.result() if later is not None else None


def threads_for(*sizes: int) -> int:
    """How many sessions of models of these sizes may run at once: every core while each is small enough, else 1."""
    return (os.cpu_count() or 1) if side_by_side(*sizes) else 1


def model_bytes(path: Path) -> int:
    """A model file's size with the external data files its graph names."""
    from trtflow.stages.modelfile import external_data_locations

    return path.stat().st_size + sum((path.parent / name).stat().st_size for name in external_data_locations(path))


def both(first: Callable[[], T], second: Callable[[], U], together: bool) -> tuple[T, U]:
    """(first(), second()), in two threads at once when `together` (ONNX Runtime releases the GIL while it runs),
    else one after the other."""
    if not together:
        done = first()
        return done, second()
    with ThreadPoolExecutor(1, thread_name_prefix="compare") as pool:
        later = pool.submit(second)
        return first(), later.result()


def prove_equal(candidate: Path, reference: Path, profiles: list[dict], tolerance: dict) -> dict:
    """Run both models on the same seeded inputs; the record says per output how far apart they are.

    `tolerance` holds rtol, atol, samples and seed (the recipe's `verify:` block) and the recipe's integer input
    `values`; other integer inputs take the values the reference's graph accepts. Small models run side by side;
    larger ones one session at a time: each holds the model's weights, so a multi-GB model is in memory once.
    """
    ref = session(reference)
    values = input_values(reference, tolerance.get("values", {}))
    feeds = sample_feeds(ref, profiles, tolerance["samples"], tolerance["seed"], values)
    if side_by_side(model_bytes(reference), model_bytes(candidate)):
        expected, actual = both(lambda: run_all(ref, feeds), lambda: run_all(session(candidate), feeds), True)
    else:
        expected = run_all(ref, feeds)
        del ref
        actual = run_all(session(candidate), feeds)
    per_sample = [
        compare_outputs(got, want, tolerance["rtol"], tolerance["atol"])
        for got, want in zip(actual, expected, strict=True)
    ]
    outputs = worst(per_sample)
    return {
        "runtime": RUNTIME,
        "samples": len(feeds),
        "rtol": tolerance["rtol"],
        "atol": tolerance["atol"],
        "outputs": outputs,
        "passed": all(o["passed"] for o in outputs),
    }


def failure_message(what: str, comparison: dict) -> str:
    """`<what> out of tolerance (rtol .., atol ..): first differing output logits max abs .. max rel ..`."""
    bad = [o for o in comparison.get("outputs", []) if not o["passed"]]
    first = bad[0] if bad else {"name": "?", "max_abs_error": None, "max_rel_error": None}
    detail = first.get("problem") or f"max abs {first['max_abs_error']} max rel {first['max_rel_error']}"
    return (
        f"{what} out of tolerance (rtol {comparison.get('rtol')}, atol {comparison.get('atol')}): "
        f"first differing output {first['name']} {detail}"
    )
