"""Real lab hosts over SSH (``backend: remote``).

- ``inventory``: the Ansible INI inventory (one group per DC) as typed hosts;
- ``ssh``: fabric connections that verify host keys against known_hosts, argv → quoted command
  lines, per-host results gathered in parallel into one error;
- ``lab``: a connected lab: reachability and version checks, clock offsets, NTP state;
- ``shaping``: tc on each host's NIC (htb class per destination DC, netem or bfifo leaf, u32
  filters by destination subnet), read back and removed again;
- ``process``: a worker started over SSH, a ``testbed.process.ProcessHandle`` like any other.
"""
