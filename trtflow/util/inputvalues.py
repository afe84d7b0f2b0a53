"""Which values a model's integer inputs accept, read from its graph, so every input trtflow makes is one the model
takes (the torch trial export, the cleanup proof, the precision check, verification, random calibration).

An integer input that reaches the indices of a `Gather` over a constant table (an embedding: token ids, token type
ids, position ids) takes `[0, rows)` of the smallest such table; one that reaches arithmetic, a comparison or a
`Where` instead (an attention mask) is a mask: ones with a padded tail of zeros, as a tokenizer makes them. The value
may pass through shape-only ops on the way (Cast, Unsqueeze, Reshape...). A recipe's `inputs: {NAME: {values: [LO,
HI]}}` overrides what is inferred; an integer input with neither is `unknown` (validate names it and the field).

    bert.onnx: input_ids -> Gather(word_embeddings [30522, 768])   -> Values("range", 0, 30521)
               token_type_ids -> Gather(token_type [2, 768])       -> Values("range", 0, 1)
               attention_mask -> Cast -> Unsqueeze -> Sub -> Mul    -> Values("mask", 0, 1)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np

# Ops that move an integer tensor's values without computing new ones: its indices reach past them unchanged.
CARRIERS = frozenset(
    {
        "Cast",
        "Unsqueeze",
        "Squeeze",
        "Reshape",
        "Flatten",
        "Identity",
        "Expand",
        "Transpose",
        "Slice",
        "Tile",
        "Concat",
        "Split",
        "Pad",
    }  # fmt: skip
)
# Ops through which an integer input acts as a mask: scaled, offset, compared or selected on.
MASK_USES = frozenset(
    {
        "Sub",
        "Mul",
        "Add",
        "Div",
        "Where",
        "Equal",
        "Not",
        "And",
        "Or",
        "Xor",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "Min",
        "Max",
        "CumSum",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
    }  # fmt: skip
)
GATHERS = frozenset({"Gather", "GatherND", "GatherElements"})  # their data input passes its values on
# Where a mask's values stop: probabilities, or only its shape or count goes on.
MASK_ENDS = frozenset({"Softmax", "Shape", "Size", "ConstantOfShape", "Range", "NonZero"})
# Ops whose first input is the data and the others shapes, indices or axes.
DATA_FIRST = frozenset(
    {"Reshape", "Expand", "Slice", "Tile", "Unsqueeze", "Squeeze", "Pad", "Split", "Resize", "TopK", *GATHERS}
)
INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64")


@dataclass(frozen=True)
class Values:
    """The values one input takes: `range` draws integers in [low, high], `mask` ones with a zero-padded tail."""

    kind: Literal["range", "mask"]
    low: int
    high: int  # inclusive
    why: str  # "indexes word_embeddings.weight (30522 rows)", "a mask", "the recipe"

    def draw(self, rng: np.random.Generator, shape: list[int], dtype: str) -> np.ndarray:
        """Seeded values of this kind at `shape`."""
        if self.kind == "range":
            return rng.integers(self.low, self.high, shape, endpoint=True).astype(dtype)
        return padded_mask(rng, shape).astype(dtype)


UNKNOWN = Values("range", 0, 7, "unknown")  # what trtflow drew for every integer input before it read graphs


def out_of_range(feed: dict, values: dict[str, Values]) -> tuple[str, str] | None:
    """(input, `holds 5, outside [0, 1] (indexes ... (2 rows))`) for the first integer input of `feed` with a value
    its model does not accept (inputs whose values are unknown are not judged); None if all fit."""
    import numpy as np

    for name, allowed in values.items():
        array = np.asarray(feed.get(name, ()))
        if allowed is UNKNOWN or array.size == 0 or array.dtype.kind not in "iub":
            continue
        low, high = int(array.min()), int(array.max())
        if low < allowed.low or high > allowed.high:
            bad = low if low < allowed.low else high
            return name, f"holds {bad}, outside [{allowed.low}, {allowed.high}] ({allowed.why})"
    return None


def padded_mask(rng: np.random.Generator, shape: list[int]) -> np.ndarray:
    """Ones, with each row (the last axis) zero after a seeded length of at least one: a batch of padded texts."""
    import numpy as np

    if not shape or shape[-1] == 0:
        return np.ones(shape, dtype=np.int64)
    lengths = rng.integers(1, shape[-1], size=shape[:-1], endpoint=True)
    return (np.arange(shape[-1]) < lengths[..., None]).astype(np.int64)


def recipe_values(low: int, high: int) -> Values:
    """A recipe's `values: [low, high]` (inclusive)."""
    return Values("range", low, high, "the recipe")


