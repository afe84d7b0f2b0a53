"""The documentation is true: every command block of README.md and docs/ runs, every full pipeline.yaml or recipe it
shows validates, README's links lead somewhere, the reference pages are what the generator writes, and the mkdocs
site builds without a warning (like Polygraphy's test_examples).

A command block is a fenced block whose info string is bash, sh, shell or console (console: the `$ ` lines). The
blocks of one page run in order, each with `bash -euo pipefail`, in a copy of the example project (pipeline.yaml,
recipes/, models/, trtflow.lock) whose artifacts/ were built once for the whole session; this interpreter's
`trtflow` comes first on PATH and HOME is an empty folder. A block that cannot run in a test (an install from a
package index, a GPU, a cluster) says so on the line right before it: `<!-- not run: <reason> -->`. A block that
must exit with another code than 0 says `<!-- exit: N -->` (or ends its command with `|| test $? -eq N`).

A ```yaml block whose first line is `# pipeline.yaml` or `# recipes/<name>.yaml` is written over that file of a copy
of the example project, and `trtflow validate` must accept the project.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, trtflow

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
# the repository's own example project, and the tools the docs run
EXAMPLE = ["pipeline.yaml", "recipes", "models", "trtflow.lock", "tools"]
COMMAND_LANGUAGES = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
MARKER = re.compile(r"^\s*<!--\s*(?P<what>not run|exit)(?![\w-])\s*(?P<colon>:?)\s*(?P<value>.*?)\s*-->\s*$")
FILE_COMMENT = re.compile(r"^#\s*(?P<path>pipeline\.yaml|recipes/[A-Za-z0-9][A-Za-z0-9._-]*\.yaml)\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    not_run: str | None = None  # the reason, when marked
    exit_code: int = 0

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    def script(self) -> str:
        if self.language != "console":
            return self.text
        return "\n".join(line[2:] for line in self.text.splitlines() if line.startswith("$ "))


def fenced_blocks(page: Path) -> tuple[list[Block], list[str]]:
    """The page's fenced blocks with their markers, and the problems found (a marker without a reason, a marker
    that stands before no command block)."""
    blocks: list[Block] = []
    problems: list[str] = []
    lines = page.read_text().splitlines()
    where = page.relative_to(REPO)
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]):
            body.append(lines[end][indent:] if not lines[end][:indent].strip() else lines[end].lstrip())
            end += 1
        block = Block(page, index + 1, opening["info"].lower(), "\n".join(body) + "\n")
        marker = MARKER.match(lines[index - 1]) if index > 0 else None
        if marker:
            if block.language not in COMMAND_LANGUAGES:
                problems.append(
                    f"{where}:{index}: a marker before a {block.language or 'plain'} block, not a command block"
                )
            elif marker["what"] == "not run":
                if not marker["colon"] or not marker["value"]:
                    problems.append(f"{where}:{index}: `<!-- not run -->` needs a reason: `<!-- not run: <reason> -->`")
                block.not_run = marker["value"] or "(no reason given)"
            elif not marker["value"].isdigit():
                problems.append(f"{where}:{index}: `<!-- exit: N -->` needs a number")
            else:
                block.exit_code = int(marker["value"])
        blocks.append(block)
        index = end + 1
    for number, line in enumerate(lines, 1):  # a marker that is not right before a fence
        if MARKER.match(line) and (number >= len(lines) or not FENCE.match(lines[number])):
            problems.append(f"{where}:{number}: a marker must be the line right before a command block")
    return blocks, problems


def command_blocks(page: Path) -> list[Block]:
    return [block for block in fenced_blocks(page)[0] if block.language in COMMAND_LANGUAGES]


def project_files(page: Path) -> list[tuple[Block, str]]:
    """The page's yaml blocks that are a whole pipeline.yaml or recipe, with the file they are."""
    found = []
    for block in fenced_blocks(page)[0]:
        first = block.text.splitlines()[0] if block.text.strip() else ""
        named = FILE_COMMENT.match(first)
        if block.language in ("yaml", "yml") and named:
            found.append((block, named["path"]))
    return found


