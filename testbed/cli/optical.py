"""``optical sweep|blocking|validate|schema``: many jobs on a dynamic optical network (CBA),
simulated (no root, no network)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from testbed.errors import EXIT_OK, Problem, SpecError, writing


def add_subcommands(sub) -> None:
    """Register ``optical`` and its subcommands."""
    p = sub.add_parser("optical", help="PP jobs on a dynamic optical network: spectrum, "
                                       "blocking, policies (simulated)",
                       description="Simulate pipeline-parallel jobs whose cross-DC transfers "
                                   "are lightpaths on an elastic optical network "
                                   "(docs/optical.md). No root needed.")
    osub = p.add_subparsers(dest="optical_command", required=True, metavar="SUBCOMMAND")
    s = osub.add_parser("sweep", help="every policy × load × schedule × microbatches cell: "
                                      "results.csv, plot.png, comparison.md")
    s.add_argument("experiment", type=Path)
    s.add_argument("--out", type=Path, metavar="DIR",
                   help="output directory (default: results/optical/<name>)")
    s.add_argument("--quiet", action="store_true", help="no progress lines")
    s.set_defaults(func=_sweep)
    b = osub.add_parser("blocking", help="offer a file's requests to its network; print "
                                         "blocking")
    b.add_argument("file", type=Path)
    b.add_argument("--csv", type=Path, metavar="FILE", help="one row per request: blocked?")
    b.set_defaults(func=_blocking)
    v = osub.add_parser("validate", help="check an optical experiment file")
    v.add_argument("experiment", type=Path)
    v.set_defaults(func=_validate)
    sc = osub.add_parser("schema", help="print the JSON Schema of optical files")
    sc.add_argument("--kind", choices=("experiment", "blocking", "network"),
                    default="experiment")
    sc.set_defaults(func=_schema)


def _progress(i: int, n: int, row: dict) -> None:
    print(f"[{i}/{n}] {row['policy']} load={row['load']:g} {row['schedule']} "
          f"m={row['microbatches']}: {row['iteration_time_s']:.3f} s/iter, bubble "
          f"{row['bubble_ratio']:.3f}, job blocking {row['blocking_job']:.3f}, all "
          f"{row['blocking_all']:.3f} ({row['wall_s']:.1f} s)", file=sys.stderr, flush=True)


def _sweep(args: argparse.Namespace) -> int:
    from testbed.optical.load import load_optical
    from testbed.optical.report import comparison_md, plot, plot_load, write_csv
    from testbed.optical.sweep import cells, run_sweep

    lo = load_optical(args.experiment)
    out = args.out or Path("results") / "optical" / lo.exp.name
    if out.exists() and not out.is_dir():
        raise SpecError([Problem(str(out), 0, 0, "--out", "exists and is not a directory")])
    with writing(out, "create"):
        out.mkdir(parents=True, exist_ok=True)
    n = len(cells(lo))
    print(f"{n} cells; stages on DCs: {', '.join(lo.stage_dcs)}", file=sys.stderr)
    done: list[dict] = []

    def each_cell(i: int, n_cells: int, row: dict) -> None:
        done.append(row)
        write_csv(done, out / "results.csv")  # a long sweep stopped keeps its finished rows
        if not args.quiet:
            _progress(i, n_cells, row)

    rows = run_sweep(lo, each_cell)
    plot(rows, out / "plot.png")
    several_loads = len({r["load"] for r in rows}) > 1
    if several_loads:
        plot_load(rows, out / "plot-load.png")
    with writing(out / "comparison.md"):
        (out / "comparison.md").write_text(comparison_md(rows), encoding="utf-8")
    with writing(out / "setup.json"):
        (out / "setup.json").write_text(json.dumps(
            {"stage_dcs": lo.stage_dcs, "dc_nodes": lo.net.dcs,
             "experiment": lo.exp.model_dump(mode="json")}, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}/: results.csv, plot.png, comparison.md, setup.json"
          + (", plot-load.png" if several_loads else ""))
    return EXIT_OK


def _blocking(args: argparse.Namespace) -> int:
    from testbed.optical.blocking import run_blocking
    from testbed.optical.load import load_blocking

    run, net = load_blocking(args.file)
    res = run_blocking(run, net, args.file.parent)
    print(f"offered {res.offered}, blocked {res.blocked}, blocking probability "
          f"{res.probability:.6f} ({res.wall_s:.2f} s)")
    if args.csv:
        with writing(args.csv):
            args.csv.write_text("request,blocked\n" + "".join(
                f"{i},{int(b)}\n" for i, b in enumerate(res.outcomes)), encoding="utf-8")
    return EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    from testbed.optical.load import load_optical
    from testbed.optical.sweep import cells

    lo = load_optical(args.experiment)
    print(f"{args.experiment}: ok, {len(cells(lo))} cells; stages on DCs: "
          f"{', '.join(lo.stage_dcs)}")
    return EXIT_OK


def _schema(args: argparse.Namespace) -> int:
    from testbed.optical.schema import optical_schema

    print(json.dumps(optical_schema(args.kind), indent=2))
    return EXIT_OK
