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


def how_used(result: TuneResult) -> list[str]:
    """What was predicted, what was measured, and what each says (measured mode); empty in predicted mode."""
    if result.mode != "measured":
        return []
    n, ran = len(result.rows), len(result.measured)
    failed = sum(r.status == "failed" for r in result.rows)
    lines = [f"predicted {n} candidates with the cost model; ran {ran + failed} of them here (budget {result.budget}, "
             f"the cost model's choice){f', {failed} failed' if failed else ''}; the other {n - ran - failed} are "
             "ranked by prediction only"]
    rho = result.spearman()
    if result.hardware.kind == "cpu":
        lines += [
            f"the cost model here uses rates calibrated on this host ({result.hardware.name}), not a TPU's; "
            "the CPU runs check that each chosen candidate compiles and runs, give its step time on this host, "
            "and correct the model's CPU-side overheads to choose which candidates to run",
            "the CPU step times are not evidence for a TPU ranking: simulated devices share this host's cores "
            "and memory, with no ICI; to rank for a TPU use --target (e.g. --target v5e-8), which ranks by the "
            "cost model with TPU rates",
            f"agreement of the host-calibrated cost model with this host's {ran} measured rows: Spearman = "
            f"{'n/a (fewer than 3 rows)' if rho is None else f'{rho:.2f}'} (a check of the model on this CPU)",
            "the winner is the fastest measured on this host: a configuration that runs, not the best for a TPU",
        ]
    else:
        lines.append(f"Spearman(predicted, measured) over the {ran} measured rows = "
                     f"{'n/a (fewer than 3 rows)' if rho is None else f'{rho:.2f}'}")
    return lines


def winner_line(result: TuneResult) -> str | None:
    """`winner: KEY` (the key alone, for scripts), or None."""
    return None if result.winner is None else f"winner: {result.winner.candidate.key}"


def to_json(result: TuneResult) -> str:
    """The result as a JSON document (schema tputool.tune/1): counts, how the parts were used, every row."""
    import json

    def row(r) -> dict:
        e = r.estimate
        return {"candidate": r.candidate.key, "knobs": r.candidate.to_dict(), "status": r.status,
                "reason": r.reason, "predicted_rank": r.predicted_rank, "predicted_tokens_per_s": e.tokens_per_s,
                "predicted_step_s": e.step_s, "predicted_memory_bytes": e.memory.total,
                "measured": r.measurement.to_dict() if r.measurement else None,
                "measured_tokens_per_s": r.measured_tokens_per_s, "compiled_memory_bytes": r.compiled_memory}

    doc = {"schema": "tputool.tune/1", "model": result.model, "mode": result.mode, "label": result.label,
           "hardware": result.hardware.name, "predicted": len(result.rows), "measured": len(result.measured),
           "budget": result.budget, "spearman": result.spearman(), "how": how_used(result),
           "winner": result.winner.candidate.key if result.winner else None, "notes": list(result.notes),
           "no_fit": result.no_fit.lines() if result.no_fit is not None else None,
           "rows": [row(r) for r in result.rows],
           "rejected": [{"what": x.what, "stage": x.stage, "reason": x.reason} for x in result.rejected]}
    return json.dumps(doc, indent=2)


def print_result(result: TuneResult, console: Console | None = None, limit: int = 15) -> None:
    """Print the ranked table, the rejections, how predictions and measurements were used, and the winner."""
    console = console or Console()
    console.print(ranked_table(result, limit))
    rej = rejected_table(result)
    if rej is not None:
        console.print(rej)
    for line in how_used(result):
        console.print(escape(line))
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
    line = winner_line(result)
    if line is not None:
        console.print(escape(line))
