"""The module map of trtflow and the three measures of its structure: import cycles, imports from a lower layer to a
higher one, and modules over 400 lines.

    python tools/architecture.py [PACKAGE_DIR] [--map]

Every import counts: at module level, inside functions and under TYPE_CHECKING (a lazy import hides a dependency, it
does not remove it). Exits 1 when a measure is not zero; tests/project/test_layers.py runs the same checks.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_LINES = 400
# Lowest first. A module may import its own layer and the layers below it, never one above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "hashing", "util", "signing"),
    ("recipe", "manifest", "states", "store", "backends", "device"),
    ("stages", "calibration", "modelcheck", "taskdata", "provenance", "toolchain"),
    ("executors", "run"),
    ("deploy", "report", "inspection"),
    ("services",),
    ("cli", "__main__"),
)


def module_name(package: Path, path: Path) -> str:
    """trtflow/store/locks.py -> trtflow.store.locks; a package's __init__ is the package."""
    return ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__")


def modules(package: Path) -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {module_name(package, p): p for p in sorted(package.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules a file imports, anywhere in it (`from a.b import c` is a.b.c when c is a module)."""
    root = next(iter(known)).split(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == root:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == root)
    return {m for m in found if m in known}


def graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules it imports (itself and its own package's __init__ excluded)."""
    known = modules(package)
    return {m: {i for i in imports(p, known) if i != m and not m.startswith(i + ".")} for m, p in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def layer(module: str) -> int:
    """The layer of a module from its top-level name under the package (the package's own __init__ is the top)."""
    top = module.split(".")[1] if "." in module else ""
    for level, names in enumerate(LAYERS):
        if top in names:
            return level
    return len(LAYERS) if top == "" else -1


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a module to one in a higher layer."""
    return sorted((m, i) for m, targets in edges.items() for i in targets if layer(i) > layer(m))


def unlayered(edges: dict[str, set[str]]) -> list[str]:
    """Modules whose top-level name no layer lists."""
    return sorted(m for m in edges if layer(m) < 0)


def long_modules(package: Path) -> list[tuple[str, int]]:
    """Modules over MAX_LINES lines, longest first."""
    counts = [(m, len(p.read_text().splitlines())) for m, p in modules(package).items()]
    return sorted(((m, n) for m, n in counts if n > MAX_LINES), key=lambda item: (-item[1], item[0]))


def module_map(package: Path) -> Iterator[str]:
    """One line per top-level part: its layer, modules, lines, and the parts it imports."""
    edges = graph(package)
    known = modules(package)
    parts: dict[str, list[str]] = {}
    for m in known:
        parts.setdefault(m.split(".")[1] if "." in m else "(package)", []).append(m)
    for part, members in sorted(parts.items(), key=lambda item: (layer(item[1][0]), item[0])):
        lines = sum(len(known[m].read_text().splitlines()) for m in members)
        uses = sorted({i.split(".")[1] for m in members for i in edges[m] if "." in i} - {part})
        yield f"L{layer(members[0])} {part:<12} {len(members):3} modules {lines:6} lines  -> {', '.join(uses) or '-'}"


def main(argv: list[str] | None = None) -> int:
    """Print the measures (and the module map with --map); exit 1 unless all are zero."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", nargs="?", type=Path, help="the package folder (default: trtflow's, as imported)")
    parser.add_argument("--map", action="store_true", help="print the module map too")
    args = parser.parse_args(argv)
    if args.package is None:
        import trtflow

        args.package = Path(trtflow.__file__).resolve().parent
    edges = graph(args.package)
    found = {
        "import cycles": cycles(edges),
        "upward imports": upward(edges),
        "modules without a layer": unlayered(edges),
    }
    found["modules over 400 lines"] = long_modules(args.package)
    print(f"{len(edges)} modules, {sum(len(v) for v in edges.values())} imports between them")
    for name, items in found.items():
        print(f"{name}: {len(items)}")
        for item in items:
            print(
                "  "
                + (
                    item
                    if isinstance(item, str)
                    else (" <-> " if name == "import cycles" else " -> ").join(map(str, item))
                )
            )
    if args.map:
        print("\n".join(module_map(args.package)))
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
