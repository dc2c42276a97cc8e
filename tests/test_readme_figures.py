"""Every figure README.md and the documentation quote is traceable (issue 17, item 4; issue 25
moved most of the README into ``docs/``, and the check went with it).

The checked text is the README and every page under ``docs/`` except the few in ``NOT_CHECKED``
(each with its reason), so a new page is checked by default. Every number in it that looks like
a measurement (any number with a fractional part, and any percentage) must appear as text in a
git-tracked file under ``results/`` (that the page names the command beside it is for review to
see). Renderings allowed: a Unicode minus
for ``-``, a ``+`` sign, trailing zeros (``0.10`` = ``0.1``), and an unsigned README figure may
quote a negative one as a magnitude ("within 2.2 %" for ``-2.2%``). No rounding: a README
figure that a file holds only to more digits fails.

Two lists say what else a number there may be:

- ``NOT_MEASURED``: configuration values, versions, formulas, targets and the papers' claims,
  each as the text it stands in, with why;
- ``DERIVED``: figures computed from committed ones (a change between two medians, a median of
  three repeats), each with its arithmetic, which is redone here over numbers that must
  themselves be in a committed file; and the simulator's agreement with the four reproductions,
  recomputed from their results.csv files.

Also: the "What the first command prints" transcript (docs/quickstart.md) is the end of the
committed setup log, every ``results/...`` path the README or any page names exists in git, and
benchmarks/README.md lists every saved benchmark output.
"""
from __future__ import annotations

import ast
import csv
import re
import statistics
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
QUICKSTART_PAGE = DOCS / "quickstart.md"
# Pages under docs/ whose figures are not checked, and why. Everything else is.
NOT_CHECKED = {
    "architecture.md": "the design: constants of the code, hardware specifications and the "
                       "fidelity thresholds' derivation; written before the check existed",
    "facts.md": "facts measured by hand once, each with the command that re-checks it, and the "
                "papers' published setups",
    "crosspipe-comparison.md": "the outputs of CrossPipe's own simulator, which is not part "
                               "of this repository",
}
SETUP_LOG = ROOT / "results" / "quickstart-example" / "setup-sh.log"
BINARY_SUFFIXES = {".png", ".parquet"}

# a number not glued to a word, a dot or another sign; versions such as 2.13.0 never match
NUMBER = re.compile(r"(?<![\w.−+-])([−+-]?)(\d+(?:\.\d+)?)(?!\w|\.\d)(\s?%)?")
RESULTS_PATH = re.compile(r"results/[\w./*<>-]*")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)

NOT_MEASURED = {
    "Python 3.11": "a version",
    "torch 2.13": "a version",
    "Linux 6.1": "a version (user-mode Linux kernel)",
    "(p−1)/(m+p−1) = 0.27": "formula: the textbook bubble for p = 4, m = 8",
    "(p−1)/(m+p−1) = 0.273": "formula: the textbook bubble for p = 4, m = 8",
    "(p − 1)/(m + p − 1) = 0.27": "formula: the textbook bubble for p = 4, m = 8",
    "theory 0.273": "formula: the textbook bubble for p = 4, m = 8",
    "max(0.2 ms, 1 %)": "the delay line's RTT target",
    "0.1/1/5 Gbit/s": "configured shaping rates",
    "bytes_scale: 1.0": "configuration (the experiment file's example)",
    "±5 %": "the fidelity threshold and the simulator's target",
    "≥ 50 % cut": "GeoPipe target",
    "a 50 % cut": "GeoPipe target",
    "≥ 20 %": "CBA target",
    "≥ 85 %": "BubbleTea's utilization target",
    "< 2 %": "the filler's slowdown target",
    "above +5 %": "the fidelity threshold",
    "within 3 %": "the acceptance criterion of tests/runner/test_program.py",
    "95 % interval": "the confidence level of the intervals",
    "[95 % CI]": "the confidence level of the intervals",
    "≥ 95 %": "the binomial coverage that defines the intervals",
    "0.75 ×": "the simulator's window-limit model constant (testbed/sim/paths.py)",
    "0.01 %": "configured WAN loss",
    "up to 33.6 %": "CrossPipe's claim",
    "−33.6 %": "CrossPipe's claim",
    "78.91 %": "GeoPipe's claim",
    "31.25 %": "CBA's claim",
    "13.20 %": "CBA's claim (blocking, docs/optical.md)",
    "19.33 %": "CBA's claim (best blocking reduction, docs/optical.md)",
    "12.5 GHz": "the slot width of CBA's published grid (configuration)",
    "80, 12.5, 75, 1": "the optical grid's defaults (configuration)",
    "94 %": "BubbleTea's claim",
    "≈ 0.04": "configured transfer (10 Gbit/s), as a multiple of T_F",
    "0, 0.25, 0.5,\n1, 2 × T_F": "configured delays",
    "0.25, 0.5, 1, 2 × T_F": "configured transfers",
    "0.25 MiB": "configured socket buffer",
    "0.5 × T_F": "configured transfer",
    "0.5 ms wait window": "a constant of the greedy schedule",
    "below −3 %": "a threshold the sentence picks",
    "2.5 MB here": "the default queue: one bandwidth-delay product, 1 Gbit/s × 20 ms RTT",
}

