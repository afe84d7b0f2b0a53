"""The GitHub Actions workflow: actionlint-clean (where actionlint is installed) and shaped as documented."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "trtflow.yml"


def test_actionlint_is_clean():
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not on PATH (the structure test still runs)")
    proc = subprocess.run([actionlint, "-no-color", str(WORKFLOW)], capture_output=True, text=True)
    assert proc.returncode == 0, f"actionlint exit {proc.returncode}:\n{proc.stdout}{proc.stderr}"


def step_index(steps, predicate, what):
    """Index of the one step matching predicate; fails naming `what` if there is none or several."""
    found = [i for i, step in enumerate(steps) if predicate(step)]
    assert len(found) == 1, f"expected exactly one step that {what}, found {len(found)}"
    return found[0]


def check_structure(wf):
    # PyYAML (YAML 1.1) reads the key `on` as the boolean True
    triggers = wf.get("on", wf.get(True)) or {}
    assert {"push", "pull_request", "workflow_dispatch"} <= set(triggers), f"triggers: {triggers}"

    jobs = wf.get("jobs", {})
    assert {"build", "tests"} <= set(jobs), f"jobs: {sorted(jobs)}"

    steps = jobs["build"]["steps"]
    cache = step_index(steps, lambda s: s.get("uses", "").startswith("actions/cache@"), "uses actions/cache")
    run = step_index(steps, lambda s: "trtflow run --frozen" in s.get("run", ""), "runs `trtflow run --frozen`")
    upload = step_index(
        steps,
        lambda s: (
            s.get("uses", "").startswith("actions/upload-artifact@")
            and "packages" in str(s.get("with", {}).get("path", ""))
        ),
        "uploads the packages with actions/upload-artifact",
    )
    assert cache < run < upload, "the store must be restored before the build, packages uploaded after it"

    cache_with = steps[cache].get("with", {})
    assert "hashFiles('trtflow.lock')" in cache_with.get("key", ""), f"cache key: {cache_with.get('key')}"
    assert cache_with.get("path") == "artifacts/store", f"cache path: {cache_with.get('path')}"

    upload_path = steps[upload].get("with", {}).get("path", "")
    assert upload_path.startswith("artifacts/packages/"), f"upload path: {upload_path}"

    summary = step_index(
        steps,
        lambda s: "trtflow report --format md" in s.get("run", "") and "GITHUB_STEP_SUMMARY" in s.get("run", ""),
        "puts `trtflow report --format md` on the job summary",
    )
    report = step_index(
        steps, lambda s: "artifacts/report.html" in str(s.get("with", {}).get("path", "")), "uploads report.html"
    )
    assert run < summary and run < report, "the report is drawn after the build"

    assert any("bash .ci/run" in s.get("run", "") for s in jobs["tests"]["steps"]), "tests job must run .ci/run"


def test_workflow_structure():
    check_structure(yaml.safe_load(WORKFLOW.read_text()))
