"""YAML loading that remembers the line of every key, so errors can say `recipes/x.yaml:12: field: ...`.

PyYAML's composer gives nodes with positions; we build plain Python values from them and a map
from the path of each value (as a tuple of keys/indices, like pydantic's `loc`) to its line.
Duplicate keys are an error (plain PyYAML silently keeps the last one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trtflow.errors import ProjectError

try:  # libyaml's composer is several times faster; the result is identical
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]
import yaml.constructor

Loc = tuple  # a path of keys and indices, e.g. ("profiles", 0, "inputs", "x", "min")


class YamlDocument:
    """A parsed YAML file: its data, and the line number of every value in it."""

    def __init__(self, path: Path, data: Any, lines: dict[Loc, int]):
        self.path = path
        self.data = data
        self.lines = lines

    def line_of(self, loc: Loc) -> int:
        """Line of the deepest known prefix of `loc` (a missing field points at its parent)."""
        for end in range(len(loc), -1, -1):
            line = self.lines.get(tuple(loc[:end]))
            if line is not None:
                return line
        return 1


def load_yaml(path: Path, display: str) -> YamlDocument:
    """Parse `path` into a YamlDocument; malformed YAML raises ProjectError naming file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProjectError(f"{display}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProjectError(f"{display}: cannot read: {exc}") from None
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ProjectError(f"{display}{_yaml_problem(exc)}") from None
    builder = _Builder(display)
    data = {} if node is None else builder.value(node, ())
    return YamlDocument(path, data, builder.lines)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """`:4: invalid YAML: did not find expected ',' or ']' (while parsing a flow sequence opened at line 3)`."""
    mark = getattr(exc, "problem_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and (mark is None or context_mark.line != mark.line):
        problem += f" ({context} opened at line {context_mark.line + 1})"
    return f"{line}: invalid YAML: {problem}"


class _Builder:
    """Turns composed nodes into plain values, recording each value's line under its path."""

    def __init__(self, display: str):
        self.display = display
        self.lines: dict[Loc, int] = {}
        self._scalars = yaml.constructor.SafeConstructor()

    def value(self, node: yaml.Node, loc: Loc) -> Any:
        """The plain value of `node`, recording its line under `loc` (a key's line, set first, wins) and its children's."""
        self.lines.setdefault(loc, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, loc)
        if isinstance(node, yaml.SequenceNode):
            return [self.value(item, loc + (i,)) for i, item in enumerate(node.value)]
        return self._scalar(node)

    def _scalar(self, node: yaml.Node) -> Any:
        """A plain value; tags that would build objects (or fail to build) are errors at their line."""
        try:
            return self._scalars.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError) as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            raise ProjectError(f"{self.display}:{node.start_mark.line + 1}: invalid YAML value: {problem}") from None

    def _mapping(self, node: yaml.MappingNode, loc: Loc) -> dict:
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self._scalar(key_node)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise ProjectError(f"{self.display}:{key_node.start_mark.line + 1}: invalid YAML: a key must be a plain value")
            if key in result:
                line = key_node.start_mark.line + 1
                raise ProjectError(f"{self.display}:{line}: duplicate key {key!r}")
            self.lines[loc + (key,)] = key_node.start_mark.line + 1
            result[key] = self.value(value_node, loc + (key,))
        return result
