"""``net check``, ``net down`` and ``clean`` subcommands."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.table import Table

from testbed.errors import EXIT_CELLS_FAILED, EXIT_OK, MachineError

# A link whose measured RTT is off by more than this, or whose throughput is below this share
# of the configured rate, is shown in red: worth a look before trusting results over it.
RTT_WARN_REL = 0.05
RATE_WARN_SHARE = 0.90


def add_subcommands(sub) -> None:
    net = sub.add_parser("net", help="build, measure and remove emulated networks",
                         description="Emulated networks on this machine.")
    nsub = net.add_subparsers(dest="net_command", required=True, metavar="COMMAND")
    c = nsub.add_parser("check", help="build a topology, measure every inter-DC link, tear down",
                        description="Build TOPOLOGY, measure RTT (median, p99) and TCP throughput "
                                    "of every inter-DC link, print configured vs measured.")
    c.add_argument("topology", type=Path)
    c.add_argument("--backend", default="netns", choices=["netns", "mininet"])
    c.add_argument("--shaper", default="auto", choices=["auto", "netem", "delayline"])
    c.add_argument("--keep", action="store_true",
                   help="leave the network up (remove it later with `net down TAG` or `clean`)")
    c.add_argument("--no-rate", action="store_true", help="measure RTT only (faster)")
    c.set_defaults(func=_check)
    d = nsub.add_parser("down", help="remove a network left up by `net check --keep`")
    d.add_argument("tag", help="the run tag `net check --keep` printed (tb + 6 hex digits)")
    d.set_defaults(func=_down)
    cl = sub.add_parser("clean", help="remove networks left behind by killed runs",
                        description="Remove every namespace, interface, rule and process of "
                                    "tagged networks whose owning process is gone. Touches "
                                    "nothing without a testbed run tag.")
    cl.add_argument("--include-live", action="store_true",
                    help="also remove networks whose owner is still running")
    cl.add_argument("--tag", type=_run_tag, help="only this network (tb + 6 hex digits)")
    cl.add_argument("--forget", type=_run_tag, metavar="TAG",
                    help="drop the record of a network spread over machines or lab hosts that "
                         "are gone for good, without reaching them (its owner must have ended)")
    cl.set_defaults(func=_clean)


def _forget(tag: str) -> int:
    from testbed.net.cluster.clean import spread_ledgers
    from testbed.net.lab.clean import lab_ledgers
    found = spread_ledgers(include_live=True, tag=tag) + lab_ledgers(include_live=True, tag=tag)
    if not found:
        print(f"no network {tag} spread over machines or lab hosts is recorded here",
              file=sys.stderr)
        return EXIT_CELLS_FAILED
    if found[0].owner_alive():
        print(f"{tag}: its run is still going; stop it first", file=sys.stderr)
        return EXIT_CELLS_FAILED
    found[0].remove_file()
    held = found[0].machines.get("tags", {}) or found[0].lab.get("shaped", {})
    print(f"forgot {tag}: whatever its machines still hold was not removed "
          f"({', '.join(held)})")
    return EXIT_OK


def _run_tag(text: str) -> str:
    from testbed.net.ledger import TAG_RE
    if not TAG_RE.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a run tag (tb + 6 hex digits)")
    return text


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise MachineError(f"`{what}` needs root (namespaces, tc, iptables)",
                           f"run it as root, e.g. sudo .venv/bin/python -m testbed {what} …")


def _check(args: argparse.Namespace) -> int:
    from testbed.net.backends import get_backend
    from testbed.net.linkprobe import probe_all
    from testbed.spec import load_topology

    _need_root("net check")
    topo = load_topology(args.topology)
    backend = get_backend(args.backend)
    shaper, reason = backend.shaper_choice(args.shaper)
    console = Console()
    console.print(f"shaper {shaper} ({reason}); backend {args.backend}")
    workdir = Path(tempfile.mkdtemp(prefix="testbed-net-"))
    with ExitStack() as stack:
        net, sh = backend.bring_up(topo, topo.resolved_links(), shaper, workdir, stack)
        console.print(f"network {topo.name} up: tag {net.tag}, {len(net.hosts)} hosts")
        results = probe_all(net, rate=not args.no_rate)
        console.print(_table(topo.name, results, sh.drops()))
        if args.keep:
            stack.pop_all()
            console.print(f"left up. Remove with: python -m testbed net down {net.tag}")
    return EXIT_OK


def _table(name: str, results, drops: int | None) -> Table:
    shown = "not measured by this shaper" if drops is None else drops
    t = Table(title=f"{name}: configured vs measured (emulator drops: {shown})")
    for col in ("link", "RTT conf ms", "RTT median ms", "RTT p99 ms", "error ms",
                "rate conf Mbit/s", "TCP Mbit/s", "share"):
        t.add_column(col, justify="right")
    for m in results:
        err = m.rtt_ms - m.rtt_ms_configured
        bad_rtt = abs(err) > max(0.2, RTT_WARN_REL * m.rtt_ms_configured)
        share = (m.rate_mbit / m.rate_mbit_configured
                 if m.rate_mbit and m.rate_mbit_configured else None)
        bad_rate = share is not None and share < RATE_WARN_SHARE
        t.add_row(m.link, f"{m.rtt_ms_configured:.3f}", f"{m.rtt_ms:.3f}", f"{m.rtt_ms_p99:.3f}",
                  f"[red]{err:+.3f}[/red]" if bad_rtt else f"{err:+.3f}",
                  _fmt(m.rate_mbit_configured, "unshaped"), _fmt(m.rate_mbit, "-"),
                  "-" if share is None else
                  (f"[red]{share:.1%}[/red]" if bad_rate else f"{share:.1%}"))
    return t


def _fmt(value, empty: str) -> str:
    return empty if value is None else f"{value:g}"


def _down(args: argparse.Namespace) -> int:
    from testbed.net.ledger import clean

    _need_root("net down")
    report = clean(include_live=True, tag=args.tag)
    for why in report.failed:
        print(f"could not remove: {why}", file=sys.stderr)
    if report.failed:
        return EXIT_CELLS_FAILED
    print(f"removed {args.tag}" if report.removed else f"nothing tagged {args.tag} found")
    return EXIT_OK


def _clean(args: argparse.Namespace) -> int:
    from testbed.net.cluster.clean import clean_machines, spread_ledgers
    from testbed.net.lab.clean import clean_lab, lab_ledgers
    from testbed.net.ledger import clean

    _need_root("clean")
    if args.forget:
        return _forget(args.forget)
    spread_removed, spread_failed = [], []
    for led in spread_ledgers(args.include_live, args.tag):  # networks spread over machines
        done, failed = clean_machines(led)
        spread_removed += done
        spread_failed += failed
    for led in lab_ledgers(args.include_live, args.tag):  # networks of lab hosts
        done, failed = clean_lab(led)
        spread_removed += done
        spread_failed += failed
    report = clean(include_live=args.include_live, tag=args.tag)
    report.removed[:0], report.failed[:0] = spread_removed, spread_failed
    for r in report.removed:
        print(f"removed {r}")
    for r in report.skipped_live:
        print(f"kept {r}: its run is still going (use --include-live to remove it anyway)")
    for why in report.failed:
        print(f"could not remove: {why}", file=sys.stderr)
    if not report.removed and not report.skipped_live and not report.failed:
        print("nothing to clean")
    return EXIT_CELLS_FAILED if report.failed else EXIT_OK
