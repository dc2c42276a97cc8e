"""Starting a cell's ranks and watching them:

- ``workers``: one worker (or the workload's program) per rank of a plan, started inside its
  host on whatever network the backend built;
- ``command``: a rank's environment, argv and working directory, built in one place for every
  backend;
- ``pool``: ranks forked from a pre-started interpreter into this machine's namespaces;
- ``interpreters``: a sweep's pre-started interpreters, the built-in worker's and programs';
- ``supervise``: waiting for a cell's processes and naming the rank that failed first;
- ``loopback``: a workload's ranks as local processes over loopback (control runs, tests,
  benchmarks).
"""
