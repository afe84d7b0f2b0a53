"""Export: a Hugging Face `save_pretrained` folder (transformers or diffusers) to ONNX for a task.

Every file of the folder is an input of the stage (config, safetensors weights, tokenizer files: editing any one
re-exports); they are placed side by side in the stage's folder under their own names and loaded from there with
`from_pretrained(..., local_files_only=True)`: nothing is fetched from a hub at run time. The task (recipe.hftasks)
says which class loads the folder, which inputs the model takes and which output the graph returns; the inputs are
those the profiles name (at their opt shapes for tracing, every axis the profiles vary dynamic: torch.export finds
that input_ids and attention_mask share batch and sequence). The export and its check are the torch source's
(torch_module).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.backends.base import import_or_explain
from trtflow.errors import StageError
from trtflow.recipe.hftasks import TASKS, Task, graph_output, task_inputs
from trtflow.stages.base import (
    Node,
    NodeId,
    ProofSettings,
    RecipeContext,
    StageOutput,
    Upstream,
)
from trtflow.stages.export.common import KIND, VERSION, dynamic_axes, one_line
from trtflow.stages.export.torch_module import ExampleInput, ModuleExport, export_checked
from trtflow.util.fs import link_or_copy
from trtflow.util.reads import note_glob
from trtflow.util.versions import tool_version

FOLDER = "huggingface"  # the folder's files are the inputs huggingface/<relative path>


class Params(ModuleExport):
    """The folder's file list, the task and what the export decides, plus the versions of the libraries."""

    FINGERPRINT = ("torch", "onnx", "onnxscript", "transformers", "diffusers")
    FIELD = "source.huggingface"
    files: list[str]
    task: str
    torch: str | None
    onnx: str | None
    onnxscript: str | None
    transformers: str | None
    diffusers: str | None = None  # diffusers models only: keys of transformers models stay as they are


def node(ctx: RecipeContext) -> Node | None:
    """The export node of a Hugging Face source, else None."""
    spec = ctx.recipe.source.huggingface
    if spec is None:
        return None
    folder = (ctx.root / spec.path).resolve()
    files = folder_files(folder)
    relative = [f.relative_to(folder).as_posix() for f in files]
    profiles, verify, task = ctx.profiles, ctx.recipe.verify, TASKS[spec.task]
    inputs = [
        ExampleInput(name=name, dtype=dtype, shape=profiles[0][name]["opt"])
        for name, dtype in task_inputs(spec.task, list(profiles[0]))
    ]
    params = Params(
        files=relative,
        task=spec.task,
        inputs=inputs,
        dynamic=dynamic_axes(profiles),
        outputs=[graph_output(spec.task)],
        opset=spec.opset,
        optimize=True,  # what torch.onnx.export gives by default: SplitToSequence (chunk) becomes Split for TensorRT
        check=ProofSettings(rtol=verify.rtol, atol=verify.atol, seed=verify.seed, values=ctx.input_values),
        on_fail=verify.on_fail,
        torch=tool_version("torch"),
        onnx=tool_version("onnx"),
        onnxscript=tool_version("onnxscript"),
        transformers=tool_version("transformers"),
        diffusers=tool_version("diffusers") if task.library == "diffusers" else None,
    )
    sources = tuple((f"{FOLDER}/{name}", path) for name, path in zip(relative, files, strict=True))
    return Node(id=NodeId.of(KIND, ctx.name), version=VERSION, params=params, sources=sources)


def folder_files(folder: Path) -> list[Path]:
    """Every file under the folder, sorted; hidden ones (.cache/, .gitattributes) left out."""
    paths = sorted(folder.rglob("*"))
    note_glob("rglob", str(folder), [str(p) for p in paths])
    return [p for p in paths if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)]


def run(params: Params, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    """Place the folder, load the model for its task, export it and check the ONNX against torch."""
    folder = _placed_folder(params, inputs, workdir / FOLDER)
    task = TASKS[params.task]
    return export_checked(lambda torch: _task_module(torch, task, folder, params), params, workdir)


def _placed_folder(params: Params, inputs: dict[str, Upstream], folder: Path) -> Path:
    """The folder's files under their own names (links to the stage's inputs, copies across filesystems)."""
    for name in params.files:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(inputs[f"{FOLDER}/{name}"].files[f"{FOLDER}/{name}"], target)
    return folder


def _task_module(torch: Any, task: Task, folder: Path, params: Params) -> Any:
    """The loaded model wrapped as forward(a[, b[, c]]) -> the task's output tensor: one positional argument per
    input (torch.export matches dynamic shapes to forward's parameters, so no *args)."""
    model = _loaded(task, folder)
    names = [spec.name for spec in params.inputs]

    class TaskOutput(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def output(self, *tensors: Any) -> Any:
            return getattr(self.model(**dict(zip(names, tensors, strict=True))), task.output)

    class One(TaskOutput):
        def forward(self, a: Any) -> Any:
            return self.output(a)

    class Two(TaskOutput):
        def forward(self, a: Any, b: Any) -> Any:
            return self.output(a, b)

    class Three(TaskOutput):
        def forward(self, a: Any, b: Any, c: Any) -> Any:
            return self.output(a, b, c)

    return (One, Two, Three)[len(names) - 1]().eval()  # a task has one to three inputs (recipe.hftasks)


def _loaded(task: Task, folder: Path) -> Any:
    """`from_pretrained(folder)` of the task's class, offline, in fp32 and eval mode (an encoder alone if asked)."""
    library = import_or_explain(task.library, "huggingface", f"{task.library} loads the folder")
    loader = getattr(library, task.loader)
    try:
        model = loader.from_pretrained(str(folder), local_files_only=True, **task.config)
    except Exception as exc:
        raise StageError(f"source.huggingface.path: {task.loader} cannot load the folder: {one_line(exc)}") from exc
    model = model.get_encoder() if task.encoder_only else model
    return model.float().eval()
