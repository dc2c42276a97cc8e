"""GPU time-slicing between processes: a tiny kernel's launch-to-done time in this process,
alone, then while another process keeps the GPU busy with long kernels (started first)."""
import statistics, subprocess, sys, time
import torch
if len(sys.argv) > 1:  # the busy process
    torch.cuda.set_device(0); end = time.time() + float(sys.argv[1]); first = True
    while time.time() < end:
        torch.cuda._sleep(50_000_000)
        if first:
            print("busy", flush=True); first = False
        torch.cuda.synchronize()
    sys.exit()
torch.cuda.set_device(0); x = torch.zeros(1, device="cuda")
def lat(n=100):
    out = []
    for _ in range(n):
        t0 = time.perf_counter(); x.add_(1); torch.cuda.synchronize(); out.append(time.perf_counter() - t0)
    q = statistics.quantiles(out, n=10)
    return 1e3 * min(out), 1e3 * statistics.median(out), 1e3 * q[-1], 1e3 * max(out)
lat(20)
print("alone min/median/p90/max ms %.4f %.4f %.4f %.4f" % lat(), flush=True)
p = subprocess.Popen([sys.executable, __file__, "6"], stdout=subprocess.PIPE, text=True)
print("child says", p.stdout.readline().strip(), flush=True)
t0 = time.time()
print("beside a busy process min/median/p90/max ms %.4f %.4f %.4f %.4f" % lat(), "in %.2f s" % (time.time() - t0), flush=True)
p.wait()
