"""Matrix expansion: cartesian product, zip groups, exclude rules and stable cell ids."""
from __future__ import annotations

import textwrap
from pathlib import Path

from testbed.spec import load_experiment

HEAD = "name: m\ntopology: topologies/two-dc.yaml\n"


def _load(tmp_path: Path, body: str):
    f = tmp_path / "exp.yaml"
    f.write_text(HEAD + textwrap.dedent(body), encoding="utf-8")
    return load_experiment(f)


def test_axes_expand_to_their_cartesian_product(tmp_path):
    le = _load(tmp_path, """
        matrix:
          links.inter_dc.delay_ms: [0, 10, 40]
          workload.schedule: [gpipe, 1f1b]
    """)
    assert [c.params for c in le.cells][:2] == [
        {"links.inter_dc.delay_ms": 0, "workload.schedule": "gpipe"},
        {"links.inter_dc.delay_ms": 0, "workload.schedule": "1f1b"}]
    assert len(le.cells) == 6
    assert le.cells[5].experiment.links.inter_dc.delay_ms == 40
    assert le.cells[5].experiment.workload.schedule == "1f1b"


def test_zip_group_varies_together(tmp_path):
    le = _load(tmp_path, """
        matrix:
          workload.schedule: [gpipe, 1f1b]
          zip:
            - workload.microbatches: [4, 8]
              links.inter_dc.delay_ms: [5, 50]
    """)
    pairs = {(c.experiment.workload.microbatches, c.experiment.links.inter_dc.delay_ms)
             for c in le.cells}
    assert pairs == {(4, 5), (8, 50)}
    assert len(le.cells) == 4


def test_exclude_drops_matching_cells(tmp_path):
    le = _load(tmp_path, """
        matrix:
          links.inter_dc.delay_ms: [0, 40]
          workload.schedule: [gpipe, 1f1b]
          exclude:
            - {workload.schedule: gpipe, links.inter_dc.delay_ms: 40}
    """)
    assert len(le.cells) == 3
    assert {"workload.schedule": "gpipe", "links.inter_dc.delay_ms": 40} not in \
        [c.params for c in le.cells]


def test_cell_ids_are_stable_and_depend_only_on_settings(tmp_path):
    body = """
        matrix:
          links.inter_dc.delay_ms: [0, 10]
    """
    first = [c.cell_id for c in _load(tmp_path, body).cells]
    again = [c.cell_id for c in _load(tmp_path, body).cells]
    assert first == again and len(set(first)) == 2
    reordered = [c.cell_id for c in _load(tmp_path, """
        matrix:
          links.inter_dc.delay_ms: [10, 0]
    """).cells]
    assert reordered == first[::-1]


def test_no_matrix_gives_one_cell(tmp_path):
    le = _load(tmp_path, "workload: {schedule: gpipe}\n")
    assert len(le.cells) == 1 and le.cells[0].params == {}


def test_link_overrides_merge_over_topology(tmp_path):
    le = _load(tmp_path, "links: {inter_dc: {delay_ms: 25}}\n")
    (link,) = le.experiment.topology.resolved_links(le.experiment.links.inter_dc)
    assert link.a_to_b.delay_ms == 25
    assert link.a_to_b.rate_mbit == 1000  # from the topology file, untouched


def test_published_quickstart_cell_ids_do_not_change():
    # docs/quickstart.md and results/quickstart-example quote these ids, and `run --resume` matches
    # finished cells by id: a new field with a default must not change them.
    root = Path(__file__).resolve().parents[2]
    le = load_experiment(root / "experiments" / "quickstart.yaml")
    assert [c.cell_id for c in le.cells] == ["c53e09ed1", "cc59eb88a", "cfe65ad40",
                                             "c1f8747b1", "cf5473625", "c3dfa41f0"]
