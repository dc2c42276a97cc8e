"""How long one message takes through a shaped inter-DC link after the link was idle, against
the simulator's two models of it: the whole message at the shaper's rate (pipeline messages
now), and the token bucket's burst passing at once (ring steps now). Two DCs of one host, a
5 ms delay line and htb at RATE; gloo ranks in the two hosts; the sender idles 100 ms, then
sends SIZE bytes; the receiver notes when the bytes are in (both clocks are this machine's
monotonic clock). Median of 15 after 3, minus the delay and calibration.MESSAGE_LATENCY_S.
Root (namespaces).

    sudo .venv/bin/python results/leads/pipeline-burst/drain.py > results/leads/pipeline-burst/drain.txt
    sudo .venv/bin/python results/leads/pipeline-burst/drain.py --posted > results/leads/pipeline-burst/drain-posted.txt

Without ``--posted`` (drain.txt) the sender first sends an 8-byte stamp and then the message,
and the receiver posts the message's receive only once the stamp is in. gloo sends a message's
bytes only after the receiver's receive-ready notification has come back, so those times hold
one more round trip (10 ms) than a pipeline message whose receive was posted long before. With
``--posted`` (drain-posted.txt) the receiver posts the message's receive before the barrier
that precedes the sender's idle time, as a pipeline stage does, and the stamp follows the
message.

drain.txt was written with one rate per process (an earlier version's ``--rows RATE``). The
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from testbed.net.backends import emulated_network  # noqa: E402
from testbed.sim import calibration as C  # noqa: E402
from testbed.topology import LinkProfile, Topology  # noqa: E402

DELAY_MS = 5.0
RANK = r'''
import statistics, sys, time, torch, torch.distributed as dist
rank, addr, size, posted = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{addr}:29655", rank=rank, world_size=2)
buf, stamp, times = torch.ones(size // 4), torch.zeros(1, dtype=torch.float64), []
for k in range(18):
    req = dist.irecv(buf, 0) if posted and rank == 1 else None
    dist.barrier()
    if rank == 0:
        time.sleep(0.1)
        t0 = time.perf_counter()
        if posted:
            dist.send(buf, 1)
            stamp[0] = t0
            dist.send(stamp, 1)
        else:
            stamp[0] = t0
            dist.send(stamp, 1)
            dist.send(buf, 1)
    elif posted:
        req.wait()
        t1 = time.perf_counter()
        dist.recv(stamp, 0)
        times.append(t1 - stamp[0].item())
    else:
        dist.recv(stamp, 0)
        dist.recv(buf, 0)
        times.append(time.perf_counter() - stamp[0].item())
if rank == 1:
    print(statistics.median(times[3:]))
dist.destroy_process_group()
'''


def one_way_s(net, a, b, size: int, posted: bool) -> float:
    env = dict(os.environ, GLOO_SOCKET_IFNAME=a.iface)
    args = [str(a.ip), str(size), "1" if posted else "0"]
    recv = subprocess.Popen(["ip", "netns", "exec", b.ns, sys.executable, "-c", RANK, "1", *args],
                            env=env, stdout=subprocess.PIPE, text=True)
    subprocess.run(["ip", "netns", "exec", a.ns, sys.executable, "-c", RANK, "0", *args],
                   env=env, check=True, timeout=120)
    out, _ = recv.communicate(timeout=120)
    return float(out)


def main() -> None:
    owner = os.getpid()

    def stop(*_):  # the network is torn down; a forked pyroute2 child just dies (see above)
        if os.getpid() != owner:
            os._exit(1)
        sys.exit(1)
    signal.signal(signal.SIGTERM, stop)
    posted = "--posted" in sys.argv
    how = ("receive posted before the idle time" if posted
           else "receive posted when an 8-byte stamp sent just before arrives")
    print(f"# One message through a shaped link after 100 ms idle ({how}; written by drain.py"
          f"{' --posted' if posted else ''})\n")
    print("| rate Mbit/s | bytes | measured ms | whole message at the rate ms | with the burst at once ms |")
    print("|---|---|---|---|---|", flush=True)
    for rate in (100, 219, 1000):
        topo = Topology(name="t", dcs=[{"name": "dra", "hosts": 1}, {"name": "drb", "hosts": 1}],
                        inter_dc=LinkProfile(delay_ms=DELAY_MS, rate_mbit=rate))
        with tempfile.TemporaryDirectory() as tmp, \
                emulated_network(topo, shaper="delayline", workdir=Path(tmp)) as (net, _):
            a, b = net.host("dra", 0), net.host("drb", 0)
            for size in (262_144, 1_048_576):
                measured = (one_way_s(net, a, b, size, posted) - DELAY_MS / 1e3
                            - C.MESSAGE_LATENCY_S)
                bps = rate * 1e6
                whole = size * C.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / bps
                burst = (max(0.0, size - C.shaper_burst_bytes(bps))
                         * C.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / bps)
                print(f"| {rate} | {size} | {measured * 1e3:.2f} | {whole * 1e3:.2f} | "
                      f"{burst * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
