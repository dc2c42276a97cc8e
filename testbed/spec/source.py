"""Positioned YAML: a parsed file that knows the line and column of every key and item (where
pydantic's errors are placed: ``testbed.spec.problems``).

Plain scalars are read as YAML 1.2's core schema says (``testbed.spec.yaml12``), not as
PyYAML's YAML 1.1: ``010`` is ten, ``yes``, ``on`` and ``1:30`` are text.

Input files may be hostile; reading them is bounded. Only regular files are read (a FIFO or a
device would block or never end), up to a size cap; the text must be UTF-8. YAML anchors and
aliases are refused outright: an alias repeats a subtree, so a few lines of them expand into
billions of values ("billion laughs"), and an aliased mapping is shared, so a matrix value set
in one place would silently change the other. Nesting is capped (PyYAML composes recursively).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import Problem, SpecError
from testbed.spec.yaml12 import use_core_schema

Loc = tuple[Any, ...]

# Experiment and topology files are a few KB (the largest shipped is 2 KB). The densest YAML
# ("[0,0,0,…]") at 64 KiB takes about 1 s of CPU to `validate` here through libyaml's parser,
# about twice that through PyYAML's pure one (results/benchmarks/bench_hostile.md).
MAX_YAML_BYTES = 64 << 10
# Deeper than any field path of an experiment file (about 8 levels), far below Python's
# recursion limit (PyYAML composes nodes recursively).
MAX_YAML_DEPTH = 32
# Longest value shown in a message.
SHOWN_CHARS = 80
_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))


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


class _Refused(yaml.MarkedYAMLError):
    """YAML that is well-formed but not accepted (anchors, aliases, deep nesting, values that
    cannot be constructed)."""


class _Bounded(yaml.composer.Composer, yaml.constructor.SafeConstructor,
               yaml.resolver.Resolver):
    """Composing and constructing as PyYAML's safe loader does, reading plain scalars as YAML
    1.2's core schema does (``testbed.spec.yaml12``: ``010`` is ten, ``yes`` and ``1:30`` are
    strings), refusing anchors, aliases and nesting deeper than MAX_YAML_DEPTH before it
    composes them, and reporting values it cannot construct at their position. The events come
    from a parser mixed in by the two loaders below."""

    def _start(self) -> None:
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Refused(problem="YAML anchors (&name) and aliases (*name) are not supported: "
                                   "write the values out", problem_mark=event.start_mark)
        if self._depth >= MAX_YAML_DEPTH:
            raise _Refused(problem=f"nested deeper than {MAX_YAML_DEPTH} levels",
                           problem_mark=event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # a scalar Python cannot turn into a value: an integer of over 4300 digits, a
        # tagged !!timestamp 2000-13-45
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as e:
            raise _Refused(problem=f"cannot read this value: {str(e).split(';')[0]}",
                           problem_mark=node.start_mark) from None


class _BoundedLoader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, _Bounded):
    """Events from PyYAML's pure-Python parser: its error messages are the ones reported."""

    def __init__(self, stream: str):
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        self._start()


# libyaml takes tabs as separators, "?" inside flow collections and a lone "!" tag where
# PyYAML refuses them or reads otherwise (found by comparing both on mutated experiment files):
# text with any of these is read by PyYAML alone, so that one file always means one thing.
_LIBYAML_READS_OTHERWISE = frozenset("\t?!\ufeff")

try:
    from yaml.cyaml import CParser as _LibyamlParser
except ImportError:  # PyYAML built without libyaml: the pure parser alone
    _LibyamlParser = None
else:
    class _FastBoundedLoader(_Bounded, _LibyamlParser):
        """Events from libyaml's parser, several times faster on dense files. The composer above
        it is the same Python code, so positions, refusals and values are the same; a file
        libyaml finds wrong is parsed again by _BoundedLoader for PyYAML's message."""

        def __init__(self, stream: str):
            _LibyamlParser.__init__(self, stream)
            self._start()


use_core_schema(_Bounded)