DERIVED = {  # README text: the arithmetic behind each of its figures, in order
    "−15.7 % iteration time": ["100 * (0.719075 / 0.852524 - 1)"],
    "−14.7 % predicted": ["100 * (0.710017 / 0.832585 - 1)"],
    "−19.5 % on `torch`": ["100 * (0.816779 / 1.014343 - 1)"],
    "script's own 3.412 s": ["median([3.428818, 3.410684, 3.410391, 3.412452])"],
    "| −45.1 % (−45.3 … −44.9) |": [  # the atlas row; the cba row's 1.613 gives the same
        "100 * (1.611 / 2.936 - 1)", "100 * (1.61 / 2.943 - 1)", "100 * (1.614 / 2.929 - 1)"],
    "| −3.9 % (−4.7 … −3.6) |": [
        "100 * (2.923 / 3.041 - 1)", "100 * (2.912 / 3.057 - 1)", "100 * (2.929 / 3.037 - 1)"],
    "| −10.5 % (−11.1 … −10.3) |": [
        "100 * (2.721 / 3.041 - 1)", "100 * (2.718 / 3.057 - 1)", "100 * (2.725 / 3.037 - 1)"],
    "backbone: −45.1 % iteration time": ["100 * (1.611 / 2.936 - 1)"],
    "no less than −44.9 %": ["100 * (1.613 / 2.929 - 1)"],
    "10.3–11.1 % faster": ["100 * (1 - 2.725 / 3.037)", "100 * (1 - 2.718 / 3.057)"],
    "gives 3.6–4.7 %": ["100 * (1 - 2.929 / 3.037)", "100 * (1 - 2.912 / 3.057)"],
    "| −69.4 % (−70.0 … −68.9) |": [
        "100 * (2.944 / 9.613 - 1)", "100 * (2.929 / 9.753 - 1)", "100 * (2.972 / 9.548 - 1)"],
    "| −69.0 % |": ["100 * (2.975 / 9.603 - 1)"],
    "3.27× faster": ["9.613 / 2.944"],
    "3.21–3.33×": ["9.548 / 2.972", "9.753 / 2.929"],
    "−0.1 % (1 connection) and +1.1 % (4 connections)": [
        "100 * (9.603 / 9.613 - 1)", "100 * (2.975 / 2.944 - 1)"],
    "−2.2 to +2.6 % and −0.8 to +4.2 %": [
        "100 * (9.543 / 9.753 - 1)", "100 * (9.8 / 9.548 - 1)",
        "100 * (2.947 / 2.972 - 1)", "100 * (3.053 / 2.929 - 1)"],
    "≈ 0.85": ["1 - (0.3905 - 0.3647) / (0.5536 - 0.3835)"],
    "3.1–7.2 % above": ["100 * (1.006 / 0.9761 - 1)", "100 * (0.7979 / 0.744 - 1)"],
}
REPRODUCTIONS = {"Atlas": "atlas", "CBA": "cba", "GeoPipe": "geopipe", "CrossPipe": "crosspipe"}