def inferred_values(model: Any) -> dict[str, Values | None]:
    """Per integer graph input of a ModelProto (weights need not be loaded), what it accepts; None when unknown."""
    graph = model.graph
    tables = _constant_rows(graph)
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, position))
    initializers = {t.name for t in graph.initializer}
    found: dict[str, Values | None] = {}
    for value in graph.input:
        if value.name in initializers or _dtype(value) not in INTEGER_DTYPES:
            continue
        found[value.name] = _follow(value.name, consumers, tables)
    return found


def _follow(name: str, consumers: Mapping[str, list[Any]], tables: Mapping[str, list[int]]) -> Values | None:
    """Walk forward from one input through carrier ops; the smallest table it indexes wins over a mask use."""
    rows: list[tuple[int, str]] = []
    mask = False
    seen, frontier = {name}, [name]
    while frontier:
        tensor = frontier.pop()
        for node, position in consumers.get(tensor, ()):
            if node.op_type == "Gather" and position == 1 and node.input[0] in tables:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                rows.append((tables[node.input[0]][axis], node.input[0]))
            elif node.op_type in CARRIERS or (node.op_type in GATHERS and position == 0):
                frontier.extend(o for o in node.output if o and o not in seen)
                seen.update(node.output)
            elif node.op_type in MASK_USES:
                mask = True
    if rows:
        count, table = min(rows)
        return Values("range", 0, count - 1, f"indexes {table} ({count} rows)")
    return Values("mask", 0, 1, "a mask") if mask else None


def _constant_rows(graph: Any) -> dict[str, list[int]]:
    """Tensor name -> dimensions of every initializer and Constant output: the tables a Gather can index."""
    dims = {t.name: list(t.dims) for t in graph.initializer if t.dims}
    for node in graph.node:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None and value.dims:
                dims[node.output[0]] = list(value.dims)
    return dims


def _dtype(value: Any) -> str | None:
    import numpy as np
    from onnx import helper

    elem = value.type.tensor_type.elem_type
    return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem))) if elem else None


def values_for(model: Any, overrides: Mapping[str, tuple[int, int]]) -> dict[str, Values]:
    """The values of every integer input: the recipe's where it sets them, else inferred; unknown ones take the
    range [0, 8) that an index into any table of 8 rows accepts (validate has already named them)."""
    values = {name: recipe_values(*pair) for name, pair in overrides.items()}
    for name, inferred in inferred_values(model).items():
        values.setdefault(name, inferred or UNKNOWN)
    return values


def mask_carrying_nodes(model: Any) -> list[str]:
    """Names of the nodes whose outputs carry a mask input's values on their way to a Softmax, the Softmax excluded.

    transformers turns an attention mask into an additive one, `(1 - mask) * finfo(float32).min`, and adds it to the
    attention scores: these tensors hold -3.4e38 beside values near 1, which no int8/fp8 histogram can bin (ModelOpt:
    "Too many bins for data range") and no 8-bit scale can hold. They stay in higher precision; the Softmax turns
    them into probabilities that quantize well.
    """
    masks = [name for name, values in inferred_values(model).items() if values is not None and values.kind == "mask"]
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found: dict[str, None] = {}
    seen, frontier = set(masks), list(masks)
    while frontier:
        tensor = frontier.pop()
        for node in consumers.get(tensor, ()):
            if node.op_type in MASK_ENDS or node.name in found or not _carries_values(node, tensor):
                continue
            found[node.name] = None
            frontier.extend(o for o in node.output if o and o not in seen)
            seen.update(node.output)
    return sorted(found)


def _carries_values(node: Any, tensor: str) -> bool:
    """Whether `node`'s outputs hold values of its input `tensor`, not only its shape (a mask's shape reaches every
    Reshape of the hidden states; its values only the scores)."""
    return node.op_type not in DATA_FIRST or node.input[0] == tensor
