"""The end-of-run tables on the console: per cell and per axis value, medians with their 95 %
interval (from ``testbed.report.report``'s ``results_table`` and ``axis_tables``), every number
whole at the console's width."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

# one column's frame in a rich table: a space of padding each side and a rule
_FRAME = 3
# end-table headers: short names for the metrics (the rest: the last part of a dotted name)
_TITLES = {"n": "iters", "iteration_time_s": "iter s", "iteration_time_s_ci": "95% CI",
           "bubble_ratio": "bubble", "bubble_ratio_ci": "95% CI",
           "throughput_tokens_s": "tokens/s", "exposed_comm_s": "comm wait s",
           "predicted_iteration_time_s": "pred iter s", "predicted_bubble_ratio": "pred bubble"}


def print_results(console: Console, store, table, by_axis=(), tables: bool = True) -> None:
    """The end-of-run tables, per cell and per axis value (medians with their 95 %
    interval): every number whole at the console's width (headers wrap; when the columns do
    not fit side by side they are split over several tables, each led by the first column);
    then where the csv, summary and plots are (alone when not ``tables``)."""
    if tables:
        _print_table(console, "results", end_cells(table))
        for axis, t in by_axis:
            _print_table(console, f"by {axis.rsplit('.', 1)[-1]}", end_cells(t))
    else:  # the one thing of the tables a quiet run still says
        failed = [r for r in store.rows if r.get("status") != "ok"]
        if failed:
            console.print(f"{len(failed)} of {len(store.rows)} cell runs failed: "
                          + "; ".join(f"{r['cell_id']}: {r.get('error')}" for r in failed),
                          highlight=False, soft_wrap=True)
    console.print(f"csv: {store.csv_path}")
    console.print(f"summary: {store.root / 'summary.md'}")
    console.print(f"plots: {store.root / 'plots'}")


def _print_table(console: Console, title: str, cells: dict[str, list[str]]) -> None:
    width = console.width or 120
    parts = _fit(cells, width)
    for part in parts:
        t = Table(title=title if part is parts[0] else f"{title} (continued)")
        for c, w in zip(part, _widths(cells, part, width)):
            t.add_column(_title(c), overflow="fold", width=w)
        for i in range(len(cells[part[0]])):
            t.add_row(*(cells[c][i] for c in part))
        console.print(t)


def end_cells(table) -> dict[str, list[str]]:
    """Column name → the text of each line, in the order shown; a metric's interval bounds
    become one '[low, high]' column after it."""
    out: dict[str, list[str]] = {}
    for c in table.columns:
        if c.endswith(("_lo", "_hi")):
            continue
        out[c] = [_cell(v) for v in table[c]]
        if f"{c}_lo" in table:
            out[f"{c}_ci"] = [_interval(lo, hi) for lo, hi in zip(table[f"{c}_lo"],
                                                                 table[f"{c}_hi"])]
    return out


def _fit(cells: dict[str, list[str]], width: int) -> list[list[str]]:
    """The columns split into groups that fit ``width`` (each led by the first column)."""
    def need(c: str) -> int:
        return _least(cells, c) + _FRAME
    first = next(iter(cells))
    lead, rest = [first], [c for c in cells if c != first]
    groups, used = [list(lead)], 1 + need(first)
    for c in rest:
        if used + need(c) > width and len(groups[-1]) > 1:
            groups.append(list(lead))
            used = 1 + need(first)
        groups[-1].append(c)
        used += need(c)
    return groups


def _title(c: str) -> str:
    return _TITLES.get(c, c.rsplit(".", 1)[-1])


def _least(cells: dict[str, list[str]], c: str) -> int:
    """A column's least width: its longest value, and its header's longest word."""
    return max([len(v) for v in cells[c]] + [max(map(len, _title(c).split()))])


def _widths(cells: dict[str, list[str]], part: list[str], width: int) -> list[int]:
    """Each column's width: its least, then what is left of ``width`` given to headers
    that would otherwise wrap, in column order."""
    out = [_least(cells, c) for c in part]
    left = width - 1 - sum(w + _FRAME for w in out)
    for k, c in enumerate(part):
        extra = max(0, min(left, len(_title(c)) - out[k]))
        out[k] += extra
        left -= extra
    return out


def _interval(lo, hi) -> str:
    if lo is None or hi is None or lo != lo or hi != hi:
        return "n<6"
    return f"[{_cell(lo)}, {_cell(hi)}]"


def _cell(v) -> str:
    if isinstance(v, float):
        if v != v:
            return ""
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3f}"
    return str(v)
