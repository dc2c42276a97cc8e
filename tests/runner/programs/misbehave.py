"""A torchrun-compatible test program that misbehaves on purpose (argv[1] = mode; argv[2] = a
marker that every process it starts carries, so the test can find leftovers):

- exit: rank 2 exits with status 3 after joining;
- hang: rank 1 starts a child process and both sleep forever after joining;
- nojoin: rank 1 never joins the process group;
- marked: four 50 ms iterations, each reported with testbed's one-line call;
- printed: four 50 ms iterations, rank 0 prints each one's time (for iteration_regex);
- plain: four 50 ms iterations, reported nowhere;
- exithang: four marked iterations, then rank 1 hangs at exit (a thread that never ends);
- exitcrash: four marked iterations, then rank 2 exits with status 4.
"""
import datetime
import os
import subprocess
import sys
import threading
import time

import torch.distributed as dist

mode, marker = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
if mode == "nojoin" and rank == 1:
    time.sleep(3600)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3600))
if mode == "exit" and rank == 2:
    sys.exit(3)
if mode == "hang" and rank == 1:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", marker])
    time.sleep(3600)
for it in range(4):
    dist.barrier()
    t0 = time.monotonic()
    time.sleep(0.05)
    dist.barrier()
    if mode in ("marked", "exithang", "exitcrash"):
        from testbed.train.instrument import iteration; iteration()  # noqa: E702
    if rank == 0 and mode == "printed":
        print(f"iteration {it} took {(time.monotonic() - t0) * 1000:.3f} ms", flush=True)
dist.destroy_process_group()
if mode == "exithang" and rank == 1:
    threading.Thread(target=time.sleep, args=(3600,)).start()  # non-daemon: exit waits for it
if mode == "exitcrash" and rank == 2:
    sys.exit(4)
