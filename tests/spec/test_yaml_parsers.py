"""libyaml's parser and PyYAML's pure one read every file the same way.

`parse_yaml` takes events from libyaml where PyYAML was built with it (several times faster on
a dense file at the size cap) and falls back to the pure parser for files libyaml refuses, so
that errors keep PyYAML's words. Text with the characters the two read differently goes to the
pure parser alone. These tests hold the two to one result: data, positions and problems.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from testbed.errors import SpecError
from testbed.spec import source

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for d in ("experiments", "topologies", "tests", "docs")
                 for p in (ROOT / d).rglob("*.yaml"))
# characters and pieces that change how YAML reads, inserted at random places
PIECES = ["\t", "?", "!", "\ufeff", ":", "-", " ", "[", "]", "{", "}", '"', "'", "#", "&", "*",
          "|", ">", "\n", "%", "@", "`", ",", "\x85", "\u2028", "\x07", "\r", "\\", "...",
          "\n---\n", "%YAML 1.1\n", "!!str ", "!x ", "<<: ", "~", "0x", "0o", "1e3", "\u00a0"]

pytestmark = pytest.mark.skipif(source._LibyamlParser is None, reason="PyYAML without libyaml")


def _read(loader: type, text: str) -> tuple:
    try:
        src = source._parse_with(loader, text, "f.yaml")
    except SpecError as e:
        return ("refused", str(e))
    return ("read", src.data, src.positions)


def _both(text: str) -> tuple[tuple, tuple]:
    return _read(source._FastBoundedLoader, text), _read(source._BoundedLoader, text)


def _texts() -> list[str]:
    out = []
    for p in SHIPPED:
        try:
            out.append(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError:  # the hostile non-UTF-8 files never reach a parser
            continue
    return out


def test_every_shipped_yaml_file_reads_the_same_with_both_parsers():
    texts = _texts()
    assert len(texts) > 100
    differ = [t[:60] for t in texts
              if not source._LIBYAML_READS_OTHERWISE.intersection(t)
              and (lambda a, b: a[0] == "read" and a != b)(*_both(t))]
    assert differ == []


def test_mutated_files_read_the_same_unless_they_go_to_the_pure_parser_alone():
    """A file libyaml reads must mean what PyYAML reads; a file libyaml refuses is read
    again by PyYAML, so only libyaml's acceptances are compared."""
    rnd = random.Random(20261126)
    compared, differ = 0, []
    for text in _texts()[::2]:
        for _ in range(12):
            chars = list(text)
            for _ in range(rnd.randint(1, 3)):
                i = rnd.randrange(len(chars))
                if rnd.random() < 0.5:
                    chars.insert(i, rnd.choice(PIECES))
                else:
                    chars[i] = rnd.choice(PIECES)
            mutated = "".join(chars)
            if source._LIBYAML_READS_OTHERWISE.intersection(mutated):
                continue
            fast, pure = _both(mutated)
            compared += 1
            if fast[0] == "read" and fast != pure:
                differ.append(mutated[:80])
    assert compared > 300
    assert differ == []


@pytest.mark.parametrize("text", ["a:\tb\n", "x: [a?b, c]\n", "x: !\n", "a: 1\n\ufeffb: 2\n"])
def test_text_libyaml_reads_otherwise_goes_to_the_pure_parser(text):
    fast, pure = _both(text)
    assert fast != pure  # why these characters are routed
    try:
        got = ("read", source.parse_yaml(text, "f.yaml").data)
    except SpecError as e:
        got = ("refused", str(e))
    assert got == pure[:2]


def test_a_file_libyaml_refuses_is_reported_in_pyyamls_words():
    text = "a: [1, 2\nb: 3\n"
    with pytest.raises(SpecError) as e:
        source.parse_yaml(text, "f.yaml")
    assert str(e.value) == _read(source._BoundedLoader, text)[1]
