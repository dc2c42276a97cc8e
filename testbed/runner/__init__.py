"""The sweep: every planned cell × repeat run in order on one backend, each row on disk
before the next cell starts.

- ``run``: the sweep (plan all, control runs, progress, resume, signals);
- ``cell``: one cell's lifecycle, from cell file to row;
- ``livenet``: the network kept across cells of one topology, and its link probes;
- ``control``: a program's control run over loopback, before any network exists;
- ``tracewatch``: how far a running cell has got (rank 0's growing trace);
- ``store``: the run directory (results.csv written atomically).
"""