def parse_yaml(text: str, file: str) -> Source:
    """Parse YAML text, recording positions; raises SpecError on syntax errors, duplicate keys,
    characters YAML does not allow, anchors/aliases and nesting deeper than MAX_YAML_DEPTH."""
    if _LibyamlParser is not None and not _LIBYAML_READS_OTHERWISE.intersection(text):
        try:
            return _parse_with(_FastBoundedLoader, text, file)
        except SpecError:
            pass  # the pure parser says what is wrong, in its words and at its position
    return _parse_with(_BoundedLoader, text, file)


def _parse_with(loader_class: type, text: str, file: str) -> Source:
    try:
        loader = loader_class(text)
    except yaml.YAMLError as e:  # the reader checks every character first
        raise SpecError([_yaml_problem(e, text, file)]) from None
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
        src = Source(file, data)
        dupes: list[Problem] = []
        if node is not None:
            _walk(node, (), src, dupes, loader)
    except yaml.YAMLError as e:
        raise SpecError([_yaml_problem(e, text, file)]) from None
    finally:
        loader.dispose()
    if dupes:
        raise SpecError(dupes)
    return src


def _yaml_problem(e: yaml.YAMLError, text: str, file: str) -> Problem:
    """One line, at the error's position when it has one."""
    if isinstance(e, yaml.reader.ReaderError):
        line, col = _line_col(text, e.position)
        char = e.character if isinstance(e.character, int) else ord(e.character)
        return Problem(file, line, col, "", f"unacceptable character #x{char:04x}: {e.reason}")
    mark = getattr(e, "problem_mark", None)
    line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
    msg = getattr(e, "problem", None) or " ".join(str(e).split())
    return Problem(file, line, col, "", msg if isinstance(e, _Refused) else f"YAML syntax: {msg}")


def _line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of character ``offset`` in ``text``."""
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def _walk(node: yaml.Node, loc: Loc, src: Source, dupes: list[Problem],
          loader: _BoundedLoader) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            # a key as the document has it (010: is the integer 10, on: the string 'on')
            key = key_node.value if key_node.tag == "tag:yaml.org,2002:str" else \
                loader.construct_object(key_node, deep=True)
            child = loc + (key,)
            pos = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in seen:
                dupes.append(Problem(src.file, *pos, _dotted(child), "key given twice"))
            seen.add(key)
            src.positions[child] = pos
            _walk(value_node, child, src, dupes, loader)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            src.positions[loc + (i,)] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _walk(item, loc + (i,), src, dupes, loader)


def read_source(path: Path) -> Source:
    """Read and parse a YAML file; raises SpecError when it is missing, unreadable, not a
    regular file, over MAX_YAML_BYTES, not UTF-8 or not acceptable YAML (see parse_yaml)."""
    try:
        data = read_bounded(Path(path), MAX_YAML_BYTES)
    except OSError as e:
        raise SpecError([Problem(str(path), 0, 0, "", f"cannot read: {e.strerror}")]) from None
    except ValueError as e:
        raise SpecError([Problem(str(path), 0, 0, "", f"cannot read: {e}")]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[:e.start].decode("utf-8")
        line, col = _line_col(before, len(before))
        raise SpecError([Problem(str(path), line, col, "", f"not UTF-8 text: byte "
                                 f"0x{data[e.start]:02x} (save the file as UTF-8)")]) from None
    return parse_yaml(text, str(path))


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes. Raises OSError when it cannot
    be opened or read, ValueError when it is not a regular file (a FIFO or device would block
    or never end; it is opened non-blocking and never read) or is larger than ``limit``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            kind = next((k for test, k in _FILE_KINDS if test(mode)), "not a file")
            raise ValueError(f"{kind}, not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than the {size_text(limit)} cap")
    return data


def size_text(n_bytes: int) -> str:
    """``n_bytes`` as MiB or KiB when it is a whole number of them, e.g. ``1 MiB``."""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes % size == 0:
            return f"{n_bytes // size} {unit}"
    return f"{n_bytes} bytes"
