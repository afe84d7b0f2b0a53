"""The blocks `fallback: auto` ranks first: a model's candidates split where its residual connections join.

A network's quantization error is mostly made, and mended, a block at a time (a ResNet's basic block, a transformer
layer's attention or feed-forward half). Ranking whole blocks first, then the nodes of the one block the search
stops in, takes a trial per block plus a few, where ranking every node alone took a trial per node (BERT-base: 121).
Light to import: planning reads SEARCH_VERSION; the graph is walked as a protobuf, without onnx.
"""

from __future__ import annotations

import math
from typing import Any

# The search's version, in the key of every stage that searches (and of no other): 10's int8/fp8 trials read off their
# Q/DQ the tensors ModelOpt's model keeping the same nodes does (9 read every input of the kept nodes, and judged a
# convolutional network's keeps again as ModelOpt would make them before its first run), and 10 ranks every node by
# the error it adds alone, without ranking groups first (9 ranked groups, then the nodes of the groups kept); 9 ranks
# int8/fp8 on one sample (8 on two); 8 goes past min_share, to report what would meet the limits, with the last
# ranking only (7 with each); 7 cuts a confirmation's step short where it would leave less than min_share in the
# precision (6 stopped there); 6 confirms with 1, then 2 more nodes (the step doubles) when ModelOpt's model misses
# where its trial met the limits; 5 no longer tries the most nodes min_share allows first (keeping more can miss where
# fewer meet the limits); 4 tries no more nodes than min_share allows, the most it allows first (where a trial meets
# the limits, so does one keeping more: the keep of 3); 3 ranks by the error a group removes, then (int8/fp8, where
# that keeps too much) by the error each adds alone; 2 ranked by the error removed only; 2 to 4 rank groups of blocks,
# then nodes; 1 ranked every node alone.
SEARCH_VERSION = 10
QDQ = ("QuantizeLinear", "DequantizeLinear")
PASS_THROUGH = (*QDQ, "Cast", "Identity")  # what a weight or a constant may go through on its way to an Add
JOINS = ("Add", "Sum")


def blocks(graph: Any, found: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The candidates `found` ((name, op) in graph order) split into blocks, in graph order: a block ends with each
    node that joins two computed tensors (an Add or Sum none of whose inputs is a weight or a constant: a residual
    connection, or a mask added to attention scores), that node in it."""
    nodes = list(graph.graph.node)
    made_by = {output: node for node in nodes for output in node.output}
    constants = {i.name for i in graph.graph.initializer}
    constants |= {o for node in nodes if node.op_type == "Constant" for o in node.output}

    def constant(tensor: str) -> bool:
        while tensor in made_by and made_by[tensor].op_type in PASS_THROUGH and made_by[tensor].input:
            tensor = made_by[tensor].input[0]
        return tensor in constants

    wanted = dict(found)
    split: list[list[tuple[str, str]]] = [[]]
    for node in nodes:
        if node.name in wanted:
            split[-1].append((node.name, wanted[node.name]))
        if node.op_type in JOINS and len(node.input) >= 2 and not any(constant(i) for i in node.input if i):
            split.append([])
    return [block for block in split if block]


def balanced(split: list[list[tuple[str, str]]]) -> list[list[tuple[str, str]]]:
    """Consecutive blocks joined into about sqrt(candidates) groups of about as many candidates each: ranking the
    groups, then the nodes of one, takes the fewest trials (BERT-base: 36 blocks of 121 candidates, 11 groups)."""
    total = sum(len(block) for block in split)
    size = math.ceil(total / max(1, round(math.sqrt(total))))
    groups: list[list[tuple[str, str]]] = []
    for block in split:
        if groups and len(groups[-1]) < size:
            groups[-1] = groups[-1] + block
        else:
            groups.append(list(block))
    return groups
