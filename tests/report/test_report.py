"""The run report: written by real runs, opened in headless Chromium (DevTools protocol), and its Markdown summary.

Screenshots go to $TRTFLOW_TEST_ARTIFACTS (CI uploads that folder) or the test's tmp folder."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from browser import Browser, chromium_or_skip
from conftest import REPO, TINY_RECIPE, trtflow, trtflow_process, write_project

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IMPOSSIBLE_FP16 = (
    TINY_RECIPE.replace("precisions: [fp32]", "precisions: [fp32, fp16]") + "accuracy: {fp16: {max_abs_error: 0.0}}\n"
)
GITHUB_SUMMARY_LIMIT = 1024 * 1024  # bytes GitHub keeps of one step's $GITHUB_STEP_SUMMARY


def _artifact(tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ.get("TRTFLOW_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module's tests."""
    opened = Browser(chromium_or_skip())
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's example project (2 models, fp32 + fp16, 2 targets), run once at -j 2 as a user runs it."""
    root = tmp_path_factory.mktemp("example") / "example"
    root.mkdir()
    for name in ("pipeline.yaml", "recipes", "models"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, root / name)
    result = trtflow_process(root, "run", "-j", "2")
    assert result.returncode == 0, result.stderr
    assert "report: " in result.stderr
    return root


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose fp16 pair fails its accuracy limit, run twice: the second run (a recipe added) finds that
    failure recorded, so its report holds built, cached, failed (cached) and skipped stages."""
    root = write_project(tmp_path_factory.mktemp("failing") / "proj", {"tiny": IMPOSSIBLE_FP16})
    first = trtflow(root, "run", "--no-report")
    assert first.code == 1 and not (root / "artifacts" / "run.json").exists()
    (root / "recipes" / "other.yaml").write_text(
        TINY_RECIPE.replace("targets: [rtx-ampere, rtx-ada]", "targets: [rtx-ada]")
    )
    assert trtflow(root, "run").code == 1
    return root


def _record(root: Path) -> dict:
    return json.loads((root / "artifacts" / "run.json").read_text())


def _count(browser: Browser, selector: str) -> int:
    return browser.evaluate(f"document.querySelectorAll({json.dumps(selector)}).length")


def _open_and_check(browser: Browser, page: Path) -> float:
    """Open the report: no request beyond the file, no console error, every section drawn; the seconds it took."""
    load = browser.open(page)
    assert load.requests == [] and load.errors == []
    for section in ("summary", "dag", "timeline", "accuracy", "engines", "fleet"):
        assert _count(browser, f"section#{section}") == 1, section
    assert browser.evaluate("document.querySelector('#dag svg').getBoundingClientRect().height") > 50
    return load.seconds


@pytest.mark.slow
def test_the_example_report_renders_in_chromium(example: Path, browser: Browser, tmp_path: Path) -> None:
    record = _record(example)
    seconds = _open_and_check(browser, example / "artifacts" / "report.html")
    assert _count(browser, "#dag .node") == len(record["nodes"]) == 19
    assert _count(browser, "#dag .node.built") == 19
    assert _count(browser, "#dag .edges path") == sum(len(n["deps"]) for n in record["nodes"]) > 19
    assert _count(browser, "#timeline .bar") == 19 and _count(browser, "#timeline .bar.critical") >= 4
    assert _count(browser, "#accuracy .acc.pass") == 2  # tiny_cnn fp16: 1 - cosine and max abs error
    assert _count(browser, "#accuracy .limit") == 1  # fp16's default min_cosine (max abs error has no limit)
    assert _count(browser, "#engines tbody tr") == 6 and _count(browser, "#fleet tbody tr") == 4
    assert {n["slot"] for n in record["nodes"]} == {0, 1}  # -j 2: both job slots used
    assert all(n["peak_rss"] > 10 << 20 for n in record["nodes"])
    browser.screenshot(_artifact(tmp_path, "report-example.png"))
    assert seconds < 2.0


@pytest.mark.slow
def test_the_report_of_a_failed_pair_colours_each_status(failing: Path, browser: Browser, tmp_path: Path) -> None:
    record = _record(failing)
    statuses = {n["id"]: (n["status"], n["failure_cached"]) for n in record["nodes"]}
    assert statuses["precision:tiny/fp16"] == ("failed", True) and statuses["build:tiny/fp16/rtx-ada"][0] == "skipped"
    _open_and_check(browser, failing / "artifacts" / "report.html")
    assert _count(browser, "#dag .node.failed-cached") == 1
    assert _count(browser, "#dag .node.skipped") == 4  # fp16 builds and verifies; the package keeps the fp32 engines
    assert _count(browser, "#dag .node.cached") > 0 and _count(browser, "#dag .node.built") > 0
    assert "fp16 accuracy out of tolerance" in browser.evaluate("document.querySelector('#accuracy').innerText")
    assert record["fleet"][0]["recipes"]["tiny"]["chosen"].endswith("tiny-fp32.engine")
    browser.screenshot(_artifact(tmp_path, "report-failed-pair.png"))


def test_a_report_of_1000_stages_opens_in_under_2_seconds(tmp_path: Path, browser: Browser) -> None:
    source = tmp_path / "run.json"
    source.write_text(json.dumps(synthetic_record(50)))
    result = trtflow(tmp_path, "report", "--from", str(source), "--out", str(tmp_path / "big.html"))
    assert result.code == 0, result.err
    seconds = min(_open_and_check(browser, tmp_path / "big.html") for _ in range(2))
    assert _count(browser, "#dag .node") == 1000
    assert seconds < 2.0, f"{seconds:.2f} s"


def test_the_markdown_summary_matches_its_fixture(tmp_path: Path) -> None:
    source = tmp_path / "run.json"
    source.write_text(json.dumps(synthetic_record(4)))
    result = trtflow(tmp_path, "report", "--from", str(source), "--format", "md")
    assert result.code == 0, result.err
    assert result.out == (FIXTURES / "report_summary.md").read_text()


def test_the_markdown_summary_of_1000_stages_fits_a_job_summary(tmp_path: Path) -> None:
    source = tmp_path / "run.json"
    source.write_text(json.dumps(synthetic_record(50)))
    summary = trtflow(tmp_path, "report", "--from", str(source), "--format", "md").out
    assert len(summary.encode()) < GITHUB_SUMMARY_LIMIT / 50  # a few KiB: every list is capped
    assert "... and 355 more engines" in summary


def test_report_without_a_run_says_what_to_do(project: Path) -> None:
    result = trtflow(project, "report")
    assert result.code == 3 and "no run record: run `trtflow run` first" in result.err


def test_the_eta_comes_from_earlier_runs_of_the_same_stage_kinds() -> None:
    from trtflow.cli.progress import Eta
    from trtflow.run.runmemo import RememberedNode
    from trtflow.states import BUILT, FAILED, NodeState

    eta = Eta(jobs=2)
    eta.plan({"build:a/fp32/t": 4.0, "build:b/fp32/t": None, "verify:a/fp32/t": 1.0})
    assert eta.line() == "0/3 done, 0 failed, ETA 0:04"  # (4 + 4 (a build's mean) + 1) / 2 slots
    eta.finished(NodeState(RememberedNode("build:a/fp32/t", "build", "a"), BUILT))
    eta.finished(NodeState(RememberedNode("verify:a/fp32/t", "verify", "a"), FAILED))
    assert eta.line() == "2/3 done, 1 failed, ETA 0:04"


def synthetic_record(recipes: int) -> dict:
    """A run record shaped as `trtflow run` writes it: per recipe cleanup, fp32 + fp16, 4 targets (20 stages), -j 2."""
    targets = {f"gpu{i}": [cc] for i, cc in enumerate(("sm_75", "sm_86", "sm_89", "sm_120"))}
    nodes, packages, accuracy, clock = [], {}, [], [0.0, 0.0]
    for r in range(recipes):
        name = f"model{r:03d}"
        failed = r % 10 == 3  # its fp16 fails its accuracy limit (recorded before)
        nodes += _recipe_nodes(name, targets, failed, r % 4 == 0, clock)
        packages[name] = _manifest(name, targets, failed)
        accuracy.append(_accuracy_row(name, failed))
    fleet = [
        {
            "compute_capability": ccs[0],
            "targets": [t],
            "recipes": {
                name: {
                    "chosen": f"engines/{t}/{name}-fp16.engine",
                    "precision": "fp16",
                    "target": t,
                    "reason": "exact compute capability match",
                    "refused": [
                        {"file": f"engines/{t}/{name}-fp32.engine", "why": "fits, but fp16 is preferred to fp32"}
                    ],
                    "failed": [],
                }
                for name in sorted(packages)
            },
        }
        for t, ccs in targets.items()
    ]
    return {
        "format": 1,
        "trtflow_version": "0.1.0",
        "project": "fleet",
        "finished_at": "2026-11-25T12:00:00+00:00",
        "seconds": round(max(clock), 3),
        "jobs": 2,
        "nodes": nodes,
        "packages": packages,
        "targets": targets,
        "fleet": fleet,
        "accuracy": accuracy,
    }


def _recipe_nodes(name: str, targets: dict, failed: bool, cached: bool, clock: list[float]) -> list[dict]:
    def node(
        kind: str,
        rest: str,
        deps: list[str],
        status: str = "cached" if cached else "built",
        seconds: float = 0.5,
        **extra,
    ) -> dict:
        slot = clock.index(min(clock))
        ran = status == "built" or (status == "failed" and not extra.get("failure_cached"))
        start = clock[slot] if ran else None
        if ran:
            clock[slot] += seconds
        return {
            "id": f"{kind}:{rest}",
            "kind": kind,
            "recipe": name,
            "deps": deps,
            "target": None,
            "status": status,
            "failure_cached": extra.get("failure_cached", False),
            "reason": extra.get("reason", "" if status == "cached" else "new"),
            "changes": [],
            "seconds": seconds if ran else None,
            "recorded_seconds": seconds,
            "start": start,
            "end": None if start is None else round(start + seconds, 3),
            "slot": slot if ran else None,
            "peak_rss": 200 << 20 if ran else None,
        }

    found = [node("cleanup", name, [], seconds=1.2)]
    for precision in ("fp32", "fp16"):
        bad = failed and precision == "fp16"
        found.append(
            node(
                "precision",
                f"{name}/{precision}",
                [f"cleanup:{name}"],
                **(
                    {
                        "status": "failed",
                        "failure_cached": True,
                        "reason": "fp16 out of the recipe's accuracy limits: max_abs_error 0.00047 > 0",
                    }
                    if bad
                    else {}
                ),
            )
        )
        for target in targets:
            extra = {"status": "skipped", "reason": f"upstream precision:{name}/fp16 failed"} if bad else {}
            found.append(
                node("build", f"{name}/{precision}/{target}", [f"precision:{name}/{precision}"], seconds=1.0, **extra)
            )
            found.append(
                node(
                    "verify",
                    f"{name}/{precision}/{target}",
                    [f"build:{name}/{precision}/{target}"],
                    seconds=0.1,
                    **extra,
                )
            )
    found.append(node("package", name, sorted(n["id"] for n in found if n["kind"] == "verify"), seconds=0.2))
    return found


def _manifest(name: str, targets: dict, failed: bool) -> dict:
    engines = [
        {
            "file": f"engines/{t}/{name}-{p}.engine",
            "precision": p,
            "target": t,
            "compute_capabilities": ccs,
            "size": 900 * 1024,
            "backend": "tensorrt-rtx",
            "backend_version": "1.7.1.116",
            "hardware_compatibility": "none",
            "version_compatible": False,
            "verification": {"engine_run": {"status": "not run (no GPU: nvidia-smi not found)"}},
        }
        for p in ("fp32", "fp16")
        for t, ccs in targets.items()
        if not (failed and p == "fp16")
    ]
    missing = (
        [
            {
                "precision": "fp16",
                "target": t,
                "stage": f"precision:{name}/fp16",
                "reason": "out of limits",
                "compute_capabilities": ccs,
            }
            for t, ccs in targets.items()
        ]
        if failed
        else []
    )
    return {"recipe": name, "engines": engines, "missing": missing}


def _accuracy_row(name: str, failed: bool) -> dict:
    if failed:
        return {
            "recipe": name,
            "precision": "fp16",
            "passed": False,
            "failure": "fp16 out of the recipe's accuracy limits: max_abs_error 0.00047 > 0",
        }
    output = {
        "name": "logits",
        "cosine_similarity": 0.99999987,
        "max_abs_error": 0.00046870112,
        "top1_agreement": 1.0,
        "passed": True,
    }
    return {
        "recipe": name,
        "precision": "fp16",
        "passed": True,
        "composition": {
            "nodes_by_dtype": {"float16": 10, "float32": 1},
            "initializer_bytes_by_dtype": {"float16": 460000, "float32": 40},
            "qdq_covered_ops": {},
        },
        "accuracy": {"outputs": [output], "tolerance": {"min_cosine": 0.9999, "min_top1": 0.99, "max_abs_error": None}},
    }


HOSTILE_TEXTS = (
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    "![x](https://evil.example/t.png)",
    "a | forged | row\n| b | c |",
    "\x1b]0;pwned\x07 &lt;entity&gt; `code`",
)


def test_the_markdown_summary_renders_what_a_record_says_as_text(tmp_path: Path) -> None:
    """Every string of a record (a model's output name in a failure reason, the project folder's name, recipes,
    targets, provision's choices) reaches a CommonMark renderer as text: no element, link, image or extra row."""
    from markdown_it import MarkdownIt

    record = synthetic_record(4)
    hostile = " ".join(HOSTILE_TEXTS)
    record["project"] = hostile
    for node in record["nodes"]:
        node["reason"] = hostile
    for gpu in record["fleet"]:
        for choice in gpu["recipes"].values():
            choice.update(chosen=hostile, reason=hostile)
    source = tmp_path / "run.json"
    source.write_text(json.dumps(record))
    result = trtflow(tmp_path, "report", "--from", str(source), "--format", "md")
    assert result.code == 0, result.err
    html = MarkdownIt("commonmark").enable("table").render(result.out)
    for element in ("<script", "<img", "<a "):
        assert element not in html
    assert set(re.findall(r"<code>(.*?)</code>", html)) == {"trtflow provision", "report.html"}  # the summary's own
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "\x1b" not in result.out
    for table in html.split("<table>")[1:]:  # a pipe or a newline in a field forges no cell and no row
        head = len(re.findall(r"<th[ >]", table.split("</thead>")[0]))
        body = table.split("<tbody>")[1].split("</tbody>")[0]
        assert {len(re.findall(r"<td[ >]", row)) for row in body.split("</tr>")[:-1]} == {head}
    assert html.count("<tr>") == len([line for line in result.out.splitlines() if line.startswith("| ")])


WRONG_VALUES = ("x", 7, 1.5, None, [], {}, True)


def _leaves(value: object, path: tuple = ()) -> list[tuple]:
    """The path of every value in a JSON document."""
    found = [path] if path else []
    if isinstance(value, dict):
        found += [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    elif isinstance(value, list):
        found += [p for i, v in enumerate(value[:2]) for p in _leaves(v, (*path, i))]
    return found


def test_a_record_of_any_other_shape_is_refused_or_drawn_never_a_crash(tmp_path: Path) -> None:
    """`report --from` reads any file: every field of a record set to each wrong type is either refused in one line
    (the shape check) or drawn by both renderers; none raises."""
    from trtflow.report import html, markdown
    from trtflow.report.shape import first_problem

    base = synthetic_record(4)
    refused = drawn = 0
    for path in _leaves(base):
        for wrong in WRONG_VALUES:
            record = json.loads(json.dumps(base))
            parent = record
            for part in path[:-1]:
                parent = parent[part]
            parent[path[-1]] = wrong
            if first_problem(record) is not None:
                refused += 1
                continue
            markdown.render(record), html.render(record)
            drawn += 1
    assert refused > 1000 and drawn > 100, (refused, drawn)


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("jobs", "2", "jobs: Input should be a valid integer"),
        ("nodes", "all of them", "not a run record"),
        ("packages", [], "packages: Input should be a valid dictionary"),
        ("fleet", [{"compute_capability": "sm_89", "recipes": "x"}], "fleet.0.recipes"),
    ],
)
def test_report_from_refuses_a_record_of_another_shape_in_one_line(
    tmp_path: Path, field: str, value: object, said: str
) -> None:
    source = tmp_path / "run.json"
    source.write_text(json.dumps({**synthetic_record(1), field: value}))
    for fmt in ("md", "html"):
        result = trtflow(tmp_path, "report", "--from", str(source), "--format", fmt)
        assert result.code == 3 and result.err.count("error: ") == 1 and said in result.err, result.err


def test_the_report_says_engines_were_not_executed_and_what_an_int8_model_covers() -> None:
    """An int8 model keeps its weights in float with Q/DQ around them: its row says the share int8 covers first
    (before: a bare "float16 100%" bar), and the summary says the engines were checked, not executed."""
    from trtflow.report import html

    record = synthetic_record(1)
    row = _accuracy_row("model000", failed=False)
    row.update(precision="int8")
    row["composition"].update(mac_share=0.97, weight_share=0.984, initializer_bytes_by_dtype={"float16": 460000})
    row["fallback"] = {"kept": [{"name": "/fc1/Gemm", "op": "Gemm", "sensitivity": 0.887}]}
    record["accuracy"] = [row]
    page = html.render(record)
    assert (
        "int8: 97% of MACs, 98% of weights; kept higher by fallback: auto: /fc1/Gemm (Gemm, sensitivity 0.887)"
        "<br>stored as: <svg" in page
    )
    assert "<b>8</b>of 8 engines not executed: not run (no GPU: nvidia-smi not found)" in page
