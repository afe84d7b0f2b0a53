"""The memory-aware scheduler: `-j N` never starts a stage whose expected peak does not fit beside the running ones
(`--memory`, default 90% of what is available); peaks are measured per stage (a pool worker's earlier stages do not
count) and remembered for the next run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_RECIPE, trtflow, write_project

from trtflow.executors import StageTask
from trtflow.stages.base import Node, NodeId, NodeInfo, StageParams
from trtflow.stages.precision import expected_memory
from trtflow.util.memory import MIB, expected_peak, parse_size

FP16 = TINY_RECIPE.replace("precisions: [fp32]", "precisions: [fp16]") + "accuracy: {fp16: {min_top1: 0.0}}\n"


def timeline(root: Path) -> dict[str, dict]:
    """node id -> {start, end, slot, peak_rss, ...} of the last run (artifacts/run.json, which the report reads)."""
    return {node["id"]: node for node in json.loads((root / "artifacts" / "run.json").read_text())["nodes"]}


def overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def two_precisions(root: Path) -> Path:
    """Two recipes whose fp16 stages differ (another accuracy seed), so neither is the other's cached twin."""
    return write_project(
        root, {"a": FP16, "b": FP16.replace("{fp16: {min_top1: 0.0}}", "{seed: 2, fp16: {min_top1: 0.0}}")}
    )


def test_two_precision_stages_beyond_the_budget_run_one_after_the_other(tmp_path: Path) -> None:
    root = two_precisions(tmp_path / "p")
    declared = expected_peak((600 * MIB, 12.0), 0, None)  # an int8 precision stage's, before it has run
    budget = int(declared * 1.5)  # room for one precision stage, not two
    result = trtflow(root, "run", "-j", "2", "--memory", f"{budget // MIB}M", "--json")
    assert result.code == 0, result.err
    runs = timeline(root)
    assert not overlap(runs["precision:a/fp16"], runs["precision:b/fp16"])


def test_with_room_for_both_they_run_side_by_side(tmp_path: Path) -> None:
    root = two_precisions(tmp_path / "p")
    assert trtflow(root, "run", "-j", "2", "--memory", "64G").code == 0
    runs = timeline(root)
    assert overlap(runs["precision:a/fp16"], runs["precision:b/fp16"])


def test_a_stage_over_the_budget_runs_alone_and_says_so(tmp_path: Path) -> None:
    root = two_precisions(tmp_path / "p")
    result = trtflow(root, "run", "-j", "2", "--memory", "50M", "--json")
    assert result.code == 0, result.err
    warnings = json.loads(result.out)["warnings"]
    assert any(
        w.startswith("precision:a/fp16 expects ")
        and w.endswith("more than the 52 MB this run may use (--memory): it runs alone")
        for w in warnings
    )
    runs = list(timeline(root).values())
    ran = [r for r in runs if r.get("start") is not None]
    assert not any(overlap(x, y) for i, x in enumerate(ran) for y in ran[i + 1 :])


def test_peaks_are_measured_per_stage_and_remembered(tmp_path: Path) -> None:
    from trtflow.store import Store

    root = two_precisions(tmp_path / "p")
    assert trtflow(root, "run", "-j", "1").code == 0
    runs = timeline(root)
    store = Store(root / "artifacts" / "store")
    try:
        for node_id, run in runs.items():
            if run.get("start") is not None:
                assert run["peak_rss"] and store.memos.remembered_peak(node_id) == run["peak_rss"], node_id
    finally:
        store.close()


