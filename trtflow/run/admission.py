"""Memory-aware admission: `-j N` starts a stage only when the expected peaks of the running stages plus its own
fit in what the run may use (`--memory`, default 90% of the memory available when the run starts).

A stage's expectation is its own last measured peak (remembered in the store), else its kind's declaration for the
size of its largest input (its Stage's `memory`). A stage that alone exceeds the budget still runs, alone,
with a warning: waiting could not make room, and refusing would leave the project unbuildable.

    budget 8 GB, running: precision:a/fp16 (expected 5 GB)
    precision:b/fp16 expects 5 GB   -> waits until a finishes
    build:a/fp32/t  expects 0.6 GB  -> starts (5.6 GB of 8)
"""

from __future__ import annotations

from trtflow.run.plan import Resolution
from trtflow.stages import stage
from trtflow.store.store import Store
from trtflow.util.fs import size_or_zero
from trtflow.util.memory import SHARE_OF_AVAILABLE, available_bytes, expected_peak, shown


def default_budget() -> int | None:
    """What a run may use when --memory is not given: a share of the memory available now (None if unknown)."""
    available = available_bytes()
    return int(available * SHARE_OF_AVAILABLE) if available else None


class MemoryAdmission:
    """Decides whether a stage may start now, from the expected peaks of the stages already running."""

    def __init__(self, budget: int | None, store: Store):
        self.budget, self.store = budget, store

    def expected(self, resolution: Resolution) -> int:
        """The node's expected peak: its last measured one, else its kind's declaration for its largest input."""
        node = resolution.node
        declared = stage(node.kind).memory(node)
        return expected_peak(declared, self._largest_input(resolution), self.store.memos.remembered_peak(node.id))

    def admits(self, expected: int, running: list[int]) -> bool:
        """Whether a stage expected to peak at `expected` may start beside stages expected to peak at `running`."""
        return self.budget is None or not running or sum(running) + expected <= self.budget

    def alone_over(self, expected: int) -> str | None:
        """The warning for a stage that alone exceeds the budget (it runs with nothing beside it), else None."""
        if self.budget is None or expected <= self.budget:
            return None
        return (
            f"expects {shown(expected)}, more than the {shown(self.budget)} this run may use (--memory): it runs alone"
        )

    def _largest_input(self, resolution: Resolution) -> int:
        """Bytes of the node's largest input file: a store object by its digest, or a source file outside the store."""
        sizes = [size_or_zero(path) for _, path in resolution.node.sources]
        for digest in (resolution.components or {}).get("inputs", {}).values():
            if isinstance(digest, str) and len(digest) == 64:
                sizes.append(size_or_zero(self.store.objects.path(digest)))
        return max(sizes, default=0)


def beside_builds(kind: str, running: list[str], placing: bool) -> bool:
    """Whether a stage of `kind` may start now when builds run alone (`run --builds-alone`): a build only with
    nothing else running or being placed, and nothing beside a running build.

    TensorRT-RTX numbers what it generates in the order its own threads reach it: with the CPU shared (another
    stage, another build), that order, and so the engine's bytes, changes from run to run. On 18 engines of
    ResNet-18, MobileNetV3-small and EfficientNet (fp32/fp16/int8, two targets) built twice, 14 of 42 differed with
    builds beside other stages and 0 to 2 of 18 per run with builds alone (docs/reproducibility.md)."""
    if stage(kind).alone_when_asked:
        return not running and not placing
    return not any(stage(other).alone_when_asked for other in running)
