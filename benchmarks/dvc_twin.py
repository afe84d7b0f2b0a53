"""A DVC project shaped like a trtflow benchmark project, so both no-ops can be timed side by side.

Each trtflow recipe of benchmarks/noop.py has seven stages: cleanup -> precision -> two builds -> two verifies ->
package. The twin has the same seven DVC stages per recipe, the same dependency edges and the same source model
files; each stage's command concatenates its dependencies into its one output (cheap, and the output changes
whenever an input does), and every output is cached by DVC the way trtflow keeps outputs in its store. The twin
is built by making the outputs directly and `dvc commit` (a first `dvc repro` of 3000 stages takes ~25 min here,
a shell and a lock-file rewrite per stage); the no-op `dvc repro` then finds every stage unchanged. What is
compared is then what each tool does when nothing changed: load the project, hash or stat what it must, decide.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

TARGETS = ("ampere", "ada")
BUILT_MARK = ".twin-built"


def _stage(deps: list[str], out: str) -> dict:
    return {"cmd": f"cat {' '.join(deps)} > {out}", "deps": deps, "outs": [out]}


def recipe_stages(name: str) -> dict[str, dict]:
    """The seven DVC stages of one recipe, by stage name, with trtflow's dependency edges."""
    out = lambda stage: f"out/{stage}"  # noqa: E731
    stages = {
        f"cleanup_{name}": _stage([f"models/{name}.onnx"], out(f"cleanup_{name}")),
        f"precision_{name}": _stage([out(f"cleanup_{name}")], out(f"precision_{name}")),
    }
    for target in TARGETS:
        stages[f"build_{name}_{target}"] = _stage([out(f"precision_{name}")], out(f"build_{name}_{target}"))
        stages[f"verify_{name}_{target}"] = _stage([out(f"build_{name}_{target}")], out(f"verify_{name}_{target}"))
    package_deps = [out(f"{kind}_{name}_{target}") for target in TARGETS for kind in ("build", "verify")]
    stages[f"package_{name}"] = _stage(package_deps, out(f"package_{name}"))
    return stages


def write_twin(root: Path, models: Path, names: list[str]) -> None:
    """A fresh DVC project in `root` (no git) with the source models copied from `models`."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "models").mkdir(parents=True)
    (root / "out").mkdir()
    for name in names:
        shutil.copyfile(models / f"{name}.onnx", root / "models" / f"{name}.onnx")
    stages: dict[str, dict] = {}
    for name in names:
        stages.update(recipe_stages(name))
    (root / "dvc.yaml").write_text(json.dumps({"stages": stages}, indent=1))  # JSON is YAML


def dvc(executable: str, root: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of one `dvc` command in `root` (analytics off, output captured)."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    started = time.perf_counter()
    result = subprocess.run(
        [executable, *args], cwd=root, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    return time.perf_counter() - started, result


def build_twin(executable: str, root: Path) -> float:
    """`dvc init --no-scm`, every stage's output made as its command would, then `dvc commit` (DVC hashes every
    output and writes dvc.lock as after a `dvc repro`, without starting a shell per stage); its wall seconds."""
    for args in (("init", "--no-scm", "-q"), ("config", "core.analytics", "false")):
        _, result = dvc(executable, root, *args)
        if result.returncode != 0:
            raise RuntimeError(f"dvc {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}")
    stages = json.loads((root / "dvc.yaml").read_text())["stages"]
    for stage in stages.values():  # in order: every stage follows the stages it depends on
        (root / stage["outs"][0]).write_bytes(b"".join((root / dep).read_bytes() for dep in stage["deps"]))
    seconds, result = dvc(executable, root, "commit", "--force", "-q")
    if result.returncode != 0:
        raise RuntimeError(f"dvc commit exited {result.returncode}: {result.stderr[-2000:]}")
    (root / BUILT_MARK).touch()
    return seconds


def twin_built(root: Path) -> bool:
    """Whether `root` holds a twin that build_twin finished (a killed build leaves a partial dvc.lock)."""
    return (root / BUILT_MARK).is_file()


def noop_twin(executable: str, root: Path) -> float:
    """One no-op `dvc repro`: must run no stage (its lock file unchanged)."""
    before = (root / "dvc.lock").read_bytes()
    seconds, result = dvc(executable, root, "repro")
    if result.returncode != 0 or "Running stage" in result.stdout:
        raise RuntimeError(
            f"the no-op dvc repro ran stages or failed (exit {result.returncode}): {result.stdout[-1000:]}"
        )
    if (root / "dvc.lock").read_bytes() != before:
        raise RuntimeError("the no-op dvc repro changed dvc.lock")
    return seconds
