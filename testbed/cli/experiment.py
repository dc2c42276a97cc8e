"""``validate``, ``plan``, ``schema`` and ``probe``: the commands that build nothing."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from testbed.errors import EXIT_BAD_INPUT, EXIT_OK, SpecError, writing
from testbed.plan import CellPlan, capacity_problems, plan_all
from testbed.probe import print_report, probe
from testbed.spec import LoadedExperiment, json_schema, load_experiment


def add_subcommands(sub) -> None:
    """Register ``validate``, ``plan``, ``probe`` and ``schema``."""
    _add(sub, "validate", "check an experiment file (no root needed); exit 2 on problems",
         _validate).add_argument("experiment", type=Path, nargs="+")
    _add(sub, "plan", "plan every cell of an experiment file: ids, placement, prediction",
         _plan).add_argument("experiment", type=Path)
    _add(sub, "probe", "report what this machine can do and what 'auto' would pick", _probe)
    sp = _add(sub, "schema", "print the JSON Schema of the experiment file", _schema)
    sp.add_argument("--output", "-o", type=Path, help="write to this file instead of stdout")


def _add(sub, name: str, help_text: str, func) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.set_defaults(func=func)
    return p


def _validate(args: argparse.Namespace) -> int:
    failed: list[SpecError] = []
    for path in args.experiment:
        try:
            le = load_experiment(path)
            problems = capacity_problems(le)
            if problems:
                raise SpecError(problems)
            print(f"{path}: ok ({len(le.cells)} cells × {le.experiment.repeat} repeats)")
        except SpecError as e:
            failed.append(e)
            print(str(e), file=sys.stderr)
    if failed:
        n = sum(len(e.problems) for e in failed)
        print(f"{n} problem{'s' if n != 1 else ''} found", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    le = load_experiment(args.experiment)
    print_plan(le, plan_all(le), Console(width=None if sys.stdout.isatty() else 160))
    return EXIT_OK


def print_plan(le: LoadedExperiment, plans: list[CellPlan], console: Console) -> None:
    """Print the planned cells of a loaded experiment as a table: parameters, where each
    stage runs and the simulator's prediction."""
    exp = le.experiment
    axes = list(le.cells[0].params) if le.cells else []
    table = Table(title=f"{exp.name}: {len(plans)} cells × {exp.repeat} repeats "
                        f"(backend {exp.backend}, shaper {exp.shaper}, topology {exp.topology.name})")
    for name in ["#", "cell id", *(a.rsplit(".", 1)[-1] for a in axes), "stage DCs",
                 "pred iter s", "pred bubble"]:
        table.add_column(name, justify="right" if name.startswith(("#", "pred")) else "left",
                         no_wrap=True)
    for p in plans:
        pred = p.prediction
        table.add_row(str(p.cell.index), p.cell.cell_id, *(str(p.cell.params[a]) for a in axes),
                      _placed(p.grid), _num(pred.get("predicted_iteration_time_s")),
                      _num(pred.get("predicted_bubble_ratio")))
    console.print(table)
    if exp.cluster is not None:
        from testbed.net.backends.cluster import ClusterBackend
        backend = ClusterBackend.for_experiment(exp, le.path.parent)
        console.print("machines (DCs packed by cores, memory and GPUs):")
        for line in backend.planned(exp.network_topology()):
            console.print(f"  {line}")


def _placed(grid: list[list[str]]) -> str:
    """The DC of each stage; per replica (``|`` between them) when replicas differ."""
    rows = [_runs(row) for row in grid]
    return rows[0] if len(set(rows)) == 1 else " | ".join(rows)


def _runs(names: list[str]) -> str:
    """``a a b`` as ``a×2 b``: the DC of each stage, consecutive repeats counted."""
    out: list[list] = []
    for n in names:
        if out and out[-1][0] == n:
            out[-1][1] += 1
        else:
            out.append([n, 1])
    return " ".join(n if k == 1 else f"{n}×{k}" for n, k in out)


def _num(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def _probe(args: argparse.Namespace) -> int:
    report = probe()
    print_report(report, Console())
    return report.exit_code


def _schema(args: argparse.Namespace) -> int:
    text = json.dumps(json_schema(), indent=2)
    if args.output:
        with writing(args.output):
            args.output.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return EXIT_OK
