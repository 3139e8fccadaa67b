"""`tputool diagnose --html`: where a step's (and the run's) time goes, and the findings in the report's order.

Built from the JSON document of `tputool.diagnose.report.to_json` (schema tputool.diagnose/1): the ranking
is the report's own (its `findings` order), and a finding's time cost per step is its `extra.cost_ms` with
`extra.cost_basis` (measured or estimated) where the report has one.
"""

from __future__ import annotations

from tputool.reports import html, plots

CATEGORY = {"TPU802": "compiles", "TPU808": "compiles", "TPU812": "compiles", "TPU601": "host syncs",
            "TPU602": "host syncs", "TPU809": "host syncs", "TPU807": "transfers", "TPU803": "fallbacks",
            "TPU801": "graph breaks", "TPU806": "fused-eager flushes"}
"""The part of a step a finding's time cost belongs to. TPU813 (the eager-vs-compiled saving) is left out:
it overlaps the others."""
ALWAYS = ("compiles", "host syncs", "transfers", "fallbacks")
"""Parts shown even at zero (the question "how much do fallbacks cost" has the answer 0)."""
COMPUTE = "compute and the rest"
FINDINGS_PLOTTED = 15
_NOT_RANKED = ("TPU810", "TPU811")  # the script's failure, the timeout: facts of the run, not costs


def _where(f: dict) -> str:
    return f"{f['file']}:{f['line']}" if f.get("line") else str(f.get("file", ""))


def _cost(f: dict) -> float | None:
    ms = (f.get("extra") or {}).get("cost_ms")
    return None if ms is None else float(ms)


