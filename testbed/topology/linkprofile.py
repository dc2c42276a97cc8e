"""Link profiles: what one direction of a link does to packets (delay, jitter, loss, rate,
queue), and the steps that change it while a run goes on. Pure data (no kernel); the topology
(``testbed.topology``) assigns them to links, the shapers apply them.
"""
from __future__ import annotations

import ipaddress
import math
import re
from enum import Enum
from typing import Literal, get_args

from pydantic import (BaseModel, ConfigDict, Field, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

# Fiber propagation, one way: about 5 µs per km.
FIBER_MS_PER_KM = 0.005
# Interface names are at most 15 characters (IFNAMSIZ 16 with the NUL). Backends name
# interfaces "<6-char run prefix><dc name><up to 3 chars>", so a DC name fits in 6.
IFNAMSIZ = 15
MAX_DC_NAME = 6
DC_NAME_PATTERN = r"^[a-z][a-z0-9]*$"
# Smallest default queue: room for a few 64 KB GSO packets even on slow, short links.
MIN_QUEUE_BYTES = 256 * 1024
TRANSIT_NET = ipaddress.ip_network("10.255.0.0/16")
MAX_DELAY_MS = 10_000
# A delay relative to compute, "<factor>xTF": factor × one stage's forward time (CrossPipe).
RELATIVE_DELAY = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*x\s*TF\s*$")


# Longest text of a wrong value quoted in a message.
SHOWN_VALUE_CHARS = 40


class Strict(BaseModel):
    """Base for every file-backed model: unknown keys and non-finite numbers (nan, inf) are
    errors, and a numeric field takes numbers only: pydantic's lax mode would read true as 1
    and false as 0, and a word such as 'yes' (a boolean in YAML 1.1) is no number either. A
    boolean field takes true or false only (lax mode would read 'yes', 'on' or 1 as true)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, v: object, info: ValidationInfo) -> object:
        numeric, takes_text, boolean = _field_kind(cls, info.field_name)
        if boolean and isinstance(v, (str, int, float)) and not isinstance(v, bool):
            # lax mode would read 'yes', 'on', 1 as true: YAML 1.2 reads yes as text
            raise PydanticCustomError("not_a_boolean", "{value} is not a boolean; write true "
                                      "or false", {"value": _shown(v)})
        if not isinstance(v, (bool, str)) or not numeric:
            return v
        if isinstance(v, bool):
            raise PydanticCustomError("bool_not_number", "{value} is a boolean, not a number; "
                                      "write 1 or 0", {"value": "true" if v else "false"})
        if not takes_text and not _parses_as_number(v):
            raise not_a_number(v)
        return v


def _shown(value: object) -> str:
    """A value as an error message shows it: text quoted and shortened, numbers as written."""
    if not isinstance(value, str):
        return str(value)
    return repr(value if len(value) <= SHOWN_VALUE_CHARS else value[:SHOWN_VALUE_CHARS] + "…")


def not_a_number(text: str) -> PydanticCustomError:
    """The error for ``text`` given where a number is wanted, saying what to write instead."""
    return PydanticCustomError("not_a_number", "{text} is not a number; write a number such "
                               "as {hint}", {"text": _shown(text), "hint": number_hint(text)})


def number_hint(text: str) -> str:
    """A number to write instead of ``text``: YAML 1.1's words for true and false become 1
    and 0, a base-60 number (``1:30``, which YAML 1.2 reads as text) its value, else 1."""
    word = text.strip().lower()
    if word in ("no", "n", "off", "false"):
        return "0"
    if re.fullmatch(r"[-+]?[0-9]+(?::[0-5]?[0-9])+(?:\.[0-9]*)?", word):
        total = 0.0
        for part in word.lstrip("+-").split(":"):
            total = total * 60 + float(part)
        return f"{-total if word.startswith('-') else total:g}"
    return "1"


def _parses_as_number(text: str) -> bool:
    try:
        float(text)  # what pydantic's lax mode reads (CSV link traces give numbers as text)
    except ValueError:
        return False
    return True


_FIELD_KINDS: dict[tuple[type, str], tuple[bool, bool, bool]] = {}


def _field_kind(model: type[BaseModel], name: str) -> tuple[bool, bool, bool]:
    """(takes numbers but not booleans, also takes text, takes booleans and nothing else but
    null) of a field's annotation."""
    key = (model, name)
    if key not in _FIELD_KINDS:
        leaves = _leaf_types(model.model_fields[name].annotation)
        _FIELD_KINDS[key] = (bool({int, float} & leaves) and bool not in leaves,
                             str in leaves, bool in leaves and leaves <= {bool, type(None)})
    return _FIELD_KINDS[key]


def _leaf_types(annotation: object) -> set[object]:
    args = get_args(annotation)
    if not args:
        return {annotation}
    return set().union(*(_leaf_types(a) for a in args))


class JitterDistribution(str, Enum):
    normal = "normal"
    uniform = "uniform"
    pareto = "pareto"
    paretonormal = "paretonormal"


class GilbertElliott(Strict):
    """Two-state loss (netem ``loss gemodel p r 1-h 1-k``), percentages per packet."""

    p_pct: float = Field(ge=0, le=100, description="P(good → bad) per packet, %")
    r_pct: float = Field(ge=0, le=100, description="P(bad → good) per packet, %")
    loss_bad_pct: float = Field(100, ge=0, le=100, description="loss while bad (1-h), %")
    loss_good_pct: float = Field(0, ge=0, le=100, description="loss while good (1-k), %")


class Queue(Strict):
    """Bottleneck queue limit: exactly one of packets or bytes."""

    packets: int | None = Field(None, gt=0)
    bytes: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _exactly_one(self) -> "Queue":
        if (self.packets is None) == (self.bytes is None):
            raise ValueError("give exactly one of packets or bytes")
        return self


PRESETS: dict[str, dict] = {
    # Optical transport between DCs: lossless, deterministic latency, high rate.
    "dc-otn": {"jitter_ms": 0.0, "loss_pct": 0.0, "rate_mbit": 10000.0},
    # Public WAN: some jitter and loss, about a gigabit.
    "wan": {"jitter_ms": 1.0, "loss_pct": 0.01, "rate_mbit": 1000.0},
}


class LinkProfile(Strict):
    """What one direction of a link does to packets. Unset fields inherit (see ``merged``)."""

    preset: Literal["dc-otn", "wan"] | None = Field(None, description="defaults for unset fields")
    delay_ms: float | str | None = Field(
        None, description="one-way delay, ms")  # or, in an experiment's links, "2xTF"
    distance_km: float | None = Field(None, ge=0, le=40_000, description="fiber length; 5 µs/km")
    jitter_ms: float = Field(0.0, ge=0, le=10_000, description="delay variation, ms")
    jitter_distribution: JitterDistribution = JitterDistribution.normal
    loss_pct: float = Field(0.0, ge=0, le=100, description="Bernoulli loss, %")
    loss_model: Literal["bernoulli", "gilbert_elliott"] = "bernoulli"
    gilbert_elliott: GilbertElliott | None = None
    rate_mbit: float | None = Field(None, gt=0, le=400_000,
                                     description="rate limit, Mbit/s; omit for unshaped")
    queue: Queue | None = Field(None, description="default: one bandwidth-delay product")

    @field_validator("delay_ms", mode="before")
    @classmethod
    def _delay_number(cls, v: object) -> object:
        # a number as text (CSV link traces) becomes one; nan and inf are refused here, before
        # the float | str union, which would report them once per member
        if isinstance(v, str) and not RELATIVE_DELAY.match(v):
            if not _parses_as_number(v):
                raise not_a_number(v)
            v = float(v)
        if isinstance(v, float) and not math.isfinite(v):
            raise PydanticCustomError("finite_number", "Input should be a finite number")
        return v

    @field_validator("delay_ms")
    @classmethod
    def _delay(cls, v: float | str | None) -> float | str | None:
        if isinstance(v, str):
            return f"{float(RELATIVE_DELAY.match(v).group(1)):g}xTF"
        if v is not None and v < 0:
            raise PydanticCustomError("greater_than_equal",
                                      "Input should be greater than or equal to {ge}", {"ge": 0})
        if v is not None and v > MAX_DELAY_MS:
            raise PydanticCustomError("less_than_equal",
                                      "Input should be less than or equal to {le}",
                                      {"le": MAX_DELAY_MS})
        return v

    @property
    def relative_delay_tf(self) -> float | None:
        """The factor of a delay given as a multiple of the forward time ('2xTF' → 2.0)."""
        return float(self.delay_ms[:-3]) if isinstance(self.delay_ms, str) else None

    @model_validator(mode="after")
    def _consistent(self) -> "LinkProfile":
        if self.delay_ms is not None and self.distance_km is not None:
            raise ValueError("give delay_ms or distance_km, not both")
        if self.loss_model == "gilbert_elliott" and self.gilbert_elliott is None:
            raise ValueError("loss_model gilbert_elliott needs a gilbert_elliott block")
        return self

    def set_fields(self) -> dict:
        """The fields given explicitly (including by a preset), as a dict."""
        return self.model_dump(exclude_unset=True)

    def merged(self, override: "LinkProfile | None") -> "LinkProfile":
        """This profile with every field ``override`` sets replaced; presets apply underneath."""
        data = self.set_fields()
        if override is not None:
            over = override.set_fields()
            if "delay_ms" in over:
                data.pop("distance_km", None)
            if "distance_km" in over:
                data.pop("delay_ms", None)
            data.update(over)
        preset = data.get("preset")
        if preset:
            data = {**PRESETS[preset], **data}
        return LinkProfile(**data)

    @property
    def one_way_delay_ms(self) -> float:
        """The one-way delay in ms: delay_ms, or distance_km × 5 µs, or 0."""
        if isinstance(self.delay_ms, str):
            raise ValueError(f"delay {self.delay_ms!r} is relative to compute and was not "
                             "resolved (testbed.spec resolves it per cell)")
        if self.delay_ms is not None:
            return self.delay_ms
        if self.distance_km is not None:
            return self.distance_km * FIBER_MS_PER_KM
        return 0.0

    def queue_limit_bytes(self, rtt_ms: float | None = None) -> int | None:
        """The queue limit in bytes (packets × 1500), or one BDP at ``rtt_ms`` when unset.

        ``rtt_ms`` defaults to twice this direction's one-way delay. None when unshaped.
        """
        if self.queue is not None:
            return self.queue.bytes if self.queue.bytes else self.queue.packets * 1500
        if self.rate_mbit is None:
            return None
        rtt = 2 * self.one_way_delay_ms if rtt_ms is None else rtt_ms
        bdp = int(self.rate_mbit * 1e6 / 8 * rtt / 1000)
        return max(bdp, MIN_QUEUE_BYTES)


class Step(LinkProfile):
    """A change of a link's profile ``at_s`` seconds after the workers start, or at the start
    of iteration ``at_iteration`` (0-based, warm-up included; applied when rank 0 has finished
    the iteration before, in the start-sync gap: see ``testbed.net.steps``)."""

    at_s: float | None = Field(None, ge=0, description="seconds after the start of the run")
    at_iteration: int | None = Field(None, ge=0, description="start of this iteration "
                                     "(0-based, warm-up included); instead of at_s")

    @model_validator(mode="after")
    def _one_time(self) -> "Step":
        if (self.at_s is None) == (self.at_iteration is None):
            raise ValueError("a step gives at_s or at_iteration (one of them)")
        return self


def step_order(st: Step) -> tuple[int, float]:
    """Sort key of steps: at_s ones by time, then at_iteration ones by iteration."""
    return (0, st.at_s) if st.at_s is not None else (1, float(st.at_iteration))