def copy_example(destination: Path, state: Path | None = None) -> Path:
    """The example project's files (and, from `state`, its built artifacts/) under `destination`."""
    destination.mkdir(parents=True)
    for name in EXAMPLE:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, destination / name)
    if state is not None:
        # artifacts/ only: .trtflow/ (the remembered no-op) names the files of the project it was written in
        shutil.copytree(state / "artifacts", destination / "artifacts", symlinks=True)
        shutil.copy2(state / "trtflow.lock", destination / "trtflow.lock")
    return destination


def shell_environment(home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    environment = {key: value for key, value in os.environ.items() if not key.startswith("TRTFLOW_")}
    environment.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return environment


@pytest.fixture(scope="session")
def example_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example project, built once: each page's blocks start from a copy of it."""
    root = copy_example(tmp_path_factory.mktemp("docs-example") / "example")
    environment = shell_environment(root.parent / "home")
    result = subprocess.run(
        ["trtflow", "run", "-j", "2"],
        check=False,
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"the example project does not build:\n{result.stderr[-4000:]}"
    return root


def test_markers_are_right_before_a_command_block_and_give_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    problems = [problem for page in PAGES for problem in fenced_blocks(page)[1]]
    assert problems == [], "\n".join(problems)
    blocks = [block for page in PAGES for block in command_blocks(page)]
    skipped = [block for block in blocks if block.not_run]
    assert blocks, "no command block found: is the parser broken?"
    with capsys.disabled():
        print(f"\ndocs: {len(blocks) - len(skipped)} command block(s) run, {len(skipped)} not run:")
        for block in skipped:
            print(f"  {block.where}: {block.not_run}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [page for page in PAGES if any(not block.not_run for block in command_blocks(page))],
    ids=lambda page: str(page.relative_to(REPO)),
)
def test_command_blocks_run(page: Path, example_state: Path, tmp_path: Path) -> None:
    project = copy_example(tmp_path / "project", state=example_state)
    environment = shell_environment(tmp_path / "home")
    for block in command_blocks(page):
        if block.not_run:
            continue
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.script()],
            check=False,
            cwd=project,
            env=environment,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == block.exit_code, (
            f"{block.where}: the block exited {result.returncode} (expected {block.exit_code}):\n{block.text}\n"
            f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
        )


@pytest.mark.parametrize(
    "page", [page for page in PAGES if project_files(page)], ids=lambda page: str(page.relative_to(REPO))
)
def test_project_files_shown_validate(page: Path, tmp_path: Path) -> None:
    for number, (block, path) in enumerate(project_files(page)):
        project = copy_example(tmp_path / f"project{number}")
        (project / path).write_text(block.text)
        result = trtflow(project, "validate")
        assert result.code == 0, f"{block.where}: {path} does not validate in the example project:\n{result.err}"


def test_readme_links_lead_to_files() -> None:
    for document in (REPO / "README.md", REPO / "CONTRIBUTING.md"):
        targets = [match["target"] for match in LINK.finditer(document.read_text())]
        assert targets or document.name != "README.md"
        local = [
            target.split("#")[0]
            for target in targets
            if not re.match(r"^[a-z]+:", target) and not target.startswith("#")
        ]
        missing = [target for target in local if not (document.parent / target).exists()]
        assert missing == [], f"{document.name} links to files that do not exist: {missing}"


def test_the_reference_pages_are_generated() -> None:
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    for path, text in generator.pages().items():
        assert path.exists() and path.read_text() == text, (
            f"{path.relative_to(REPO)} differs from the schema `trtflow schema` prints: "
            "regenerate it with `python docs/gen_reference.py`"
        )


def test_exit_codes_page_has_the_markers() -> None:
    page = (DOCS / "reference" / "exit-codes.md").read_text()
    assert page.index("<!-- exit-codes:begin -->") < page.index("<!-- exit-codes:end -->")


def test_docs_site_builds(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        check=False,
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert result.returncode == 0 and warnings == [], f"mkdocs build --strict:\n{output[-4000:]}"
