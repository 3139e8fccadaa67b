"""`tputool tune --html`: predicted against measured throughput for every candidate run (the winner marked),
and each candidate's predicted memory per chip against the chip's memory.

Built from the `TuneResult` that `tputool.tune.report` prints: the same rows, the same ranking key, the same
estimates and measurements.
"""

from __future__ import annotations

from tputool.reports import html, plots
from tputool.tune.report import how_used
from tputool.tune.search import GIB, Row, TuneResult

MISFITS_SHOWN = 5
"""Candidates predicted not to fit that the memory plot shows beside the ones that do."""
PART_COLORS = ("blue", "teal", "orange")


def shown(result: TuneResult, limit: int = 15) -> list[Row]:
    """The candidates to plot, ordered as the ranked table: in measured mode every candidate run (fastest
    first), in predicted mode the `limit` best-ranked that fit."""
    if result.mode == "measured":
        return sorted(result.measured, key=lambda r: (-(r.measured_tokens_per_s or 0), r.predicted_rank))
    rows = [r for r in result.rows if r.status not in ("memory", "failed")]
    return sorted(rows, key=lambda r: r.predicted_rank)[:limit]


def misfits(result: TuneResult) -> list[Row]:
    """The best-ranked candidates predicted (or compiled) not to fit, a few."""
    return sorted((r for r in result.rows if r.status == "memory"), key=lambda r: r.predicted_rank)[:MISFITS_SHOWN]


def _label(result: TuneResult, r: Row) -> str:
    return ("\u2605 " if result.winner is r else "") + r.candidate.key


def _memory_name(result: TuneResult) -> str:
    return "HBM per chip" if result.hardware.kind == "tpu" else "host memory per device"


CAP_SHOWN = 0.05
"""The memory line is drawn when the largest candidate uses at least this share of it; below, it would
flatten every bar to nothing, so the title gives it instead."""
UNITS = (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024.0))


def _unit(nbytes: float) -> tuple[str, float]:
    return next(((u, s) for u, s in UNITS if nbytes >= s), UNITS[-1])


def _throughput_plot(result: TuneResult, rows: list[Row]) -> str:
    measured = result.mode == "measured"
    labels = [_label(result, r) for r in rows]
    pred = [r.estimate.tokens_per_s for r in rows]
    meas = [r.measured_tokens_per_s or 0.0 for r in rows]
    with plots.style():
        fig, ax = plots.new_figure(9.5, 0.5 * len(rows) + 1.3)
        ys = list(range(len(rows)))[::-1]
        h = 0.38 if measured else 0.6
        series = [("predicted (cost model)", pred, "blue", 0.5 if measured else 0.0)]
        if measured:
            series.append(("measured", meas, "orange", -0.5))
        for name, vals, color, off in series:
            bars = ax.barh([y + off * h for y in ys], vals, height=h, color=plots.COLORS[color], label=name)
            ax.bar_label(bars, [plots.short(v) for v in vals], padding=3, fontsize=7.5)
        ax.set_yticks(ys, labels, fontsize=8)
        for tick, r in zip(ax.get_yticklabels(), rows, strict=True):
            if result.winner is r:
                tick.set_fontweight("bold")
                tick.set_color(plots.COLORS["red"])
        ax.set_xlim(0, max([*pred, *meas, 1.0]) * 1.2)
        ax.set_xlabel("tokens per second (whole job)")
        ax.set_title("Predicted and measured throughput" if measured else "Predicted throughput", loc="left")
        ax.xaxis.set_major_formatter("{x:,.0f}")
        if measured:
            fig.legend(loc="outside lower center", fontsize=8, frameon=False, ncols=2)
        return plots.to_svg(fig, "throughput")


def _xla_bytes(r: Row) -> float | None:
    """What XLA's memory analysis gave for the candidate's compiled step (a TPU compile, or the measured run)."""
    if r.compiled_memory is not None:
        return r.compiled_memory
    return r.measurement.temp_bytes + r.measurement.argument_bytes if r.measurement else None


def _largest(rows: list[Row]) -> float:
    return max([r.estimate.memory.total for r in rows] + [_xla_bytes(r) or 0 for r in rows])


def _cap_shown(result: TuneResult, rows: list[Row]) -> bool:
    return _largest(rows) >= CAP_SHOWN * result.hardware.hbm_bytes


