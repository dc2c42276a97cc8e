"""gloo exchange time of two ranks (each an isend and an irecv of SIZE bytes at once; the
median of 35 after 5): over loopback in the root namespace, over loopback inside one emulated
host, and between two hosts of one emulated DC (veth, bridge, veth), beside the simulator's
unshaped model (SIZE / 1.5 GB/s + 323 µs). Root (namespaces).

    sudo .venv/bin/python results/leads/intra-dc-exchange/exchange.py > results/leads/intra-dc-exchange/exchange.txt
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

RANK_CODE = r'''
import os, sys, time, statistics, torch, torch.distributed as dist
rank, addr, port, size = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2)
out, inp = torch.ones(size // 4), torch.zeros(size // 4)
times = []
for k in range(40):
    dist.barrier()
    t = time.perf_counter()
    s = dist.isend(out, 1 - rank); r = dist.irecv(inp, 1 - rank)
    s.wait(); r.wait()
    times.append(time.perf_counter() - t)
if rank == 0:
    print(f"{statistics.median(times[5:])*1e3:.3f}")
dist.destroy_process_group()
'''

def run(ns0, ns1, addr, size, port, iface):
    py = sys.executable
    env = dict(os.environ, GLOO_SOCKET_IFNAME=iface)
    pre = lambda ns: (["ip", "netns", "exec", ns] if ns else [])
    p1 = subprocess.Popen(pre(ns1) + [py, "-c", RANK_CODE, "1", addr, str(port), str(size)], env=env)
    p0 = subprocess.run(pre(ns0) + [py, "-c", RANK_CODE, "0", addr, str(port), str(size)],
                        capture_output=True, text=True, env=env, timeout=60)
    p1.wait(timeout=60)
    return float(p0.stdout.strip())

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from testbed.net.backends.netns import NetnsBackend
from testbed.net.ledger import Ledger, new_tag
from testbed.topology import Topology
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the network is torn down below
topo = Topology(name="t", dcs=[{"name": "vga", "hosts": 2}, {"name": "vgb", "hosts": 1}])
net = NetnsBackend().build(topo, topo.resolved_links(), Ledger(new_tag()))
try:
    h0, h1 = net.host("vga", 0), net.host("vga", 1)
    print("hosts", h0.name, h1.name, h0.ip, h1.ip)
    for size in (1_260_000, 4 << 20):
        lo = run(None, None, "127.0.0.1", size, 29611, "lo")
        ve = run(h0.ns, h1.ns, str(h0.ip), size, 29612, h0.iface)
        lo2 = run(h0.ns, h0.ns, "127.0.0.1", size, 29613, "lo")
        model = (size / 1.5e9 + 323e-6) * 1e3
        print(f"{size} B exchange: loopback {lo:.3f} ms, loopback in host ns {lo2:.3f} ms, veth between hosts {ve:.3f} ms, model {model:.3f} ms")
finally:
    net.teardown()
