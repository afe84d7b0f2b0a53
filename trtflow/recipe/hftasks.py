"""The tasks a Hugging Face folder can be exported for: which class loads it, its inputs in forward's order, and the
output the ONNX graph returns. Plain data: the recipe loader checks profiles against it, the exporter runs it.

HF Optimum's exporter knows these too (and many more), but optimum-onnx 0.1 requires transformers < 4.58: with the
transformers 5 that current models need it cannot be installed, so trtflow exports with torch.onnx.export itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TEXT_INPUTS = (("input_ids", "int64"), ("attention_mask", "int64"), ("token_type_ids", "int64"))


@dataclass(frozen=True)
class Task:
    """`library.loader.from_pretrained(folder)` makes the model; it is called with the inputs the profiles name (in
    this order; `required` ones always) and returns `output` (an attribute of what the model returns)."""

    library: str  # transformers | diffusers
    loader: str  # the class whose from_pretrained loads the folder
    inputs: tuple[tuple[str, str], ...]  # (name, dtype)
    required: tuple[str, ...]
    output: str
    output_name: str | None = None  # the ONNX output's name when `output` is also an input's (a UNet's sample)
    encoder_only: bool = False  # call model.get_encoder() (a speech model's encoder)
    config: dict[str, object] = field(default_factory=dict)  # set on the loaded config (no key/value cache)


TASKS: dict[str, Task] = {
    "text-classification": Task(
        "transformers", "AutoModelForSequenceClassification", TEXT_INPUTS, ("input_ids",), "logits"
    ),
    "token-classification": Task(
        "transformers", "AutoModelForTokenClassification", TEXT_INPUTS, ("input_ids",), "logits"
    ),
    "feature-extraction": Task("transformers", "AutoModel", TEXT_INPUTS, ("input_ids",), "last_hidden_state"),
    "text-generation": Task(
        "transformers", "AutoModelForCausalLM", TEXT_INPUTS[:2], ("input_ids",), "logits", config={"use_cache": False}
    ),
    "image-classification": Task(
        "transformers", "AutoModelForImageClassification", (("pixel_values", "float32"),), ("pixel_values",), "logits"
    ),
    "speech-encoder": Task(
        "transformers",
        "AutoModelForSpeechSeq2Seq",
        (("input_features", "float32"),),
        ("input_features",),
        "last_hidden_state",
        encoder_only=True,
    ),
    "unet": Task(
        "diffusers",
        "UNet2DConditionModel",
        (("sample", "float32"), ("timestep", "float32"), ("encoder_hidden_states", "float32")),
        ("sample", "timestep", "encoder_hidden_states"),
        "sample",
        output_name="out_sample",
    ),
}


def graph_output(task: str) -> str:
    """The name of the exported graph's output."""
    return TASKS[task].output_name or TASKS[task].output


def task_inputs(task: str, named: set[str] | list[str]) -> list[tuple[str, str]]:
    """The task's (name, dtype) inputs that `named` (the profiles' inputs) lists, plus the required ones, in order."""
    spec = TASKS[task]
    return [(name, dtype) for name, dtype in spec.inputs if name in named or name in spec.required]
