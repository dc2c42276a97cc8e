"""Real lab hosts over SSH: what the ``remote`` backend (``testbed.net.backends.remote``)
builds its networks from.

- ``inventory``: the Ansible INI inventory (one group per DC) as typed hosts;
- ``ssh``: fabric connections that verify host keys against known_hosts, argv → quoted command
  lines, per-host results gathered in parallel into one error;
- ``lab``: a connected lab: reachability and version checks, clock offsets, NTP state;
- ``clocks``: each host's clock offset from the controller's;
- ``network``: a built network whose nodes are lab hosts (commands, files and processes over
  SSH; traces moved onto the controller's clock);
- ``nic``: a host NIC's tc as data (htb class per destination DC, netem or bfifo leaf, u32
  filters by destination subnet) and what its read-back must show;
- ``shaping``: that tc applied on every host over SSH, read back and removed again;
- ``process``: a worker started over SSH, a ``testbed.process.ProcessHandle`` like any other.
"""
