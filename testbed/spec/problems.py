"""pydantic's errors as :class:`testbed.errors.Problem` at the file's line and column, worded
for the file's author: unknown keys list the allowed ones, a field's description is added as a
hint, a value that is not a number says what to write.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from testbed.errors import Problem
from testbed.spec.source import Loc, Source, SHOWN_CHARS


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


# error kinds whose message already quotes the value (or should not: a pattern's subject)
_SHOWS_VALUE = ("string_pattern_mismatch", "bool_not_number", "not_a_number", "not_a_boolean")


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
    if isinstance(got, (int, float, str, bool)) and kind not in _SHOWS_VALUE:
        return [f"{msg[0].lower()}{msg[1:]} (got {_shown(got)})"]
    return [msg[0].lower() + msg[1:]]


def _shown(value: int | float | str | bool) -> str:
    """``repr(value)``, shortened to SHOWN_CHARS (a file's value may be 60 KB long)."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


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
