"""How long one message takes through a shaped inter-DC link after the link was idle, against
the simulator's two models of it: the whole message at the shaper's rate (pipeline messages
now), and the token bucket's burst passing at once (ring steps now). Two DCs of one host, a
5 ms delay line and htb at RATE; gloo ranks in the two hosts; the sender idles 100 ms, then
sends SIZE bytes; the receiver notes when the bytes are in (both clocks are this machine's
monotonic clock). Median of 15 after 3, minus the delay and calibration.MESSAGE_LATENCY_S.
Root (namespaces).

    sudo .venv/bin/python results/leads/pipeline-burst/drain.py > results/leads/pipeline-burst/drain.txt

Each rate runs in a process of its own (``--rows RATE``); drain.txt was written that way. The
rates run in one process used to fail: "interface h0 vanished while building", or a host
namespace gone while its ranks started. The cause was this script's SIGTERM handler, which
raised SystemExit. pyroute2 forks a child to enter a namespace and ends it with SIGTERM; the
child inherited the handler, unwound its copy of this script's stack, and tore down the network
being built (an inotify watch on /run/netns saw a host namespace deleted 38 ms after it was
made). The handler now lets a forked child simply die, as testbed's runner does.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from testbed.net.backends import emulated_network  # noqa: E402
from testbed.sim import calibration as C  # noqa: E402
from testbed.topology import LinkProfile, Topology  # noqa: E402

DELAY_MS = 5.0
RANK = r'''
import statistics, sys, time, torch, torch.distributed as dist
rank, addr, size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{addr}:29655", rank=rank, world_size=2)
buf, stamp, times = torch.ones(size // 4), torch.zeros(1, dtype=torch.float64), []
for k in range(18):
    dist.barrier()
    if rank == 0:
        time.sleep(0.1)
        stamp[0] = time.perf_counter()
        dist.send(stamp, 1)
        dist.send(buf, 1)
    else:
        dist.recv(stamp, 0)
        dist.recv(buf, 0)
        times.append(time.perf_counter() - stamp[0].item())
if rank == 1:
    print(statistics.median(times[3:]))
dist.destroy_process_group()
'''


def one_way_s(net, a, b, size: int) -> float:
    env = dict(os.environ, GLOO_SOCKET_IFNAME=a.iface)
    recv = subprocess.Popen(["ip", "netns", "exec", b.ns, sys.executable, "-c", RANK, "1",
                             str(a.ip), str(size)], env=env, stdout=subprocess.PIPE, text=True)
    subprocess.run(["ip", "netns", "exec", a.ns, sys.executable, "-c", RANK, "0", str(a.ip),
                    str(size)], env=env, check=True, timeout=120)
    out, _ = recv.communicate(timeout=120)
    return float(out)


def main() -> None:
    owner = os.getpid()

    def stop(*_):  # the network is torn down; a forked pyroute2 child just dies (see above)
        if os.getpid() != owner:
            os._exit(1)
        sys.exit(1)
    signal.signal(signal.SIGTERM, stop)
    if "--rows" not in sys.argv:  # one network per process (see README)
        print("| rate Mbit/s | bytes | measured ms | whole message at the rate ms | with the burst at once ms |")
        print("|---|---|---|---|---|", flush=True)
        for rate in (100, 219, 1000):
            subprocess.run([sys.executable, __file__, "--rows", str(rate)], check=True)
            time.sleep(5)  # see the docstring
        return
    for rate in [int(sys.argv[-1])]:
        topo = Topology(name="t", dcs=[{"name": "dra", "hosts": 1}, {"name": "drb", "hosts": 1}],
                        inter_dc=LinkProfile(delay_ms=DELAY_MS, rate_mbit=rate))
        with tempfile.TemporaryDirectory() as tmp, \
                emulated_network(topo, shaper="delayline", workdir=Path(tmp)) as (net, _):
            a, b = net.host("dra", 0), net.host("drb", 0)
            for size in (262_144, 1_048_576):
                measured = one_way_s(net, a, b, size) - DELAY_MS / 1e3 - C.MESSAGE_LATENCY_S
                bps = rate * 1e6
                whole = size * C.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / bps
                burst = max(0.0, size - C.shaper_burst_bytes(bps)) * C.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / bps
                print(f"| {rate} | {size} | {measured * 1e3:.2f} | {whole * 1e3:.2f} | {burst * 1e3:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