def test_a_workers_peak_is_reset_for_each_stage() -> None:
    """What a pool worker peaked at for an earlier stage is not charged to the next one (Linux clear_refs)."""
    import subprocess
    import sys

    code = (
        "import numpy as np\nfrom trtflow.util.memory import peak_rss, reset_peak\n"
        "big = np.ones(400 << 20 >> 3); big[::512] = 2; del big\nbefore = peak_rss(); reset_peak()\n"
        "small = np.ones(8 << 20 >> 3); small[::512] = 2\nprint(before, peak_rss())"
    )
    before, after = map(
        int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert before > 400 << 20 and after < before - (300 << 20)


@pytest.mark.parametrize(
    "text,expected", [("8G", 8 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("1000", 1000), ("2k", 2048)]
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_a_bad_size_is_a_usage_error(tmp_path: Path) -> None:
    result = trtflow(two_precisions(tmp_path / "p"), "run", "--memory", "lots")
    assert result.code == 2 and "'lots' is not a size" in result.err


def test_expectations_learn_from_the_last_peak_and_scale_with_the_model() -> None:
    int8 = Node(NodeId.of("precision", "m", "int8"), 1, StageParams(), info=NodeInfo(precision="int8"))
    base, per_byte = expected_memory(int8)
    assert expected_peak((base, per_byte), 548 << 20, None) == int(base + per_byte * (548 << 20))
    assert expected_peak((base, per_byte), 548 << 20, 123) == 123
    fp32 = Node(NodeId.of("precision", "m", "fp32"), 1, StageParams(), info=NodeInfo(precision="fp32"))
    assert expected_memory(fp32)[1] == 0.0  # fp32 links its model through: nothing per model byte


def test_a_pool_worker_frees_what_model_tools_leave_behind(tmp_path: Path, zoo_dir: Path) -> None:
    """onnxslim's graph is a web of reference cycles the collector may leave for long: stage after stage, nothing of
    it accumulates in a pool worker (automatic collection is off here, so only trtflow's own release can free it;
    that release runs after stages that grew the process by RELEASE_ABOVE, here set to 0)."""
    import subprocess
    import sys

    import yaml
    from zoo import zoo_model

    model = zoo_model("resnet", zoo_dir)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "pipeline.yaml").write_text("targets:\n  ada: {backend: tensorrt-rtx, compute_capabilities: [sm_89]}\n")
    recipe = {"source": {"onnx": str(model.path)}, "precisions": ["fp32"], "profiles": [model.recipe_profile()]}
    (tmp_path / "recipes" / "m.yaml").write_text(yaml.safe_dump(recipe))
    code = f"""
import gc
from pathlib import Path
gc.disable()
import trtflow.util.memory
trtflow.util.memory.RELEASE_ABOVE = 0  # a small model: release after every stage, as after a large one
from trtflow.run.dag import dag_from_project
from trtflow.executors import StageTask, run_task
from trtflow.recipe import load_project
from trtflow.stages.base import Upstream
node = {{n.id: n for n in dag_from_project(load_project(Path({str(tmp_path)!r})))}}["cleanup:m"]
source = Upstream({{"model": Path({str(model.path)!r})}}, sha256={{"model": "0" * 64}})
for run in range(3):
    work = Path({str(tmp_path)!r}) / f"work{{run}}"
    work.mkdir()
    assert run_task(StageTask(node.id, "cleanup", node.params, {{"model": source}}, work)).error is None
    print(sum(type(o).__qualname__ == "Node" and type(o).__module__.startswith("onnxslim") for o in gc.get_objects()))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    after = [int(count) for count in done.stdout.split()]
    assert after[0] == after[1] == after[2], after  # graph nodes left alive: the same few after each stage


def test_a_worker_server_keeps_nothing_of_the_stages_it_forks(tmp_path: Path, zoo_dir: Path) -> None:
    """Cleanup and precision stages run in children of a worker server: the server's own memory stays what its imports
    made it, stage after stage (a pool worker kept what the model tools left behind: a VGG-19's fp16 precision stage
    peaked at 7.9 GB after its cleanup in the same worker, 5.5 GB forked), and each stage's peak is measured in its
    child."""
    import yaml
    from zoo import zoo_model

    from trtflow.executors.forking import TOOLS_SERVED, ForkServers, run_forked
    from trtflow.recipe import load_project
    from trtflow.run.dag import dag_from_project
    from trtflow.stages.base import Upstream
    from trtflow.util.settings import Settings

    model = zoo_model("encoder", zoo_dir)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "pipeline.yaml").write_text("targets:\n  ada: {backend: tensorrt-rtx, compute_capabilities: [sm_89]}\n")
    recipe = {"source": {"onnx": str(model.path)}, "precisions": ["fp32"], "profiles": [model.recipe_profile()]}
    (tmp_path / "recipes" / "m.yaml").write_text(yaml.safe_dump(recipe))
    node = {n.id: n for n in dag_from_project(load_project(tmp_path))}["cleanup:m"]
    source = Upstream({"model": model.path}, sha256={"model": "0" * 64})
    servers = ForkServers(TOOLS_SERVED, Settings(), hermetic=False)
    try:
        servers.fill(1)
        (server,) = servers._idle
        resident = []
        for run in range(3):
            work = tmp_path / f"work{run}"
            work.mkdir()
            result = run_forked(StageTask(node.id, "cleanup", node.params, {"model": source}, work), servers)
            assert result.error is None, result.error
            assert (work / "model.onnx").is_file() and result.peak_rss > _resident(server.process.pid)
            resident.append(_resident(server.process.pid))
        assert servers._idle == [server] and not list(server.slot.iterdir())
    finally:
        servers.close()
    assert max(resident) - min(resident) < 4 * MIB, resident  # nothing of three cleanups stayed in the server


def _resident(pid: int) -> int:
    """A process's resident set size in bytes (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_an_fp32_precision_passes_its_model_through_and_is_expected_to_need_little(project: Path) -> None:
    """fp32 links the cleaned model through: a 3.1 GB model's took 0.07 GB where 99.7 GB were expected of it."""
    result = trtflow(project, "run", "--memory", "300M", "--json")
    assert result.code == 0, result.err
    warnings = json.loads(result.out)["warnings"]
    assert not [w for w in warnings if w.startswith("precision:tiny/fp32")]
    assert [w for w in warnings if w.startswith("cleanup:tiny expects")]  # the budget is tight for the others


def test_a_model_tools_process_reuses_the_memory_it_frees() -> None:
    """Arrays of growing sizes allocated and freed in turn, as numpy and ONNX Runtime do in a precision stage: by
    default glibc maps many afresh or hands freed heap back, and the kernel zeroes those pages again (a fault a page);
    a worker server's process keeps them (util.memory.keep_freed_memory, inherited by the children it forks)."""
    import subprocess
    import sys

    code = """
import resource, sys
import numpy as np
from trtflow.util.memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for size in [(i + 1) << 20 for i in range(30)] * 2:  # 1 to 30 MB, twice
    np.ones(size // 8)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    faults = {
        how: int(subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, check=True).stdout)
        for how in ("default", "keep")
    }
    assert faults["keep"] * 2 < faults["default"], faults  # 7,667 against 26,581 measured