def _tracked_results() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True,
                             text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return out.split()


def _normal(digits: str) -> str:
    """``0.10`` and ``0.1`` alike; integers as they are."""
    if "." in digits:
        digits = digits.rstrip("0")
        digits += "0" if digits.endswith(".") else ""
    return digits


def _signed(sign: str, digits: str) -> str:
    return ("-" if sign in ("−", "-") else "") + _normal(digits)


@pytest.fixture(scope="module")
def held() -> set[str]:
    """Every number in a tracked text file under results/, signed (``-0.5``, ``0.5``)."""
    found = set()
    for name in _tracked_results():
        if Path(name).suffix in BINARY_SUFFIXES:
            continue
        text = (ROOT / name).read_text(encoding="utf-8", errors="replace")
        found.update(_signed(m[1], m[2]) for m in NUMBER.finditer(text))
    return found


def _is_held(sign: str, digits: str, found: set[str]) -> bool:
    n = _normal(digits)
    if sign in ("−", "-"):
        return "-" + n in found
    return n in found or (not sign and "-" + n in found)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _checked_pages() -> list[Path]:
    """The README and every page under docs/ that is not in ``NOT_CHECKED``."""
    pages = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)
    return [README, *(p for p in pages if p.relative_to(DOCS).as_posix() not in NOT_CHECKED)]


def _readme() -> str:
    """The checked text: every checked page, flattened, the pages kept apart."""
    return " ¶ ".join(_flat(p.read_text(encoding="utf-8")) for p in _checked_pages())


def _rounds_to(value: float, sign: str, digits: str) -> bool:
    """Does ``value`` print as the README's figure (sign included) at the figure's digits?"""
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return f"{value:.{decimals}f}" == ("-" if sign in ("−", "-") else "") + digits


def _evaluate(expression: str) -> tuple[float, list[str]]:
    """The value of an arithmetic expression over literals, and its decimal literals."""
    tree = ast.parse(expression, mode="eval")
    literals = [repr(n.value) for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, float)]
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.List, ast.Call,
               ast.Name, ast.Load, ast.operator, ast.unaryop)
    assert all(isinstance(n, allowed) for n in ast.walk(tree)), expression
    value = eval(compile(tree, "<derived>", "eval"), {"__builtins__": {}},  # noqa: S307
                 {"median": statistics.median})
    return value, literals


