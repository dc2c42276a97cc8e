"""Plain YAML scalars read as YAML 1.2's core schema says, not as PyYAML's YAML 1.1.

PyYAML implements YAML 1.1, whose implicit types surprise the author of an experiment file:
``010`` is octal 8, ``1:30`` is base 60 (90), ``yes``/``no``/``on``/``off``/``y``/``n`` are
booleans, ``2024-01-01`` is a date, ``1_000`` is 1000. YAML 1.2's core schema (YAML 1.2.2,
section 10.3.2) has none of these: a plain scalar is null, a boolean, an integer or a float
only when it matches one of the patterns below; anything else is a string. So ``010`` is ten,
``0o10`` is eight, ``yes`` and ``1:30`` are strings (which a numeric field then refuses).
Editors validating against the JSON Schema (yaml-language-server) read YAML 1.2 too.

:func:`use_core_schema` gives a loader class these implicit types and constructors that read
exactly these forms; explicitly tagged scalars (``!!int 12``) go through the same constructors.
"""
from __future__ import annotations

import math
import re
import yaml

NULL_TAG = "tag:yaml.org,2002:null"
BOOL_TAG = "tag:yaml.org,2002:bool"
INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"

# The core schema's patterns, whole-value matches.
NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                   r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
# The first characters each pattern can start with (PyYAML looks resolvers up by them).
_FIRST = {NULL_TAG: ["~", "n", "N", ""], BOOL_TAG: list("tTfF"),
          INT_TAG: list("-+0123456789"), FLOAT_TAG: list("-+.0123456789")}
# Integers are at most 64 bits: longer ones are no setting of this project's, and Python
# refuses to print integers of over 4300 digits.
MAX_INT_BITS = 63


def construct_null(loader: yaml.constructor.BaseConstructor, node: yaml.ScalarNode) -> None:
    value = loader.construct_scalar(node)
    if not NULL.match(value):
        raise ValueError(f"{value!r} is not null (write null or ~)")
    return None


def construct_bool(loader: yaml.constructor.BaseConstructor, node: yaml.ScalarNode) -> bool:
    value = loader.construct_scalar(node)
    if not BOOL.match(value):
        raise ValueError(f"{value!r} is not a boolean (write true or false)")
    return value.lower() == "true"


def construct_int(loader: yaml.constructor.BaseConstructor, node: yaml.ScalarNode) -> int:
    """A decimal (``010`` is ten), ``0o`` octal or ``0x`` hexadecimal integer of at most 64
    bits."""
    value = loader.construct_scalar(node)
    if not INT.match(value):
        raise ValueError(f"{value!r} is not an integer")
    if value.startswith(("0o", "0x")):
        number = int(value[2:], 8 if value[1] == "o" else 16)
    else:
        number = int(value, 10)  # over 4300 digits: Python's ValueError, reported as is
    if abs(number) >= 1 << MAX_INT_BITS:
        raise ValueError(f"integers must fit in 64 bits (this one has {number.bit_length()})")
    return number


def construct_float(loader: yaml.constructor.BaseConstructor, node: yaml.ScalarNode) -> float:
    value = loader.construct_scalar(node)
    if not FLOAT.match(value):
        raise ValueError(f"{value!r} is not a number")
    if value.lstrip("+-").lower() == ".inf":
        return -math.inf if value.startswith("-") else math.inf
    if value.lower() == ".nan":
        return math.nan
    return float(value)


def use_core_schema(loader: type[yaml.SafeLoader]) -> type[yaml.SafeLoader]:
    """Make ``loader`` resolve plain scalars by YAML 1.2's core schema only (PyYAML's 1.1
    resolvers are dropped: no yes/no/on/off booleans, base-60 or octal-by-leading-zero
    numbers, timestamps, merge keys) and construct null, bool, int and float accordingly."""
    loader.yaml_implicit_resolvers = {}  # this class's own table, not SafeLoader's
    for tag, pattern in ((NULL_TAG, NULL), (BOOL_TAG, BOOL), (INT_TAG, INT),
                         (FLOAT_TAG, FLOAT)):  # in this order: 1 is an int, not a float
        loader.add_implicit_resolver(tag, pattern, _FIRST[tag])
    for tag, constructor in ((NULL_TAG, construct_null), (BOOL_TAG, construct_bool),
                             (INT_TAG, construct_int), (FLOAT_TAG, construct_float)):
        loader.add_constructor(tag, constructor)
    return loader

