"""Write the reference pages from the JSON Schemas `trtflow schema` prints.

    python docs/gen_reference.py          # rewrites docs/reference/recipe.md, pipeline.md and exit-codes.md
    python docs/gen_reference.py --check  # exit 1 naming each page that differs from what it would write

One table per object of the schema (the recipe or pipeline.yaml itself, then every object it refers to, by name):
field, type, default, and a description made of the field's own description and its constraints. The schemas come
from the trtflow this interpreter imports (the functions `trtflow schema` prints), so a changed recipe model changes
the page; tests/project/test_docs.py fails until the pages are regenerated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REFERENCE = Path(__file__).resolve().parent / "reference"

PAGES = {
    "recipe": (
        "Recipe reference",
        (
            "A recipe is one YAML file that a glob of `pipeline.yaml`'s `recipes:` matches; see "
            "[Project files](../project.md). Unknown keys are errors."
        ),
    ),
    "pipeline": (
        "pipeline.yaml reference",
        (
            "The project file: where outputs go, the GPU targets of the fleet, which recipe files belong to it; see "
            "[Project files](../project.md). Unknown keys are errors."
        ),
    ),
}


def schema(what: str) -> dict[str, Any]:
    """The JSON Schema `trtflow schema WHAT` prints, from the trtflow this interpreter imports."""
    from trtflow.recipe.schema import Pipeline, recipe_json_schema

    found: dict[str, Any] = recipe_json_schema() if what == "recipe" else Pipeline.model_json_schema()
    return found


def anchor(name: str) -> str:
    """The anchor mkdocs' toc gives the heading `## name`."""
    return name.lower()


def type_of(prop: dict[str, Any]) -> str:
    """A short type: `integer`, `list of string`, `Profile` (linked), `string or null`, `fp16 | fp32`."""
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{anchor(name)})"
    if "anyOf" in prop:
        return " or ".join(type_of(option) for option in prop["anyOf"])
    if "enum" in prop:
        return " \\| ".join(f"`{json.dumps(value)}`" for value in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    kind = prop.get("type", "any")
    if kind == "array":
        items = prop.get("items")
        if isinstance(items, dict):
            return f"list of {type_of(items)}"
        if "prefixItems" in prop:
            return "[" + ", ".join(type_of(item) for item in prop["prefixItems"]) + "]"
        return "list"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"map of {type_of(prop['additionalProperties'])}"
    return kind if isinstance(kind, str) else " or ".join(kind)


def constraints(prop: dict[str, Any]) -> list[str]:
    """The constraints of a field (and of each of its alternatives) as short phrases."""
    found: list[str] = []
    for option in [prop, *prop.get("anyOf", [])]:
        for key, phrase in (
            ("minimum", ">= {}"),
            ("exclusiveMinimum", "> {}"),
            ("maximum", "<= {}"),
            ("exclusiveMaximum", "< {}"),
            ("minLength", "at least {} character(s)"),
            ("maxLength", "at most {} character(s)"),
            ("minItems", "at least {} item(s)"),
            ("maxItems", "at most {} item(s)"),
            ("minProperties", "at least {} entry(ies)"),
        ):
            if key in option:
                found.append(phrase.format(option[key]))
        if "pattern" in option:
            found.append(f"matches `{option['pattern']}`")
        if isinstance(option.get("propertyNames"), dict) and "enum" in option["propertyNames"]:
            found.append("keys: " + ", ".join(f"`{key}`" for key in option["propertyNames"]["enum"]))
    return found


def default_of(prop: dict[str, Any], required: bool) -> str:
    """The default column: `required`, the JSON default, or nothing (a computed default)."""
    if required:
        return "required"
    if "default" not in prop:
        return ""
    return f"`{json.dumps(prop['default'])}`"


def cell(text: str) -> str:
    """Table-safe text: one line, pipes escaped (except those already escaped)."""
    return " ".join(text.split()).replace("|", "\\|").replace("\\\\|", "\\|")


def table(obj: dict[str, Any]) -> list[str]:
    """One object's fields as Markdown table rows."""
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    required = set(obj.get("required", []))
    for field, prop in obj.get("properties", {}).items():
        words = [prop["description"]] if prop.get("description") else []
        words += constraints(prop)
        rows.append(
            f"| `{field}` | {type_of(prop)} | {default_of(prop, field in required)} | {cell('; '.join(words))} |"
        )
    return rows


def page(what: str) -> str:
    """The Markdown page of one schema."""
    title, intro = PAGES[what]
    root = schema(what)
    lines = [
        f"# {title}",
        "",
        "<!-- Generated by docs/gen_reference.py from `trtflow schema "
        + what
        + "`: do not edit; run `python docs/gen_reference.py`. -->",
        "",
        intro,
        "",
        (
            f"Print the schema for an editor: `trtflow schema {what}`. A field with no default shown is optional "
            "with a computed default (an empty list, the recipe's file name, a block's own defaults) unless it says "
            "required."
        ),
        "",
        f"## {root.get('title', what)}",
        "",
    ]
    if root.get("description"):
        lines += [root["description"].strip(), ""]
    lines += table(root)
    for name, obj in sorted(root.get("$defs", {}).items()):
        lines += ["", f"## {name}", ""]
        if obj.get("description"):
            lines += [obj["description"].strip(), ""]
        if obj.get("properties"):
            lines += table(obj)
        else:
            lines.append(f"Type: {type_of(obj)}.")
    return "\n".join(lines) + "\n"


def exit_codes_page() -> str:
    """exit-codes.md with the table between its markers made from the error classes (trtflow.errors)."""
    from trtflow.errors import exit_code_table

    text = (REFERENCE / "exit-codes.md").read_text()
    begin, end = "<!-- exit-codes:begin -->\n", "<!-- exit-codes:end -->"
    head, rest = text.split(begin, 1)
    return head + begin + exit_code_table() + end + rest.split(end, 1)[1]


def pages() -> dict[Path, str]:
    """Every reference page this script writes, by path."""
    written = {REFERENCE / f"{what}.md": page(what) for what in PAGES}
    written[REFERENCE / "exit-codes.md"] = exit_codes_page()
    return written


def main(argv: list[str]) -> int:
    """Write the pages, or with --check, name each page that differs from what it would write (exit 1)."""
    written = pages()
    if "--check" in argv:
        stale = [path for path, text in written.items() if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path.name} differs from the schema: run `python docs/gen_reference.py`", file=sys.stderr)
        return 1 if stale else 0
    REFERENCE.mkdir(exist_ok=True)
    for path, text in written.items():
        path.write_text(text)
        print(f"wrote {path.relative_to(REFERENCE.parent.parent)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
