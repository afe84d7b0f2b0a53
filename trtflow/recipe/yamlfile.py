"""YAML loading that remembers the line of every key, so errors can say `recipes/x.yaml:12: field: ...`.

PyYAML's composer gives nodes with positions; we build plain Python values from them and a map
from the path of each value (as a tuple of keys/indices, like pydantic's `loc`) to its line.
Duplicate keys are an error (plain PyYAML silently keeps the last one).
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml
import yaml.constructor

from trtflow.errors import ProjectError
from trtflow.util.reads import note_path

# libyaml's composer is several times faster; the result is identical (PyYAML may be built without it)
_Loader = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader

MERGE_TAG = "tag:yaml.org,2002:merge"
PLAIN_COLLECTION_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")
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


# Bounds for files a project (or an attacker) hands us: a recipe is a few kB; an alias bomb or deep nesting is not.
MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 100_000  # after aliases are expanded: `a: &x [...]; b: [*x, *x, ...]` grows exponentially


def load_yaml(path: Path, display: str) -> YamlDocument:
    """Parse `path` into a YamlDocument; malformed, oversized or hostile YAML raises ProjectError naming file and
    line."""
    text = _read_text(path, display)
    note_path(path)
    _check_flow_depth(text, display)
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.reader.ReaderError as exc:  # a control character: name its line (the reader counts characters only)
        line = text[: exc.position].count("\n") + 1
        raise ProjectError(
            f"{display}:{line}: invalid YAML: character {_shown(exc.character)} is not allowed in a YAML file"
        ) from exc
    except yaml.YAMLError as exc:
        raise ProjectError(f"{display}{_yaml_problem(exc)}") from exc
    except RecursionError:
        raise ProjectError(f"{display}: nesting deeper than the YAML parser can follow") from None
    builder = _Builder(display)
    data = {} if node is None else builder.value(node, ())
    return YamlDocument(path, data, builder.lines)


def _read_text(path: Path, display: str) -> str:
    """The file's text, if it is a regular file of at most MAX_BYTES of UTF-8 without NUL bytes (a FIFO would hang)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ProjectError(f"{display}: file not found") from None
    except OSError as exc:
        raise ProjectError(f"{display}: cannot read: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise ProjectError(f"{display}: not a regular file (a YAML file is expected here)")
    if info.st_size > MAX_BYTES:
        raise ProjectError(f"{display}: {info.st_size} bytes; a YAML file of trtflow's is at most {MAX_BYTES} bytes")
    try:
        data = path.read_bytes()[: MAX_BYTES + 1]
    except OSError as exc:
        raise ProjectError(f"{display}: cannot read: {exc.strerror or exc}") from exc
    if b"\x00" in data:
        line = data[: data.index(b"\x00")].count(b"\n") + 1
        raise ProjectError(f"{display}:{line}: a NUL byte: this is not a text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ProjectError(
            f"{display}:{line}: not UTF-8 (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        ) from exc


def _check_flow_depth(text: str, display: str) -> None:
    """Refuse `[[[[...` or `{{{{...` nested deeper than MAX_DEPTH before the parser recurses into it."""
    depth = 0
    for index, char in enumerate(text):
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise ProjectError(
                    f"{display}:{text.count(chr(10), 0, index) + 1}: nested deeper than {MAX_DEPTH} levels"
                )
        elif char in "]}" and depth:
            depth -= 1


def _shown(character: Any) -> str:
    """0x01 for a control character (the reader gives its code or the character itself)."""
    code = (
        character
        if isinstance(character, int)
        else ord(character)
        if isinstance(character, str) and len(character) == 1
        else None
    )
    return f"{code:#04x}" if code is not None else repr(character)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """`:4: invalid YAML: did not find expected ',' or ']' (while parsing a flow sequence opened at line 3)`."""
    mark = getattr(exc, "problem_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
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
        self._values = 0

    def value(self, node: yaml.Node, loc: Loc) -> Any:
        """The plain value of `node`, recording its line under `loc` (a key's line, set first, wins) and its
        children's."""
        self._values += 1
        if self._values > MAX_VALUES or len(loc) > MAX_DEPTH:
            what = (
                f"more than {MAX_VALUES} values (aliases expand)"
                if self._values > MAX_VALUES
                else f"nested deeper than {MAX_DEPTH} levels"
            )
            raise ProjectError(f"{self.display}:{node.start_mark.line + 1}: {what}")
        self.lines.setdefault(loc, node.start_mark.line + 1)
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and node.tag not in PLAIN_COLLECTION_TAGS:
            raise ProjectError(
                f"{self.display}:{node.start_mark.line + 1}: invalid YAML: tag {node.tag} is not supported "
                "(trtflow reads plain mappings, lists and scalars)"
            )
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
            raise ProjectError(f"{self.display}:{node.start_mark.line + 1}: invalid YAML value: {problem}") from exc

    def _merged(self, node: yaml.Node, loc: Loc) -> dict:
        """The mapping(s) a merge key names; anything else is an error at its line."""
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        maps = [item for item in items if isinstance(item, yaml.MappingNode)]
        if len(maps) != len(items):
            raise ProjectError(
                f"{self.display}:{node.start_mark.line + 1}: `<<` merges a mapping (or a list of them) into this one"
            )
        merged: dict = {}
        for item in maps:
            merged = {**self._mapping(item, loc), **merged}  # earlier mappings in the list win, as YAML says
        return merged

    def _mapping(self, node: yaml.MappingNode, loc: Loc) -> dict:
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:  # `<<: *base`: the anchored mapping's keys, unless given here too
                merged = {k: v for k, v in self._merged(value_node, loc).items() if k not in result}
                result.update(merged)
                continue
            key = self._scalar(key_node)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise ProjectError(
                    f"{self.display}:{key_node.start_mark.line + 1}: invalid YAML: a key must be a plain value"
                )
            if key in result:
                line = key_node.start_mark.line + 1
                raise ProjectError(f"{self.display}:{line}: duplicate key {key!r}")
            self.lines[loc + (key,)] = key_node.start_mark.line + 1
            result[key] = self.value(value_node, loc + (key,))
        return result
