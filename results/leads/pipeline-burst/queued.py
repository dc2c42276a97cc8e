"""Activations that queue on a shaped link: the sender sends COUNT messages of SIZE bytes,
GAP_MS apart (as ZB-V's rank 1 sends its first forwards), to a receiver whose receives were all
posted before the first left; the receiver notes when each is in. Both clocks are this
machine's monotonic clock. Printed: each message's arrival after the first one's, median over
REPEATS rounds after one, against the simulator's FIFO with the burst (back to back at the
rate after the first: (k) × the message's time at the rate). Two DCs of one host, delay line,
DELAY_MS one way, RATE_MBIT, the queue the experiment would get by default (one BDP) unless
``--queue BYTES``. Root (namespaces).

    sudo .venv/bin/python results/leads/pipeline-burst/queued.py > results/leads/pipeline-burst/queued.txt
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from testbed.net.backends import emulated_network  # noqa: E402
from testbed.sim import calibration as C  # noqa: E402
from testbed.topology import LinkProfile, Topology  # noqa: E402

DELAY_MS, RATE_MBIT, SIZE, COUNT, GAP_MS, REPEATS = 40.0, 219, 1_048_576, 5, 10.5, 8
RANK = r'''
import json, sys, time, torch, torch.distributed as dist
rank, addr, size, count, gap, repeats = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
                                         int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]))
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{addr}:29656", rank=rank, world_size=2)
bufs = [torch.ones(size // 4) for _ in range(count)]
stamp, rounds = torch.zeros(count, dtype=torch.float64), []
for k in range(repeats + 1):
    reqs = [dist.irecv(b, 0) for b in bufs] if rank == 1 else None
    dist.barrier()
    if rank == 0:
        time.sleep(0.2)  # the receive-ready notices are back; the link is idle
        sends = []
        for i, b in enumerate(bufs):
            stamp[i] = time.perf_counter()
            sends.append(dist.isend(b, 1))
            time.sleep(gap / 1e3)
        for s in sends:
            s.wait()
        dist.send(stamp, 1)
    else:
        got = []
        for r in reqs:
            r.wait()
            got.append(time.perf_counter())
        dist.recv(stamp, 0)
        rounds.append([(g - stamp[0].item()) * 1e3 for g in got])
if rank == 1:
    print(json.dumps(rounds[1:]))
dist.destroy_process_group()
'''


def arrivals(net, a, b) -> list[list[float]]:
    env = dict(os.environ, GLOO_SOCKET_IFNAME=a.iface)
    args = [str(a.ip), str(SIZE), str(COUNT), str(GAP_MS), str(REPEATS)]
    recv = subprocess.Popen(["ip", "netns", "exec", b.ns, sys.executable, "-c", RANK, "1", *args],
                            env=env, stdout=subprocess.PIPE, text=True)
    subprocess.run(["ip", "netns", "exec", a.ns, sys.executable, "-c", RANK, "0", *args],
                   env=env, check=True, timeout=300)
    out, _ = recv.communicate(timeout=300)
    return json.loads(out)


def main() -> None:
    owner = os.getpid()

    def stop(*_):  # a forked pyroute2 child just dies (see drain.py)
        if os.getpid() != owner:
            os._exit(1)
        sys.exit(1)
    signal.signal(signal.SIGTERM, stop)
    queue = int(sys.argv[sys.argv.index("--queue") + 1]) if "--queue" in sys.argv else None
    profile = LinkProfile(delay_ms=DELAY_MS, rate_mbit=RATE_MBIT,
                          **({"queue": {"bytes": queue}} if queue else {}))
    topo = Topology(name="q", dcs=[{"name": "qua", "hosts": 1}, {"name": "qub", "hosts": 1}],
                    inter_dc=profile)
    with tempfile.TemporaryDirectory() as tmp, \
            emulated_network(topo, shaper="delayline", workdir=Path(tmp)) as (net, _):
        rounds = arrivals(net, net.host("qua", 0), net.host("qub", 0))
    bps = RATE_MBIT * 1e6
    at_rate = SIZE * C.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / bps * 1e3
    first = DELAY_MS + C.MESSAGE_LATENCY_S * 1e3 + at_rate - (
        C.shaper_burst_bytes(bps) * C.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / bps * 1e3)
    print(f"# {COUNT} messages of {SIZE} bytes sent {GAP_MS} ms apart over {DELAY_MS:g} ms, "
          f"{RATE_MBIT} Mbit/s, queue {profile.queue_limit_bytes()} bytes (written by queued.py"
          f"{f' --queue {queue}' if queue else ''}); median of {REPEATS} rounds\n")
    print("| message | arrived ms after the first was sent | FIFO with the burst ms | "
          "spacing ms | FIFO spacing ms |")
    print("|---|---|---|---|---|")
    med = [statistics.median(r[i] for r in rounds) for i in range(COUNT)]
    for i, m in enumerate(med):
        model = first + i * at_rate
        spacing = "" if i == 0 else f"{m - med[i - 1]:.2f}"
        print(f"| {i} | {m:.2f} | {model:.2f} | {spacing} | {'' if i == 0 else f'{at_rate:.2f}'} |")


if __name__ == "__main__":
    main()
