"""The experiment runner: cell lifecycle, results store, progress, resume, report."""
