"""Render a TuneResult as rich tables: the ranked candidates, then why the others were left out."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tputool.tune.search import TuneResult

GIB = 1024**3


def _fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def ranked_table(result: TuneResult, limit: int = 15) -> Table:
    """Candidates ordered by measured (then predicted) throughput."""
    measured = result.mode == "measured"
    compiled = any(r.compiled_memory is not None for r in result.rows)
    moe = any(r.candidate.moe for r in result.rows)
    t = Table(title=f"tputool tune: {result.model} - {result.label}", title_justify="left")
    t.add_column("#", justify="right")
    t.add_column("mesh d/f/t")
    t.add_column("batch", justify="right")
    t.add_column("remat")
    t.add_column("attention")
    t.add_column("prec")
    if moe:
        t.add_column("moe")
    t.add_column("pred tok/s", justify="right")
    t.add_column("pred step", justify="right")
    t.add_column("pred MFU", justify="right")
    t.add_column("MFU (MaxText)", justify="right")
    t.add_column("pred GiB/dev", justify="right")
    if measured:
        t.add_column("CPU tok/s", justify="right")
        t.add_column("CPU step", justify="right")
        t.add_column("coll %", justify="right")
    if compiled:
        t.add_column("XLA TPU GiB/dev", justify="right")
    t.add_column("status")

    def key(r):
        m = r.measured_tokens_per_s
        return (0 if m is not None else 1, -(m or 0), r.predicted_rank)

    rows = sorted((r for r in result.rows if r.status not in ("memory", "failed")), key=key)[:limit]
    for i, r in enumerate(rows, 1):
        c, e = r.candidate, r.estimate
        attn = c.attention_label
        status = r.status + (" *" if result.winner is r else "")
        cells = [str(i), f"{c.data}/{c.fsdp}/{c.tensor}", str(c.batch), c.remat, attn, c.precision,
                 *([c.moe] if moe else []), _fmt_rate(e.tokens_per_s), f"{e.step_s * 1e3:.2f} ms", f"{100 * e.mfu:.1f}%", f"{100 * e.mfu_maxtext:.1f}%",
                 f"{e.memory.total / GIB:.3f}"]
        if measured:
            m = r.measurement
            cells += [_fmt_rate(r.measured_tokens_per_s), f"{m.step_s * 1e3:.1f} ms" if m else "-",
                      f"{100 * m.collective_s / max(m.compute_s + m.collective_s, 1e-12):.0f}%" if m else "-"]
        if compiled:
            cells.append("-" if r.compiled_memory is None else f"{r.compiled_memory / GIB:.3f}")
        cells.append(status)
        t.add_row(*cells)
    return t


def rejected_table(result: TuneResult, limit: int = 12) -> Table | None:
    """Why candidates were not run (memory, failures, invalid meshes; pruned ones summarised)."""
    t = Table(title="not run, and why", title_justify="left")
    t.add_column("candidate")
    t.add_column("stage")
    t.add_column("reason")
    shown = 0
    for r in result.rows:
        if r.status in ("memory", "failed") and shown < limit:
            t.add_row(r.candidate.key, r.status, r.reason)
            shown += 1
    for rej in result.rejected:
        if shown < limit:
            t.add_row(rej.what, rej.stage, rej.reason)
            shown += 1
    pruned = [r for r in result.rows if r.status == "pruned"]
    if pruned:
        t.add_row(f"{len(pruned)} candidates", "pruned", f"not among the {result.budget} the cost model chose to "
                  f"run (e.g. {pruned[0].candidate.key}: {pruned[0].reason})")
        shown += 1
    return t if shown else None


def print_result(result: TuneResult, console: Console | None = None, limit: int = 15) -> None:
    """Print the ranked table, the rejections, and the headline numbers."""
    console = console or Console()
    console.print(ranked_table(result, limit))
    rej = rejected_table(result)
    if rej is not None:
        console.print(rej)
    n = len(result.rows)
    if result.mode == "measured":
        rho = result.spearman()
        console.print(f"ran {len(result.measured)} of {n} candidates (budget {result.budget}); "
                      f"Spearman(predicted, measured) = {'n/a' if rho is None else f'{rho:.2f}'}")
    if result.mode == "predicted" and result.winner is not None:
        e = result.winner.estimate
        terms = ", ".join(f"{k} {100 * v / e.step_s:.0f}%" for k, v in e.terms.items() if v > 0)
        console.print(f"MFU: tputool's convention counts causal attention in full, MaxText's at half; "
                      f"winner's step: {escape(terms)}")
    for note in result.notes:
        console.print(f"note: {escape(note)}")
    if result.no_fit is not None:
        for line in result.no_fit.lines():
            console.print(escape(line))
    if result.winner is not None:
        console.print(f"winner: {result.winner.candidate.key}")