def _steady_compile_ms(doc: dict) -> float | None:
    """Steady-state XLA compile time per iteration, measured (TPU812's second-half seconds over the second
    half's iterations); None when the report has none."""
    n = int(doc.get("steps") or 0) or (int(doc.get("calls") or 0) if doc.get("loop") == "calls" else 0)
    late = [float(f["extra"]["late_compile_s"]) for f in doc["findings"]
            if f["code"] == "TPU812" and (f.get("extra") or {}).get("late_compile_s") is not None]
    return 1000 * sum(late) / (n - n // 2) if late and n >= 2 else None


def step_parts(doc: dict) -> list[tuple[str, float | None, str]]:
    """(part, ms per step or None when not timed, basis) of the steady-state step: each part's findings'
    time costs, the rest as compute; [] when the report has no steady-state step time."""
    if doc.get("step_s") is None:
        return []
    found: dict[str, list[dict]] = {p: [] for p in ALWAYS}
    for f in doc["findings"]:
        if f.get("source") == "runtime" and f["code"] in CATEGORY:
            found.setdefault(CATEGORY[f["code"]], []).append(f)
    out: list[tuple[str, float | None, str]] = []
    for part, fs in found.items():
        costed = [f for f in fs if _cost(f) is not None]
        if costed:
            out.append((part, sum(_cost(f) for f in costed),
                        " + ".join(sorted({f["extra"].get("cost_basis", "estimated") for f in costed}))))
        elif part == "compiles" and _steady_compile_ms(doc) is not None:
            out.append((part, _steady_compile_ms(doc), "measured"))
        else:
            out.append((part, None if fs else 0.0, "not timed" if fs else "none found"))
    rest = 1000 * doc["step_s"] - sum(ms for _, ms, _ in out if ms is not None)
    return [(COMPUTE, max(rest, 0.0), "the step less the timed parts"), *out]


def run_parts(doc: dict) -> list[tuple[str, float]]:
    """(part, seconds) of the whole run: start-up and exit, XLA compiles, the rest of the script; [] without
    a run."""
    wall, run = doc.get("wall_s"), doc.get("run_s")
    if wall is None or run is None:
        return []
    compile_s = sum(float((f.get("extra") or {}).get("compile_s") or 0.0) for f in doc["findings"]
                    if f["code"] == "TPU812")
    return [("start-up and exit", max(wall - run, 0.0)), ("XLA compiles", compile_s),
            ("the script's own work", max(run - compile_s, 0.0))]


def ranked(doc: dict) -> list[dict]:
    """The runtime findings in the report's order (the script's failure and the timeout left out)."""
    return [f for f in doc["findings"] if f.get("source") == "runtime" and f["code"] not in _NOT_RANKED]


def _hbars(labels: list[str], values: list[float], texts: list[str], colors: list[str], xlabel: str,
           name: str, title: str) -> str:
    with plots.style():
        fig, ax = plots.new_figure(9, 0.45 * len(labels) + 1.1)
        ys = list(range(len(labels)))[::-1]
        bars = ax.barh(ys, values, color=colors, height=0.6)
        ax.set_yticks(ys, labels)
        ax.bar_label(bars, texts, padding=4, fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_title(title, loc="left")
        ax.set_xlim(0, (max(values) if any(values) else 1) * 1.45)
        return plots.to_svg(fig, name)


def _step_section(doc: dict) -> str:
    parts = step_parts(doc)
    unit = "call" if doc.get("loop") == "calls" else "step"
    if not parts:
        why = ("static analysis only: the script was not run" if doc.get("status") == "static"
               else f"the run has no steady-state {unit} time (it takes two timed {unit}s or more)")
        return html.section(f"Where a {unit}'s time goes", html.para(why))
    step_ms = 1000 * doc["step_s"]
    over = sum(ms or 0.0 for _, ms, _ in parts[1:]) - step_ms
    colors = [plots.COLORS["grey"], *(plots.COLORS[c] for c in ("red", "orange", "blue", "purple", "teal",
                                                                  "brown"))][:len(parts)]
    texts = [f"{plots.short(ms)} ms ({ms / step_ms:.0%}), {basis}" if ms else basis for _, ms, basis in parts]
    svg = _hbars([p for p, _, _ in parts], [ms or 0.0 for _, ms, _ in parts], texts, colors, f"ms per {unit}",
                 "step", f"Steady-state {unit}: {plots.short(step_ms)} ms")
    caption = (f"The median {unit} of the run's second half, split by the time each part costs per {unit}: "
               "measured where diagnose timed it, estimated from typical TPU-host prices where the report "
               f"gives an estimate; a part whose findings carry no time is 'not timed' and stays inside "
               f"'{COMPUTE}', which is what is left.")
    if over > 0:
        caption += (f" The parts add up to {plots.short(over)} ms more than the measured {unit}: the estimates "
                    "are typical TPU-host prices, not this host's.")
    rows = [[p, plots.short(ms), "-" if ms is None else f"{ms / step_ms:.0%}", basis] for p, ms, basis in parts]
    return html.section(f"Where a {unit}'s time goes", html.figure("step", svg, caption),
                        html.table(["part", f"ms/{unit}", "share", "basis"], rows, numeric=(1, 2), name="step"))


def _run_section(doc: dict) -> str:
    parts = run_parts(doc)
    if not parts:
        return ""
    wall = doc["wall_s"]
    texts = [f"{plots.short(s)} s ({s / wall:.0%})" if wall else plots.short(s) for _, s in parts]
    svg = _hbars([p for p, _ in parts], [s for _, s in parts], texts,
                 [plots.COLORS["grey"], plots.COLORS["red"], plots.COLORS["blue"]], "seconds", "run",
                 f"The whole run: {plots.short(wall)} s")
    rows = [[p, plots.short(s), f"{s / wall:.0%}" if wall else "-"] for p, s in parts]
    return html.section("Where the run's time goes", html.figure(
        "run", svg, "Wall time of the observed run: interpreter start-up and exit, XLA compiles (all of them, "
        "warm-up included), and everything else the script did."),
        html.table(["part", "seconds", "share"], rows, numeric=(1, 2), name="run"))


def _findings_section(doc: dict) -> str:
    found = ranked(doc)
    unit = "call" if doc.get("loop") == "calls" else "step"
    if not found:
        return html.section("Findings", html.para("No runtime findings."))
    shown = found[:FINDINGS_PLOTTED]
    costed = any(_cost(f) is not None for f in found)
    labels = [f"{i}. {f['code']} {_where(f)}" for i, f in enumerate(shown, 1)]
    if costed:
        values = [_cost(f) or 0.0 for f in shown]
        texts = [f"{plots.short(_cost(f))} ms/{unit}, {f['extra'].get('cost_basis', '')}".rstrip(", ")
                 if _cost(f) is not None else "no time cost" for f in shown]
        xlabel = f"ms per {unit}"
    else:
        values = [float(f.get("per_step") or 0.0) for f in shown]
        texts = [f"{plots.short(v)}/{unit}" if f.get("per_step") is not None else "-" for v, f in zip(values, shown, strict=True)]
        xlabel = f"events per {unit} (this report carries no time costs)"
    sev = {"error": plots.COLORS["red"], "warning": plots.COLORS["orange"], "info": plots.COLORS["blue"]}
    svg = _hbars(labels, values, texts, [sev.get(f["severity"], plots.COLORS["grey"]) for f in shown], xlabel,
                 "findings", "Findings, in the report's order")
    more = f" (the first {FINDINGS_PLOTTED} of {len(found)})" if len(found) > FINDINGS_PLOTTED else ""
    rows = [[i, f["severity"], f["code"], _where(f), f["message"],
             "-" if f.get("per_step") is None else plots.short(f["per_step"]),
             "-" if _cost(f) is None else f"{plots.short(_cost(f))} ({f['extra'].get('cost_basis', '')})",
             f["fix"]] for i, f in enumerate(found, 1)]
    return html.section("Findings", html.figure(
        "findings", svg, f"Runtime findings in the order the report ranks them{more}; red error, orange warning, "
        "blue note."), html.table(["#", "severity", "code", "where", "message", f"per {unit}", f"ms/{unit}", "fix"],
                                 rows, numeric=(0, 5, 6), name="findings"))


def render(doc: dict) -> str:
    """The HTML page for a diagnose report's JSON document."""
    steps = (f"{doc.get('calls', 0)} model calls" if doc.get("loop") == "calls"
             else f"{doc.get('steps', 0)} optimizer steps")
    facts = f"{doc['script']}: status {doc['status']}, {steps}"
    if doc.get("wall_s") is not None:
        facts += f", {plots.short(doc['wall_s'])} s"
    if doc.get("devices"):
        facts += f", devices {', '.join(doc['devices'])}"
    static = [f for f in doc["findings"] if f.get("source") == "static"]
    tail = ""
    if static:
        tail = html.section("Static findings", html.table(
            ["code", "where", "message", "fix"], [[f["code"], _where(f), f["message"], f["fix"]] for f in static],
            name="static"))
    err = doc.get("error") or {}
    if err.get("traceback"):
        tail += html.section("Traceback (your frames only)", html.table(
            ["where", "function", "line"], [[f"{fr['file']}:{fr['line']}", fr["function"], fr.get("text") or ""]
                                            for fr in err["traceback"]], name="traceback"),
            html.para(f"{err.get('type')}: {err.get('message')}"))
    return html.page(f"tputool diagnose: {doc['script']}", html.para(doc["verdict"], "verdict"),
                     html.para(facts, "facts"), _step_section(doc), _run_section(doc), _findings_section(doc), tail)