def _memory_plot(result: TuneResult, rows: list[Row]) -> str:
    cap = result.hardware.hbm_bytes
    xla = [_xla_bytes(r) for r in rows]
    largest = _largest(rows)
    show_cap = _cap_shown(result, rows)
    unit, size = _unit(max(largest, cap) if show_cap else largest)
    with plots.style():
        fig, ax = plots.new_figure(9.5, 0.42 * len(rows) + 1.4)
        ys = list(range(len(rows)))[::-1]
        left = [0.0] * len(rows)
        for name, color in zip(rows[0].estimate.memory.parts, PART_COLORS, strict=True):
            vals = [r.estimate.memory.parts[name] / size for r in rows]
            ax.barh(ys, vals, left=left, height=0.6, color=plots.COLORS[color], label=name)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        texts = [plots.short(t, unit) + (f", XLA {plots.short(b / size, unit)}" if b else "")
                 + (" (does not fit)" if r.status == "memory" else "") for t, b, r in zip(left, xla, rows, strict=True)]
        for y, text in zip(ys, texts, strict=True):  # a column right of the plot: never under a marker
            ax.text(1.01, y, text, transform=ax.get_yaxis_transform(), fontsize=7.5, va="center")
        points = [(y, b / size) for y, b in zip(ys, xla, strict=True) if b]
        if points:
            ax.plot([b for _, b in points], [y for y, _ in points], linestyle="none", marker="D", markersize=5,
                    color="black", label="compiled (XLA)", gid="xla-memory")
        title = f"Predicted memory per device, against the {_memory_name(result)}"
        if show_cap:
            ax.axvline(cap / size, color=plots.COLORS["red"], linestyle="--", linewidth=1.2)
            ax.text(cap / size, len(rows) - 0.4, f" {_memory_name(result)}: {plots.short(cap / size, unit)}",
                    color=plots.COLORS["red"], fontsize=8, va="bottom")
        else:
            title += f"\n({plots.short(cap / GIB, 'GiB')}: off the scale, the largest uses {largest / cap:.2%} of it)"
        ax.set_yticks(ys, [_label(result, r) for r in rows], fontsize=8)
        ax.set_xlim(0, max([*left, *(b for _, b in points), cap / size if show_cap else 0]) * 1.1)
        ax.set_ylim(-0.7, len(rows) + 0.3)
        ax.set_xlabel(f"{unit} per device at the step's peak")
        ax.set_title(title, loc="left")
        fig.legend(loc="outside lower center", fontsize=8, frameon=False, ncols=4)
        return plots.to_svg(fig, "memory")


def render(result: TuneResult, limit: int = 15) -> str:
    """The HTML page for a tune result (every candidate run; in predicted mode the `limit` best)."""
    rows = shown(result, limit)
    winner = result.winner.candidate.key if result.winner is not None else "none"
    facts = f"{result.label}; {len(result.rows)} candidates"
    if result.mode == "measured":
        facts += "; " + "; ".join(how_used(result))
    parts = [html.para(f"winner: {winner}", "verdict"), html.para(facts, "facts")]
    if rows:
        what = ("every candidate run, fastest measured first" if result.mode == "measured" else
                f"the {len(rows)} best-ranked candidates that fit (predicted mode: nothing is run)")
        parts.append(html.section("Throughput", html.figure(
            "throughput", _throughput_plot(result, rows),
            f"Tokens per second of the whole job for {what}; the winner is starred."
            + (" Both describe this host: the predictions use rates calibrated on it, not a TPU's."
               if result.mode == "measured" and result.hardware.kind != "tpu" else ""))))
    mem_rows = rows + misfits(result)
    if mem_rows:
        compiled = any(_xla_bytes(r) for r in mem_rows)
        parts.append(html.section("Memory per device", html.figure(
            "memory", _memory_plot(result, mem_rows),
            "Predicted bytes per device at the step's peak, by part"
            + ("; diamonds: what XLA's memory analysis gave for the compiled step" if compiled else "")
            + (f"; the dashed line is the {_memory_name(result)}" if _cap_shown(result, mem_rows) else "")
            + ". Candidates predicted not to fit come after the others.")))
    table_rows = [[i, _label(result, r), plots.short(r.estimate.tokens_per_s), plots.short(r.measured_tokens_per_s),
                   f"{r.estimate.step_s * 1e3:.2f}", f"{r.measurement.step_s * 1e3:.1f}" if r.measurement else "-",
                   plots.short(r.estimate.memory.total / GIB), r.status, r.reason]
                  for i, r in enumerate(mem_rows, 1)]
    mark = [i for i, r in enumerate(mem_rows) if r is result.winner]
    parts.append(html.section("Candidates", html.table(
        ["#", "candidate", "pred tok/s", "measured tok/s", "pred step ms", "measured step ms", "pred GiB/dev",
         "status", "reason"], table_rows, numeric=(0, 2, 3, 4, 5, 6), marked=mark, name="candidates")))
    if result.notes:
        parts.append(html.section("Notes", *(html.para(n) for n in result.notes)))
    return html.page(f"tputool tune: {result.model} - {result.label}", *parts)
