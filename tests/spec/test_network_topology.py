"""The topology the runner builds, without building anything."""
from __future__ import annotations

import textwrap

from testbed.spec import load_experiment


def test_links_intra_dc_is_laid_over_every_dcs_host_links(tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text(textwrap.dedent("""
        name: e
        topology:
          name: t
          dcs: [{name: dca, hosts: 2, intra: {rate_mbit: 5000, loss_pct: 0.1}},
                {name: dcb, hosts: 2}]
        links: {intra_dc: {rate_mbit: 2000}}
    """))
    (cell,) = load_experiment(f).cells
    topo = cell.experiment.network_topology()
    assert topo.dc("dca").intra.rate_mbit == 2000 and topo.dc("dca").intra.loss_pct == 0.1
    assert topo.dc("dcb").intra.rate_mbit == 2000
    assert cell.experiment.topology.dc("dca").intra.rate_mbit == 5000  # not mutated
