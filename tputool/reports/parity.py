"""`tputool parity --html`: each recorded module output and gradient's error against its tolerance, step by
step, with the first departure marked.

Built from the JSON document of `tputool.parity.report.to_json` (schema tputool.parity/1): a level's `ratio`
is its largest error over the allowance (above 1 departs), its `kind` says output (`out`, `in`) or gradient.
"""

from __future__ import annotations

import math

from tputool.diagnose.report import display_path
from tputool.reports import html, plots

PANELS = (("outputs", ("in", "out"), "module outputs (and the model's input), in execution order"),
          ("gradients", ("grad",), "parameter gradients, in the order they were recorded"))
STEP_COLORS = ("blue", "orange", "green", "purple", "brown", "teal", "yellow", "grey")
FLOOR = 1e-4
"""Ratios below this (agreement to far better than the tolerance) are drawn at it, so the log axis stays
readable; the tables keep the exact figures."""
LABELS_MAX = 60
"""At most this many record names along an axis; with more, every n-th is named."""


def _where(file: str, line: int) -> str:
    return f"{display_path(file)}:{line}" if file else "<unknown>"


def ratio(level: dict) -> float | None:
    """A level's error over its tolerance as a float (the JSON writes infinity as "inf"), or None."""
    r = level.get("ratio")
    return None if r is None else float(r)


def first_departure(doc: dict) -> dict | None:
    """The first departure finding, or None (no finding, or the first is a divergence)."""
    return next((f for f in doc["findings"] if f["kind"] == "departure"), None)


def step_maxima(doc: dict) -> list[tuple[int, float | None, float | None]]:
    """(step, largest output ratio, largest gradient ratio) per step, None where the step has none."""
    out: dict[int, list] = {}
    for lv in doc["levels"]:
        r = ratio(lv)
        if r is None:
            continue
        m = out.setdefault(lv["step"], [None, None])
        i = 1 if lv["kind"] == "grad" else 0
        m[i] = r if m[i] is None else max(m[i], r)
    return [(s, *out[s]) for s in sorted(out)]


def _ident(lv: dict) -> tuple:
    return (lv["kind"], lv["name"], lv.get("call", 0))


def _label(ident: tuple) -> str:
    kind, name, call = ident
    return f"{name} (input)" if kind == "in" else name + (f" #{call + 1}" if call else "")


def _top(finite: list[float]) -> float:
    return max([2.0, *(2 * r for r in finite)])


def _records_plot(doc: dict, first: dict | None) -> str:
    levels = [lv for lv in doc["levels"] if ratio(lv) is not None]
    finite = [r for r in map(ratio, levels) if math.isfinite(r)]
    top = _top(finite)
    steps = sorted({lv["step"] for lv in levels})
    with plots.style():
        fig, axes = plots.new_figure(10, 7.5, nrows=2, squeeze=False)
        for ax, (panel, kinds, title) in zip(axes[:, 0], PANELS, strict=True):
            rows = [lv for lv in levels if lv["kind"] in kinds]
            order = list(dict.fromkeys(_ident(lv) for lv in rows))
            x_of = {ident: i for i, ident in enumerate(order)}
            for n, step in enumerate(steps):
                pts = [(x_of[_ident(lv)], min(max(ratio(lv), FLOOR), top)) for lv in rows if lv["step"] == step]
                if not pts:
                    continue
                (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3.5,
                                  linewidth=1, color=plots.COLORS[STEP_COLORS[n % len(STEP_COLORS)]],
                                  label=f"step {step}")
                line.set_gid(f"step{step}-{panel}")
            ax.axhline(1.0, color=plots.COLORS["red"], linewidth=1, linestyle="--")
            ax.text(0, 1.15, "tolerance", color=plots.COLORS["red"], fontsize=8, va="bottom")
            if first is not None and first.get("record", "out") in kinds:
                hit = next((lv for lv in rows if lv["key"] == first["key"]), None)
                if hit is not None:
                    x, y = x_of[_ident(hit)], min(max(ratio(hit), FLOOR), top)
                    ax.plot([x], [y], marker="*", markersize=16, color=plots.COLORS["red"], linestyle="none",
                            gid="first-departure")
                    ax.annotate(f"first departure: {hit['name']}, step {hit['step']} ({plots.short(ratio(hit))}x)",
                                (x, y), xytext=(12, 10), textcoords="offset points", fontsize=8,
                                color=plots.COLORS["red"], fontweight="bold")
            ax.set_yscale("log")
            ax.set_ylim(FLOOR / 1.5, top * 1.5)
            every = max(1, math.ceil(len(order) / LABELS_MAX))
            ax.set_xticks(range(0, len(order), every), [_label(i) for i in order[::every]], rotation=60,
                          ha="right", fontsize=7, rotation_mode="anchor")
            ax.set_xlim(-0.5, max(len(order), 1) - 0.5)
            ax.set_ylabel("error / tolerance")
            ax.set_title(title, loc="left")
        fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside upper right", fontsize=8, frameon=False,
                   ncols=min(len(steps), 8))
        return plots.to_svg(fig, "records")


