"""Read a JAX profiler trace (`.xplane.pb`) into a `TraceSummary`, with `jax.profiler.ProfileData` only.

What is read: step spans (the `StepTraceAnnotation` events, carrying `step_num`, on a host thread; else one step per
executable run), per-device HLO op events (events carrying `hlo_op`/`hlo_module` stats on the host CPU
threads, or the `XLA Ops` line of a `/device:` plane on accelerators), and compile events. Op time is
self time (children subtracted), so nested thunks (a while body inside its while) are not counted twice.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tputool.errors import UserError
from tputool.profile.categories import classify

COMPILE_EVENT = "backend_compile_and_load"
"""The python-side span jax records around one XLA compile."""


@dataclass(frozen=True)
class OpStat:
    """One HLO op (or fusion) aggregated over devices and steps: time is per device per step."""

    name: str
    module: str
    category: str  # compute | collective
    time_s: float
    count: float  # occurrences per device per step
    fraction: float  # of all op time


@dataclass
class TraceSummary:
    """What a trace says about the measured steps (times in seconds, per device averages)."""

    trace_dir: str
    xplane_path: str
    perfetto_path: str | None
    n_devices: int
    step_times_s: list[float]
    compile_s: float
    compute_s: float  # per step, per device
    collective_s: float
    idle_s: float  # step time not covered by any op on a device (host work, launch, waits)
    largest_gap_s: float
    top_ops: list[OpStat] = field(default_factory=list)
    excluded_steps: int = 0  # steps that overlapped a compile

    @property
    def step_time_s(self) -> float:
        """Median measured step time."""
        return statistics.median(self.step_times_s) if self.step_times_s else float("nan")

    @property
    def collective_fraction(self) -> float:
        """Collective share of op time."""
        busy = self.compute_s + self.collective_s
        return self.collective_s / busy if busy else 0.0

    def to_dict(self) -> dict:
        """Plain data for JSON/YAML."""
        d = asdict(self)
        d["step_time_s"] = self.step_time_s
        d["collective_fraction"] = self.collective_fraction
        return d


@dataclass
class _Op:
    name: str
    module: str
    device: int
    start: float
    end: float
    run: str = ""
    self_time: float = 0.0


def find_xplane(path: str | Path) -> Path:
    """The newest `*.xplane.pb` under `path` (or `path` itself); UserError when there is none."""
    p = Path(path)
    if p.is_file() and p.name.endswith(".xplane.pb"):
        return p
    found = sorted(p.rglob("*.xplane.pb"), key=lambda f: f.stat().st_mtime) if p.is_dir() else []
    if not found:
        raise UserError(f"no .xplane.pb trace under {path}")
    return found[-1]


def _stats(ev) -> dict:
    try:
        return dict(ev.stats)
    except Exception:  # noqa: BLE001 - a stat of an unknown type
        return {}


def _collect(profile) -> tuple[list[tuple[float, float]], list[tuple[float, float]], list[_Op]]:
    steps: list[tuple[float, float]] = []
    compiles: list[tuple[float, float]] = []
    ops: list[_Op] = []
    for plane in profile.planes:
        device_plane = plane.name.startswith("/device:")
        plane_ordinal = _ordinal(plane.name)
        for line in plane.lines:
            for ev in line.events:
                name = ev.name
                if name.startswith("end: "):
                    continue
                start, dur = ev.start_ns * 1e-9, ev.duration_ns * 1e-9
                stats = _stats(ev)
                if not device_plane and "step_num" in stats:
                    steps.append((start, start + dur))
                    continue
                if name == COMPILE_EVENT or name.endswith(" " + COMPILE_EVENT):
                    compiles.append((start, start + dur))
                    continue
                if "hlo_op" in stats:
                    ops.append(_Op(str(stats["hlo_op"]), str(stats.get("hlo_module", "")),
                                   int(stats.get("device_ordinal", plane_ordinal)), start, start + dur,
                                   str(stats.get("run_id", ""))))
                elif device_plane and line.name == "XLA Ops":
                    ops.append(_Op(name, str(stats.get("hlo_module", "")), plane_ordinal, start, start + dur))
    return steps, compiles, ops


def _ordinal(plane_name: str) -> int:
    tail = plane_name.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _self_times(ops: list[_Op]) -> None:
    by_dev: dict[int, list[_Op]] = defaultdict(list)
    for op in ops:
        by_dev[op.device].append(op)
    for dev_ops in by_dev.values():
        dev_ops.sort(key=lambda o: (o.start, -o.end))
        stack: list[_Op] = []
        for op in dev_ops:
            op.self_time = op.end - op.start
            while stack and stack[-1].end <= op.start:
                stack.pop()
            if stack and op.end <= stack[-1].end:
                stack[-1].self_time -= op.end - op.start
            stack.append(op)


def _union(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """(covered length, largest gap between covered pieces)."""
    if not intervals:
        return 0.0, 0.0
    intervals = sorted(intervals)
    covered, gap = 0.0, 0.0
    cur_s, cur_e = intervals[0]
    for s, e in intervals[1:]:
        if s > cur_e:
            covered += cur_e - cur_s
            gap = max(gap, s - cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return covered + cur_e - cur_s, gap


def _overlaps(span: tuple[float, float], others: list[tuple[float, float]]) -> bool:
    return any(s < span[1] and e > span[0] for s, e in others)


def summarize(profile, trace_dir: str, xplane_path: str, perfetto: str | None, top: int = 10) -> TraceSummary:
    """Summarize a loaded `jax.profiler.ProfileData`."""
    steps, compiles, ops = _collect(profile)
    return _summarize(steps, compiles, ops, trace_dir, xplane_path, perfetto, top)


def _collect_json(events: list[dict]) -> tuple[list[tuple[float, float]], list[tuple[float, float]], list[_Op]]:
    """Steps, compiles and HLO ops of Chrome/Perfetto trace events (the `*.trace.json.gz` XProf and
    `jax.profiler` write): complete events ("X", microseconds) with the same stats as xplane events."""
    device_pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                   and str((e.get("args") or {}).get("name", "")).startswith("/device:")}
    ops_lines = {(e["pid"], e.get("tid")) for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
                 and (e.get("args") or {}).get("name") == "XLA Ops"}
    steps: list[tuple[float, float]] = []
    compiles: list[tuple[float, float]] = []
    ops: list[_Op] = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        name, args = str(e.get("name", "")), e.get("args") or {}
        start = float(e["ts"]) * 1e-6
        span = (start, start + float(e["dur"]) * 1e-6)
        on_device = e.get("pid") in device_pids
        if not on_device and "step_num" in args:
            steps.append(span)
        elif name == COMPILE_EVENT or name.endswith(" " + COMPILE_EVENT):
            compiles.append(span)
        elif "hlo_op" in args:
            ops.append(_Op(str(args["hlo_op"]), str(args.get("hlo_module", "")),
                           int(args.get("device_ordinal", e.get("pid", 0))), *span, str(args.get("run_id", ""))))
        elif on_device and (e.get("pid"), e.get("tid")) in ops_lines:
            ops.append(_Op(name, str(args.get("hlo_module", "")), int(e["pid"]), *span))
    return steps, compiles, ops


def _summarize(steps, compiles, ops, trace_dir: str, xplane_path: str, perfetto: str | None,
               top: int) -> TraceSummary:
    _self_times(ops)
    if not steps and ops:
        # no step annotations: one step per executable run (run_id), spanning its ops on all devices
        runs: dict[tuple[str, str], list[_Op]] = defaultdict(list)
        for op in ops:
            runs[(op.module, op.run)].append(op)
        steps = [(min(o.start for o in r), max(o.end for o in r)) for r in runs.values()]
    steps.sort()
    clean = [s for s in steps if not _overlaps(s, compiles)]
    excluded = len(steps) - len(clean)
    if not clean:
        clean = steps
    devices = sorted({op.device for op in ops}) or [0]
    n_dev = len(devices)

    in_steps = [op for op in ops if any(s <= op.start < e for s, e in clean)]
    n_steps = max(len(clean), 1)
    compute = sum(o.self_time for o in in_steps if classify(o.name) == "compute") / n_dev / n_steps
    collective = sum(o.self_time for o in in_steps if classify(o.name) == "collective") / n_dev / n_steps

    idle_total, largest_gap = 0.0, 0.0
    for s, e in clean:
        for d in devices:
            ivs = [(max(o.start, s), min(o.end, e)) for o in in_steps if o.device == d and o.start < e and o.end > s]
            covered, gap = _union(ivs)
            idle_total += (e - s) - covered
            largest_gap = max(largest_gap, gap)
    idle = idle_total / n_dev / n_steps

    agg: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for o in in_steps:
        a = agg[(o.name, o.module)]
        a[0] += o.self_time
        a[1] += 1
    total = sum(v[0] for v in agg.values()) or 1.0
    ranked = sorted(agg.items(), key=lambda kv: -kv[1][0])[:top]
    top_ops = [OpStat(name, module, classify(name), t / n_dev / n_steps, c / n_dev / n_steps, t / total)
               for (name, module), (t, c) in ranked]
    return TraceSummary(
        trace_dir=trace_dir, xplane_path=xplane_path, perfetto_path=perfetto, n_devices=n_dev,
        step_times_s=[e - s for s, e in clean], compile_s=_union(compiles)[0],
        compute_s=compute, collective_s=collective, idle_s=idle, largest_gap_s=largest_gap,
        top_ops=top_ops, excluded_steps=excluded if clean is not steps else 0,
    )


def read_json_trace(path: str | Path, top: int = 10) -> TraceSummary:
    """Read a Chrome/Perfetto `*.trace.json.gz` (or `.json`) trace, or the newest one under a directory."""
    import gzip
    import json

    p = Path(path)
    if p.is_dir():
        found = sorted([*p.rglob("*.trace.json.gz"), *p.rglob("perfetto_trace.json.gz")],
                       key=lambda f: f.stat().st_mtime)
        if not found:
            raise UserError(f"no .xplane.pb or .trace.json.gz trace under {path}")
        p = found[-1]
    try:
        with (gzip.open(p, "rt") if p.name.endswith(".gz") else p.open()) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read trace {p}: {e}") from e
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return _summarize(*_collect_json(events), str(path), str(p), str(p), top)


def read_any_trace(path: str | Path, top: int = 10) -> TraceSummary:
    """An `.xplane.pb` where there is one (the richer format), else a `*.trace.json.gz`."""
    p = Path(path)
    if p.is_file() and (p.name.endswith(".json.gz") or p.name.endswith(".json")):
        return read_json_trace(p, top)
    try:
        find_xplane(p)
    except UserError:
        return read_json_trace(p, top)
    return read_trace(p, top)


def read_trace(path: str | Path, top: int = 10) -> TraceSummary:
    """Read the newest `.xplane.pb` under `path` (a trace dir or the file) into a TraceSummary."""
    from jax.profiler import ProfileData

    xplane = find_xplane(path)
    try:
        profile = ProfileData.from_file(str(xplane))
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file
        raise UserError(f"cannot read trace {xplane}: {e}") from e
    candidates = [*xplane.parent.glob("perfetto_trace.json.gz"), *sorted(xplane.parent.glob("*.trace.json.gz"))]
    perfetto = str(candidates[0]) if candidates else None
    return summarize(profile, str(Path(path)), str(xplane), perfetto, top=top)
