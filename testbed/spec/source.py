"""Positioned YAML: a parsed file that knows the line and column of every key and item, and the
translation of pydantic's errors into :class:`testbed.errors.Problem` at those positions."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from testbed.errors import Problem, SpecError

Loc = tuple[Any, ...]


@dataclass
class Source:
    """A parsed YAML file: its data and the 1-based (line, column) of every key and item."""

    file: str
    data: Any
    positions: dict[Loc, tuple[int, int]] = field(default_factory=dict)

    def where(self, loc: Loc) -> tuple[int, int]:
        """Position of ``loc``, or of its nearest ancestor that has one (0, 0 if none)."""
        loc = tuple(loc)
        while loc and loc not in self.positions:
            loc = loc[:-1]
        return self.positions.get(loc, (0, 0))

    def problem(self, loc: Loc, message: str) -> Problem:
        line, col = self.where(loc)
        return Problem(self.file, line, col, _dotted(loc), message)


def _dotted(loc: Loc) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")


def parse_yaml(text: str, file: str) -> Source:
    """Parse YAML text, recording positions; raises SpecError on syntax errors or duplicate keys."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        msg = getattr(e, "problem", None) or str(e)
        raise SpecError([Problem(file, line, col, "", f"YAML syntax: {msg}")]) from None
    src = Source(file, data)
    dupes: list[Problem] = []
    if node is not None:
        _walk(node, (), src, dupes)
    if dupes:
        raise SpecError(dupes)
    return src


def _walk(node: yaml.Node, loc: Loc, src: Source, dupes: list[Problem]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = yaml.safe_load(yaml.serialize(key_node)) if key_node.tag != \
                "tag:yaml.org,2002:str" else key_node.value
            child = loc + (key,)
            pos = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in seen:
                dupes.append(Problem(src.file, *pos, _dotted(child), "key given twice"))
            seen.add(key)
            src.positions[child] = pos
            _walk(value_node, child, src, dupes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            src.positions[loc + (i,)] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _walk(item, loc + (i,), src, dupes)


def read_source(path: Path) -> Source:
    """Read and parse a YAML file; raises SpecError when it is missing or unreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError([Problem(str(path), 0, 0, "", f"cannot read: {e.strerror}")]) from None
    return parse_yaml(text, str(path))


# ---------------------------------------------------------------- pydantic errors → problems


def pydantic_problems(err: ValidationError, src: Source, prefix: Loc,
                      model: type[BaseModel]) -> list[Problem]:
    """One problem per pydantic error, placed at the key it is about (under ``prefix``) and
    worded for the file's author: unknown keys list the allowed ones, a field's description is
    added as a hint."""
    out = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not _is_union_tag(p))
        out.extend(src.problem(prefix + loc, m) for m in _messages(e, loc, model))
    return out


def _is_union_tag(part: Any) -> bool:
    # pydantic names union members in locs ("str", "Topology", "function-after[...]").
    return isinstance(part, str) and (part[:1].isupper() or "[" in part)


def _messages(e: dict, loc: Loc, model: type[BaseModel]) -> list[str]:
    hint = _description(model, loc)
    return [m + (f" ({hint})" if hint and e["type"] not in ("extra_forbidden", "missing") else "")
            for m in _base_messages(e, loc, model)]


def _description(model: type[BaseModel], loc: Loc) -> str:
    if not loc or isinstance(loc[-1], int):
        return ""
    parent = _model_at(model, loc[:-1])
    f = parent.model_fields.get(loc[-1]) if parent else None
    return (f.description or "") if f else ""


def _base_messages(e: dict, loc: Loc, model: type[BaseModel]) -> list[str]:
    kind, msg = e["type"], e["msg"]
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1])
        return [f"unknown key {loc[-1]!r}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")]
    if kind == "missing":
        return ["required; add it"]
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
        return msg.split("; ")
    got = e.get("input")
    if isinstance(got, (int, float, str, bool)) and kind not in ("string_pattern_mismatch",):
        return [f"{msg[0].lower()}{msg[1:]} (got {got!r})"]
    return [msg[0].lower() + msg[1:]]


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The pydantic model class found by following ``loc`` through field annotations."""
    cur: Any = model
    for part in loc:
        if isinstance(part, int) or cur is None:
            continue
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return None
        f = cur.model_fields.get(part)
        cur = model_in(f.annotation) if f else None
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def model_in(annotation: Any) -> Any:
    """The first pydantic model class in a field annotation (``X | None``, ``list[X]``…), or
    None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = model_in(arg)
        if found is not None:
            return found
    return None


def _fields_at(model: type[BaseModel], loc: Loc) -> list[str]:
    m = _model_at(model, loc)
    return list(m.model_fields) if m else []
