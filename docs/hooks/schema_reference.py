"""mkdocs hook: the experiment file's field reference, rendered from its JSON Schema at build time.

``docs/reference/experiment-file.md`` holds the marker below; when the site is built, the marker
is replaced by one table per section of the file (every field: type, default, limits,
description), rendered from ``testbed.spec.schema.json_schema()``, the schema that
``python -m testbed schema`` prints and the models validate against. So the reference is never
out of date with the code: a field added, renamed or given a new default shows up in the next
build. A page without the marker fails the build.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

PAGE = "reference/experiment-file.md"
MARKER = "<!-- generated: the experiment file's fields -->"
ROOT = Path(__file__).resolve().parents[2]


def _schema() -> dict:
    """The schema of this checkout's ``testbed`` (not of whatever copy is installed)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from testbed.spec.schema import json_schema

    return json_schema()


def _ref(spec: dict) -> str | None:
    ref = spec.get("$ref", "")
    return ref.rsplit("/", 1)[-1] if ref else None


def _anchor(name: str) -> str:
    return name.lower()


def _text(value: str) -> str:
    """One table cell: RST literals as Markdown ones, one line, pipes escaped."""
    value = re.sub(r"``([^`]+)``", r"`\1`", value)
    parts = " ".join(value.split()).split("`")
    for i in range(0, len(parts), 2):  # outside code spans, <x> is text, not an HTML tag
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|")


def _branches(spec: dict) -> list[dict]:
    return [b for b in spec.get("anyOf", [spec]) if b.get("type") != "null"]


def _kind(spec: dict, defs: dict) -> str:
    parts = []
    for b in _branches(spec):
        name = _ref(b)
        if name and "enum" in defs[name]:
            parts.append(" \\| ".join(f"`{v}`" for v in defs[name]["enum"]))
        elif name:
            parts.append(f"[{name}](#{_anchor(name)})")
        elif "enum" in b:
            parts.append(" \\| ".join(f"`{v}`" for v in b["enum"]))
        elif b.get("type") == "array":
            parts.append("list of " + _kind(b.get("items", {}), defs))
        elif b.get("type") == "object" and isinstance(b.get("additionalProperties"), dict):
            parts.append("mapping to " + _kind(b["additionalProperties"], defs))
        elif "type" in b:
            parts.append(b["type"] + (f" ({b['format']})" if "format" in b else ""))
        else:
            parts.append("any")
    return " or ".join(parts) or "null"


LIMITS = {"minimum": "≥ {}", "maximum": "≤ {}", "exclusiveMinimum": "> {}",
          "exclusiveMaximum": "< {}", "minLength": "at least {} characters",
          "maxLength": "at most {} characters", "minItems": "at least {} item(s)",
          "maxItems": "at most {} item(s)", "pattern": "matches `{}`"}


def _limits(spec: dict) -> str:
    found = []
    for b in _branches(spec):
        found += [form.format(b[key]) for key, form in LIMITS.items() if key in b]
    return "; ".join(found)


def _default(name: str, spec: dict, required: set[str]) -> str:
    if name in required:
        return "required"
    if "default" not in spec:
        return "its own defaults" if any(_ref(b) for b in _branches(spec)) else ""
    return f"`{json.dumps(spec['default'], ensure_ascii=False)}`"


def _table(obj: dict, defs: dict) -> list[str]:
    required = set(obj.get("required", []))
    rows = ["| field | type | default | limits | what it is |", "| --- | --- | --- | --- | --- |"]
    for name, spec in obj.get("properties", {}).items():
        rows.append("| " + " | ".join([
            f"`{name}`", _kind(spec, defs), _default(name, spec, required),
            _text(_limits(spec)), _text(spec.get("description", ""))]) + " |")
    return rows


def _sections(schema: dict, defs: dict) -> dict[str, tuple[str, list[str]]]:
    """Every section (a model with fields) in the order a breadth-first walk from the top level
    reaches it: the dotted path where it first occurs (``[]``: a list's items, ``<key>``: a
    mapping's values) and the fields, ``Section.field``, that hold it."""
    found: dict[str, tuple[str, list[str]]] = {}
    queue = [("", "the top level", schema)]
    while queue:
        path, owner, obj = queue.pop(0)
        for field, spec in obj.get("properties", {}).items():
            here = f"{path}.{field}" if path else field
            for b in _branches(spec):
                for sub, suffix in ((b, ""), (b.get("items"), "[]"),
                                    (b.get("additionalProperties"), ".<key>")):
                    name = _ref(sub) if isinstance(sub, dict) else None
                    if not name or "properties" not in defs[name]:
                        continue
                    holder = f"`{field}` of {owner}"
                    if name not in found:
                        found[name] = (here + suffix, [holder])
                        queue.append((here + suffix, f"[{name}](#{_anchor(name)})", defs[name]))
                    elif holder not in found[name][1]:
                        found[name][1].append(holder)
    return found


def render(schema: dict) -> str:
    """Markdown: the top level of the file, then every section in the order it is reached."""
    defs = schema["$defs"]
    lines = ["### The top level", "", _text(schema.get("description", "")), "",
             *_table(schema, defs)]
    sections = _sections(schema, defs)
    missing = [n for n in defs if "properties" in defs[n] and n not in sections]
    if missing:
        raise ValueError(f"sections no field of the file leads to: {missing}")
    for name, (first, holders) in sections.items():
        also = f"; also {', '.join(holders[1:])}" if len(holders) > 1 else ""
        lines += ["", f"### {name}", "", f"At `{first}` ({holders[0]}{also}).", ""]
        if defs[name].get("description"):
            lines += [_text(defs[name]["description"]), ""]
        lines += _table(defs[name], defs)
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"{PAGE} lacks the marker {MARKER!r} where the fields go")
    return markdown.replace(MARKER, render(_schema()))
