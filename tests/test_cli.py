"""The CLI: help everywhere, plan shows stable ids, schema is JSON, probe tells the truth."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.__main__ import main
from testbed.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"


def _subcommands() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(sub.choices)


@pytest.mark.parametrize("command", _subcommands())
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_plan_lists_cells_with_their_ids(capsys):
    from testbed.spec import load_experiment

    assert main(["plan", str(QUICKSTART)]) == 0
    out = capsys.readouterr().out
    for cell in load_experiment(QUICKSTART).cells:
        assert cell.cell_id in out
    assert "6 cells" in out


def test_schema_prints_json_schema(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "workload" in schema["properties"]


def test_missing_file_is_bad_input_not_a_traceback():
    r = subprocess.run([sys.executable, "-m", "testbed", "validate", "nope.yaml"],
                       capture_output=True, text=True, check=False, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "nope.yaml" in r.stderr


def _kernel_has_netem() -> bool:
    """Independent of testbed.probe: try a netem qdisc in a throwaway namespace."""
    ns = "tbt-netemcheck"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        r = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root",
                            "netem", "delay", "1ms"], capture_output=True, check=False)
        return r.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


@pytest.mark.root
def test_probe_reports_netem_as_the_kernel_has_it_and_leaves_no_namespace(netns_list):
    from testbed.probe import probe

    report = probe()
    assert not [ns for ns in netns_list() if ns.startswith("tbprobe")]
    has_netem = _kernel_has_netem()
    assert report.ok("qdisc netem") == has_netem
    assert report.shaper == ("netem" if has_netem else "delayline")
    assert report.ok("iptables NFQUEUE") and report.ok("qdisc htb")
    assert report.exit_code == 0


def test_report_on_a_directory_that_is_not_a_run_is_bad_input(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_every_documented_command_is_offered():
    assert {"validate", "plan", "schema", "probe", "run", "report", "simulate", "net",
            "clean"} <= set(_subcommands())
