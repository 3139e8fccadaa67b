"""Print a TraceSummary: headline times, top ops, and where to open the trace."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from tputool.profile.reader import TraceSummary


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms"


def print_summary(s: TraceSummary, console: Console | None = None, cpu: bool = False) -> None:
    """Headline table, top-op table, and how to open the trace in Perfetto / TensorBoard."""
    console = console or Console()
    head = Table(title="step summary" + (" (CPU measurements)" if cpu else ""), title_justify="left")
    head.add_column("metric")
    head.add_column("value", justify="right")
    head.add_row("devices", str(s.n_devices))
    head.add_row("steps measured", f"{len(s.step_times_s)} (+{s.excluded_steps} compiling)")
    head.add_row("step time (median)", _ms(s.step_time_s))
    head.add_row("compute / device / step", _ms(s.compute_s))
    head.add_row("collective / device / step", f"{_ms(s.collective_s)} ({100 * s.collective_fraction:.0f}% of op time)")
    head.add_row("idle (host, launch, waits)", _ms(s.idle_s))
    head.add_row("largest idle gap", _ms(s.largest_gap_s))
    head.add_row("compile time", f"{s.compile_s:.2f} s")
    console.print(head)
    ops = Table(title="top XLA ops / fusions (per device per step)", title_justify="left")
    for col in ("op", "module", "kind"):
        ops.add_column(col)
    ops.add_column("time", justify="right")
    ops.add_column("count", justify="right")
    ops.add_column("share", justify="right")
    for op in s.top_ops:
        ops.add_row(op.name, op.module, op.category, _ms(op.time_s), f"{op.count:g}", f"{100 * op.fraction:.1f}%")
    console.print(ops)
    console.print(f"trace: {s.xplane_path}")
    if s.perfetto_path:
        console.print(f"  Perfetto: open https://ui.perfetto.dev and load {s.perfetto_path}")
    console.print(f"  TensorBoard: tensorboard --logdir {Path(s.trace_dir)}  (Profile tab, tensorboard-plugin-profile)")
    torch_trace = Path(s.trace_dir) / "torch_trace.json"
    if torch_trace.is_file():
        console.print(f"  torch.profiler Chrome trace: {torch_trace} (chrome://tracing or Perfetto)")
