"""What the exporters share: the stage's kind and version, the dynamic axes a recipe's profiles ask for, and the proof
that the exported ONNX computes what the source framework computes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow.errors import StageError
from trtflow.stages.base import ProofSettings
from trtflow.util.text import clipped

if TYPE_CHECKING:
    import numpy as np

# 2: CPU-independent sessions (compare.session); 3: integer inputs drawn as the exported graph accepts them, the
# torch check's rtol taken of each output's largest magnitude
KIND, VERSION = "export", 3


def dynamic_axes(profiles: list[dict[str, dict[str, list[int]]]]) -> dict[str, dict[str, list[int]]]:
    """Per input, the axes any profile's min, opt or max differs on, each with the range it spans over every profile:

    profiles [{x: min [1,3] opt [4,3] max [8,3]}, {x: shape [32,3]}] -> {x: {"0": [1, 32]}} (axis 1 static)
    """
    dynamic = {}
    for name in dict.fromkeys(name for profile in profiles for name in profile):
        shapes = [shape for profile in profiles if name in profile for shape in profile[name].values()]
        axes = {
            str(axis): [min(s[axis] for s in shapes), max(s[axis] for s in shapes)]
            for axis in range(len(shapes[0]))
            if len({s[axis] for s in shapes}) > 1
        }
        if axes:
            dynamic[name] = axes
    return dynamic


def check_against_reference(
    path: Path,
    check: ProofSettings,
    samples: int,
    profiles: list[dict],
    reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
) -> dict:
    """ONNX Runtime on the exported model vs `reference` (the source framework) on the same seeded inputs at the
    profiles' shapes, output by output name, within the recipe's fp32 tolerances: the worst over `samples`."""
    from trtflow.stages import compare

    session = compare.session(path)
    names = compare.output_names(session)
    feeds = compare.sample_feeds(session, profiles, samples, check.seed, compare.input_values(path, check.values))
    per_sample = []
    for feed, got in zip(feeds, compare.run_all(session, feeds), strict=True):
        expected = reference(feed)
        if set(expected) != set(names):
            raise StageError(
                f"the exported ONNX's outputs ({', '.join(names)}) are not the model's ({', '.join(expected)})"
            )
        per_sample.append(compare.compare_outputs(got, expected, check.rtol, check.atol))
    rows = compare.worst(per_sample)
    return {
        "runtime": compare.RUNTIME,
        "samples": len(feeds),
        "rtol": check.rtol,
        "atol": check.atol,
        "outputs": rows,
        "passed": all(row["passed"] for row in rows),
    }


def one_line(exc: BaseException) -> str:
    """An exception as one line of at most 300 characters of text, for a stage's failure."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {clipped(text, 300)}" if text else type(exc).__name__
