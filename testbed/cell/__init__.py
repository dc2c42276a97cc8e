"""One cell's files, the contract between the controller and every rank:

- ``cellfile``: the typed cell file (``cell.json``: workload, placement, planned schedule) the
  runner writes and every worker reads;
- ``celldir``: every path inside a cell directory (one owner for the layout).
"""