def _steps_plot(maxima: list[tuple[int, float | None, float | None]]) -> str:
    finite = [r for _, *rs in maxima for r in rs if r is not None and math.isfinite(r)]
    top = _top(finite)
    with plots.style():
        fig, ax = plots.new_figure(7, 3.2)
        xs = list(range(len(maxima)))
        for j, (what, color) in enumerate((("outputs", "blue"), ("gradients", "orange"))):
            vals = [m[1 + j] for m in maxima]
            base = FLOOR / 1.5  # a log axis has no 0: bars rise from just under the floor to their value
            bars = ax.bar([x + (j - 0.5) * 0.38 for x in xs], [min(max(v or 0, FLOOR), top) - base for v in vals],
                          width=0.38, color=plots.COLORS[color], label=what, bottom=base)
            ax.bar_label(bars, [plots.short(v) for v in vals], fontsize=8, padding=2)
        ax.axhline(1.0, color=plots.COLORS["red"], linewidth=1, linestyle="--", label="tolerance")
        ax.set_yscale("log")
        ax.set_ylim(FLOOR / 1.5, top * 4)
        ax.set_xticks(xs, [f"step {m[0]}" for m in maxima])
        ax.set_ylabel("largest error / tolerance")
        ax.set_title("The largest error against its tolerance, per step", loc="left")
        fig.legend(loc="outside upper right", fontsize=8, frameon=False, ncols=3)
        return plots.to_svg(fig, "steps")


def _finding_rows(f: dict) -> list[list[object]]:
    rows = [["where", _where(f["file"], f["line"])], ["what", f["message"]]]
    if f["kind"] == "departure":
        rows += [["record", f"{f['key']} ({f['dtype']}, reference {f['ref_dtype']})"],
                 ["error / tolerance", plots.short(ratio(f))],
                 ["max abs / max rel", f"{plots.short(f.get('max_abs'))} / {plots.short(f.get('max_rel'))}"]]
        if f.get("needed"):
            n = f["needed"]
            rows.append(["assert_close passes with", f"rtol={plots.short(n.get('at_rtol'))}, "
                         f"atol={plots.short(n.get('atol'))} or rtol={plots.short(n.get('rtol'))}, "
                         f"atol={plots.short(n.get('at_atol'))}"])
    if f.get("op"):
        op = f["op"]
        rows.append(["first op", f"{op['op']} at {_where(op['file'], op['line'])} (max abs {plots.short(op.get('max_abs'))}, "
                     f"max rel {plots.short(op.get('max_rel'))})"])
    rows += [["cause", f"{c['name']}: {c['message']}"] for c in f["causes"]]
    return rows


def render(doc: dict) -> str:
    """The HTML page for a parity report's JSON document."""
    ref, tpu = doc["reference"], doc["tpu"]
    script = display_path(doc["script"])
    facts = (f"{script}: reference on {ref.get('device')} ({ref.get('records')} records), tpu "
             f"({tpu.get('records')} records); {doc['steps']} step(s) compared; tolerance: assert_close's "
             f"defaults times {plots.short(doc.get('slack'))} x (1 + step)")
    parts = [html.para(doc["verdict"], "verdict"), html.para(facts, "facts")]
    first = first_departure(doc)
    for f in doc["findings"]:
        parts.append(html.section(f"The first {f['kind']}: {f['module']}",
                                  html.table(["", ""], _finding_rows(f), name=f"finding-{f['kind']}")))
    if not any(ratio(lv) is not None for lv in doc["levels"]):
        parts.append(html.section("Error against tolerance", html.para("No record was compared.")))
        return html.page(f"tputool parity: {script}", *parts)
    parts.append(html.section("Error against tolerance, record by record", html.figure(
        "records", _records_plot(doc, first),
        "Each recorded tensor's largest error divided by its tolerance (atol + rtol x |reference|); above the "
        f"dashed line it departs. One line per step; values under {FLOOR:g} are drawn at {FLOOR:g}."
        + (" The star marks the first departure." if first else ""))))
    maxima = step_maxima(doc)
    per_step = {s["step"]: s for s in doc.get("per_step", [])}
    rows = [[s, plots.short(o), plots.short(g), per_step.get(s, {}).get("beyond", "-"),
             per_step.get(s, {}).get("records", "-"), plots.short(per_step.get(s, {}).get("max_abs"))]
            for s, o, g in maxima]
    parts.append(html.section("Per step", html.figure("steps", _steps_plot(maxima), "The largest error / "
                                                      "tolerance of any output and of any gradient in each step."),
                              html.table(["step", "outputs: max error/tol", "gradients: max error/tol",
                                          "records beyond", "records", "max abs"], rows,
                                         numeric=(1, 2, 3, 4, 5), name="steps")))
    beyond = [lv for lv in doc["levels"] if lv.get("beyond")]
    if beyond:
        mark = [i for i, lv in enumerate(beyond) if first is not None and lv["key"] == first["key"]]
        parts.append(html.section(f"Records beyond their tolerance ({len(beyond)})", html.table(
            ["step", "record", "name", "where", "dtype", "error/tol", "max abs", "max rel"],
            [[lv["step"], lv["kind"], lv["name"], _where(lv["file"], lv["line"]), lv["dtype"], plots.short(ratio(lv)),
              plots.short(lv.get("max_abs")), plots.short(lv.get("max_rel"))] for lv in beyond],
            numeric=(5, 6, 7), marked=mark, name="beyond")))
    return html.page(f"tputool parity: {script}", *parts)
