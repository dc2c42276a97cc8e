#!/bin/bash
# Times four reverse lookups of a peer's address (what torch's rendezvous does for each client
# socket) from a host of a two-DC emulated network, GAP seconds apart.
#   lookups.sh GAP old   the host given a default route via its router (as before 4c665a3)
#   lookups.sh GAP new   the host as testbed builds it now (routes to the other DCs only)
# Run as root from the repository root.
set -e
gap=${1:-0.2}; mode=${2:-old}
out=$(.venv/bin/python -m testbed net check results/leads/dns-default-route/two-dc.yaml --keep --no-rate 2>&1 | tail -1)
tag=$(echo "$out" | grep -o 'tb[0-9a-f]\{6\}')
ns=$tag-dnsa-0
[ "$mode" = old ] && ip netns exec $ns ip route add default via 10.1.0.1
for i in 1 2 3 4; do
  /usr/bin/time -f "lookup $i: %e s" ip netns exec $ns /usr/bin/python3 -c "import socket
try: socket.getnameinfo(('10.2.0.10', 1), 0)
except OSError as e: print(e)"
  sleep "$gap"
done
.venv/bin/python -m testbed net down $tag | tail -1
