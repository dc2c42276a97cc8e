"""Traces → row: what a finished cell's files say, as the columns of its results row. Nothing
here starts a process or writes a file (the runner keeps what comes back).

- ``traces``: metrics from per-rank traces (iteration time, bubble, throughput, exposed
  communication, filler), the definitions every measured column uses;
- ``series``: the built-in worker's metrics with the per-iteration series (iterations.csv) and
  the phased prediction of a cell with steps;
- ``program``: a user's program's metrics and how they were obtained (``metrics_source``);
- ``control``: what a program's control run says about its cells;
- ``cpu``, ``fidelity``: the box's CPU over the workers' phase, and the cell's self-fidelity;
- ``columns``: the results row's columns, the one owner of their names and order;
- ``perfetto``: a cell's traces as one Perfetto timeline (trace.json).
"""
