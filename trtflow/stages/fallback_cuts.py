"""The sensitivity trials of an int8/fp8 ranking, each run from where it starts to differ from the ranking's baseline.

A ranking measures units (a group of candidates, or one node of a group) against one baseline: every candidate quantized
(the error a unit removes) or every candidate high (the error a unit adds alone). A trial differs from its baseline only
in one group's nodes, so everything before them is the baseline's: the baseline runs once over the ranking samples and
keeps what each group's part reads at its cut (the reference activations, shared); each group's part
(fallback_switch.downstream: the nodes its switches reach, its own switches free, every other wired as in the baseline)
then runs once per unit of that group, over one session per thread that lives while that group is measured, every unit
and sample of the group at once (one ranking sample still fills every core). On a network whose candidates are spread
along it, that is about half the work of whole-model trials, and a session per group instead of per trial. The numbers
are those of the whole trial model, bit for bit.
"""

from __future__ import annotations

from typing import Any

from trtflow.stages import compare
from trtflow.stages.fallback_switch import declare, downstream, resolved, switches
from trtflow.stages.fallback_trial import Trial


class Cuts:
    """The trials of one ranking over the switched model `board` (the switch of each candidate in `inputs`), on the
    first `samples` feeds: `groups` (candidate names) split the candidates; `baseline` names the ones kept high in
    the baseline."""

    def __init__(
        self,
        board: Any,
        inputs: dict[str, str],
        trial: Trial,
        groups: list[list[str]],
        baseline: list[str],
        samples: int,
    ):
        self.board, self.trial, self.inputs, self.baseline = board, trial, inputs, set(baseline)
        self.feeds = trial.feeds[:samples]
        self.group_of = {name: index for index, group in enumerate(groups) for name in group}
        self.base = {switch: name in self.baseline for name, switch in inputs.items()}
        self.given = {i.name: i for i in board.graph.input if i.name not in set(inputs.values())}
        # per group: its switches and its cut (its part is made again when measured: a model holding its weights
        # inline is held once, not once per group)
        switched = [[inputs[name] for name in group if name in inputs] for group in groups]
        self.parts: list[tuple[list[str], list[str]]] = [(free, self._part(free)[1]) for free in switched]
        self.outputs = [o.name for o in board.graph.output]
        cuts = sorted({name for _, cut in self.parts for name in cut if name not in self.given})
        self.captured = self._capture(resolved(board, self.base), cuts)

    def baseline_outputs(self) -> list[dict]:
        """The baseline's outputs by name, per ranking sample."""
        return [{name: values[name] for name in self.outputs} for values in self.captured]

    def run(self, units: list[list[str]]) -> list[list[dict]]:
        """Each unit's outputs by name, per ranking sample: the baseline with the unit's nodes flipped (high where
        the baseline quantizes them, quantized where it keeps them high). A unit lies within one group; units are
        run group by group."""
        results: list[list[dict]] = [[] for _ in units]
        measured = 0
        by_group: dict[int, list[int]] = {}
        for index, unit in enumerate(units):
            by_group.setdefault(self.group_of[unit[0]], []).append(index)
        for group, indices in sorted(by_group.items()):
            free, cut = self.parts[group]
            if not free:  # nothing of this group reads through Q/DQ: each unit computes the baseline
                for index in indices:
                    results[index] = self.baseline_outputs()
                continue
            feeds = [
                {**feed, **{n: values[n] for n in cut if n in values}}
                for feed, values in zip(self.feeds, self.captured, strict=True)
            ]
            made = declare(self._part(free)[0], [self.given[n] if n in self.given else feeds[0][n] for n in cut], cut)
            mine = {name: switch for name, switch in self.inputs.items() if switch in free}
            with compare.SessionPool(self.trial.sessions(made), self.trial.threads) as sessions:
                # every (unit, feed) of the group at once, over the pool's sessions: one feed still fills the cores
                fed = [switches(mine, self.baseline ^ set(units[index])) for index in indices]
                got = sessions.each([{**feed, **wired} for wired in fed for feed in feeds])
                for index in indices:
                    own = [next(got) for _ in feeds]
                    results[index] = [{**base, **new} for base, new in zip(self.baseline_outputs(), own, strict=True)]
                    measured += 1
                    self.trial.say_measured(measured, len(units))
        return results

    def _part(self, free: list[str]) -> tuple[Any, list[str]]:
        """(the part the switches `free` reach, every other switch wired as in the baseline; its cut)."""
        return downstream(resolved(self.board, {s: v for s, v in self.base.items() if s not in free}), free)

    def _capture(self, baseline: Any, cut: list[str]) -> list[dict]:
        """The baseline's graph outputs and every cut tensor the rest computes, per ranking sample."""
        import onnx

        known = set(self.outputs)
        baseline.graph.output.extend(onnx.ValueInfoProto(name=name) for name in cut if name not in known)
        return compare.run_spread(self.trial.sessions(baseline), self.feeds, self.trial.threads)[0]