def _gaps(name: str, schedule: str | None = None) -> list[float]:
    """Per cell of ``results/<name>-example/results.csv``: the median over its repeats of
    predicted / measured iteration time − 1, in %."""
    per_cell = defaultdict(list)
    with (ROOT / "results" / f"{name}-example" / "results.csv").open(encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["status"] == "ok" and schedule in (None, r["schedule"]):
                per_cell[r["cell_id"]].append(
                    float(r["predicted_iteration_time_s"]) / float(r["iteration_time_s"]) - 1)
    return [100 * statistics.median(v) for v in per_cell.values()]


def _agreement() -> list[str]:
    """The simulator's agreement with the four reproductions, as the README must write it."""
    per_name = {label: _gaps(name) for label, name in REPRODUCTIONS.items()}
    everything = [g for gaps in per_name.values() for g in gaps]
    return [f"predicted the iteration time within {_range(everything)}",
            *(f"{label} {_range(gaps)}" for label, gaps in per_name.items()),
            f"1F1B's three cells are within {_range(_gaps('crosspipe', '1f1b'))}"]


def _range(values: list[float]) -> str:
    return " … ".join(f"{v:+.1f}".replace("-", "−") for v in (min(values), max(values))) + " %"


def _figures(text: str) -> list[re.Match]:
    """The numbers of ``text`` that look like measurements: a fraction or a percentage."""
    return [m for m in NUMBER.finditer(text) if "." in m[2] or m[3]]


def _remaining(text: str) -> str:
    """The README with the not-measured and derived figures taken out."""
    for snippet in [*NOT_MEASURED, *DERIVED, *_agreement()]:
        text = text.replace(_flat(snippet), " ")
    return text


def test_every_measured_figure_is_in_a_committed_result(held):
    missing = []
    for m in _figures(_remaining(_readme())):
        if not _is_held(m[1], m[2], held):
            missing.append(m.group(0).strip())
    assert not missing, f"figures no tracked file under results/ holds: {missing}"


def test_lists_name_only_readme_text_with_figures():
    text = _readme()
    stale = [s for s in [*NOT_MEASURED, *DERIVED] if _flat(s) not in text]
    assert not stale, f"listed but in neither README.md nor a checked page: {stale}"
    idle = [s for s in NOT_MEASURED if not _figures(s)]
    assert not idle, f"NOT_MEASURED entries without a figure the check would take: {idle}"


def test_derived_figures_are_right(held):
    wrong = []
    for snippet, expressions in DERIVED.items():
        figures = _figures(snippet)
        assert len(figures) == len(expressions), snippet
        for figure, expression in zip(figures, expressions):
            value, literals = _evaluate(expression)
            unheld = [x for x in literals if not _is_held("", x, held)]
            if unheld or not _rounds_to(value, figure[1], figure[2]):
                wrong.append((snippet, expression, round(value, 4), unheld))
    assert not wrong, wrong


def test_simulator_agreement_is_recomputed_from_the_reproductions():
    text = _readme()
    absent = [q for q in _agreement() if q not in text]
    assert not absent, f"no checked page says (recomputed from results.csv): {absent}"


def test_every_unchecked_page_exists_and_the_checked_ones_hold_the_readmes_old_figures():
    """The exemptions name real pages, and the pages that took the README's measured sections
    in issue 25 are among the checked ones."""
    assert all((DOCS / name).is_file() for name in NOT_CHECKED)
    checked = {p.relative_to(ROOT).as_posix() for p in _checked_pages()}
    moved = {"docs/quickstart.md", "docs/reproductions.md", "docs/simulator.md", "docs/network.md",
             "docs/workers.md", "docs/howto/schedule.md", "docs/howto/program.md",
             "docs/howto/gpus.md", "docs/howto/lab.md", "docs/reference/experiment-file.md",
             "docs/reference/results.md", "docs/tutorial.md"}
    assert moved <= checked, moved - checked


def test_transcript_is_the_committed_setup_log():
    text = QUICKSTART_PAGE.read_text(encoding="utf-8")
    start = text.index("## What the first command prints")
    block = re.search(r"```text\n(.*?)```", text[start:], re.S).group(1)
    assert block in SETUP_LOG.read_text(encoding="utf-8")


def test_benchmarks_readme_lists_every_committed_output():
    listed = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    saved = {Path(t).stem for t in _tracked_results() if t.startswith("results/benchmarks/")}
    unlisted = sorted(name for name in saved if f"`{name}`" not in listed)
    assert not unlisted, f"benchmarks/README.md's Committed list misses: {unlisted}"


def test_every_results_path_named_exists_in_git():
    """In the README and every page under docs/, checked for figures or not."""
    tracked = _tracked_results()
    pages = [README, *(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)]
    prose = "\n".join(FENCE.sub("", p.read_text(encoding="utf-8")) for p in pages)
    absent = []
    for m in RESULTS_PATH.finditer(prose):
        path = m.group(0).rstrip(".,:;/")
        if "<" in path or path == "results":
            continue
        pattern = re.compile(re.escape(path).replace(r"\*", "[^/]*") + r"(/|$)")
        if not any(pattern.match(t) for t in tracked):
            absent.append(path)
    assert not absent, f"results paths named that git does not track: {absent}"
