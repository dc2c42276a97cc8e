"""Row → summary: what a run directory's results.csv (and its cells' iterations.csv) become
for a reader, rebuilt at any time (``python -m testbed report RUN_DIR``).

- ``report``: summary.md and plots/;
- ``tables``: the per-cell and per-axis tables; ``spread``: medians with their 95 % interval;
- ``sections``: summary.md's phase, delay-induced bubble and fidelity sections;
- ``phaseplot``: iteration time over a cell's run, with its link steps;
- ``console``: the end-of-run tables at the console's width.
"""
