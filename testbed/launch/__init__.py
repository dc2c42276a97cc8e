"""The launch contract: what a rank is given and where its files are.

- ``cellfile``: the typed cell file (workload, placement, planned schedule) the runner writes
  and every worker reads;
- ``celldir``: every path inside a cell directory (one owner for the layout);
- ``command``: a worker's environment and argv, built in one place for every backend;
- ``supervise``: waiting for a cell's processes and naming the rank that failed first;
- ``loopback``: a workload's ranks as local processes over loopback (tests, benchmarks).
"""
