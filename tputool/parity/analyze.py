"""Compare a tpu record with its reference record: the first departure, its causes, its growth, each level's
tolerance. `analyze(tpu, ref, slack)` returns the report dict that `report.py` renders (schema in report.py).

Records of random ops called outside modules (kind "random") are neither levels nor departures: the last one
whose draw departs before the first departure, in its step, is handed to `name_causes` as what may explain it.
"""

from __future__ import annotations

from tputool.parity.causes import from_divergence, name_causes
from tputool.parity.compare import DEFAULT_SLACK, diff

GROWTH_ROWS = 6


def _row(e: dict, d: dict) -> dict:
    need = d.get("needed") or {}
    return {"key": e["key"], "kind": e["kind"], "name": e["name"], "cls": e["cls"], "step": e["step"],
            "call": e["call"], "file": e["file"], "line": e["line"], "dtype": e["dtype"],
            "max_abs": d.get("max_abs"), "max_rel": d.get("max_rel"), "ulps": d.get("ulps"),
            "ratio": d.get("ratio"), "beyond": d.get("beyond", False), "explained": d.get("explained"),
            "needed": need or None}


def _ref_only(tpu: dict, ref: dict) -> tuple[int, dict] | None:
    """The first reference entry the tpu run never recorded, with its position in tpu order."""
    tpu_keys = {e["key"]: i for i, e in enumerate(tpu["entries"])}
    done = tpu.get("steps", 0) if tpu.get("status") not in ("ok", "step_limit") else None
    last = -1
    for r in ref["entries"]:
        if r["kind"] == "random":  # a draw only one side made is no module call: nothing to compare
            continue
        if r["key"] in tpu_keys:
            last = tpu_keys[r["key"]]
            continue
        if done is None or r["step"] < done:
            return last + 1, r
    return None


def _per_step(rows: list[dict]) -> list[dict]:
    out: dict[int, dict] = {}
    for r in rows:
        s = out.setdefault(r["step"], {"step": r["step"], "records": 0, "beyond": 0, "max_rel": 0.0,
                                       "max_abs": 0.0, "needed_atol": 0.0})
        s["records"] += 1
        s["beyond"] += int(r["beyond"])
        s["max_rel"] = max(s["max_rel"], r["max_rel"] or 0.0)
        s["max_abs"] = max(s["max_abs"], r["max_abs"] or 0.0)
        s["needed_atol"] = max(s["needed_atol"], (r["needed"] or {}).get("atol") or 0.0)
    return [out[k] for k in sorted(out)]


def analyze(tpu: dict, ref: dict, slack: float = DEFAULT_SLACK) -> dict:
    """The parity findings of a tpu record against a reference record (see the module doc)."""
    by_key = {e["key"]: e for e in ref["entries"]}
    rows: list[dict] = []
    first: tuple[int, dict, dict, dict] | None = None
    tpu_only: tuple[int, dict] | None = None
    drawn: tuple[dict, dict] | None = None  # the last random op record departing before the first departure
    for i, e in enumerate(tpu["entries"]):
        r = by_key.get(e["key"])
        if e["kind"] == "random":
            if first is None and r is not None and diff(e, r, e["step"], slack)["beyond"]:
                drawn = (e, r)
            continue
        if r is None:
            tpu_only = tpu_only or (i, e)
            continue
        d = diff(e, r, e["step"], slack)
        rows.append(_row(e, d))
        if d["beyond"] and first is None:
            first = (len(rows) - 1, e, r, d)
    ref_only = _ref_only(tpu, ref)
    divergences = [x for x in ((tpu_only, "tpu"), (ref_only, "reference")) if x[0] is not None]
    findings = []
    if divergences:
        (pos, entry), side = min(divergences, key=lambda x: x[0][0])
        first_pos = tpu["entries"].index(first[1]) if first else None
        if first_pos is None or pos <= first_pos:
            div = {"side": side, "entry": entry}
            c = from_divergence(div)
            findings.append({"kind": "divergence", "file": c["file"], "line": c["line"], "key": entry["key"],
                             "module": entry["name"], "cls": entry["cls"], "step": entry["step"],
                             "message": c["message"], "causes": [c], "op": None, "growth": []})
            first = None
    if first is not None:
        idx, e, r, d = first
        replays = [rp for rp in tpu.get("replays", [])]
        drawn = drawn if drawn is not None and drawn[0]["step"] == e["step"] else None
        causes = name_causes(e, r, replays, tpu, drawn, slack)
        op = next((rp["first"] for rp in replays if rp.get("first")), None)
        where = (causes[0]["file"], causes[0]["line"]) if causes[0]["file"] else (e["file"], e["line"])
        # The module named is the one whose code holds that line: the replayed module (perhaps a parent of the
        # first departing record's) when a replay located the cause, else the record's own.
        module, cls = causes[0].get("module") or e["name"], causes[0].get("cls") or e["cls"]
        growth = [x for x in rows[idx + 1:] if x["step"] == e["step"]][:GROWTH_ROWS]
        findings.append({"kind": "departure", "file": where[0], "line": where[1], "key": e["key"],
                         "module": module, "cls": cls, "seen_in": e["name"], "step": e["step"], "record": e["kind"],
                         "module_file": e["file"], "module_line": e["line"], "dtype": e["dtype"],
                         "ref_dtype": r["dtype"], **{k: d.get(k) for k in ("max_abs", "max_rel", "ulps", "ratio",
                                                                          "explained", "needed")},
                         "message": _message(e, d), "causes": causes, "op": op,
                         "replays": [{k: rp[k] for k in ("key", "name", "cls", "ops", "ref_ops")}
                                     for rp in replays], "growth": growth})
    return {"findings": findings, "levels": rows, "per_step": _per_step(rows),
            "replay_error": tpu.get("replay_error")}


def needs_twin(report: dict) -> bool:
    """Whether the report's first finding may be this script's own sensitivity: a departure after the first step
    whose cause is only that the earlier updates differ (`inherited`), which a twin reference run can measure."""
    f = report["findings"][0] if report["findings"] else None
    return (f is not None and f["kind"] == "departure" and f["step"] >= 1 and f["max_abs"] is not None
            and [c["name"] for c in f["causes"]] == ["inherited"])


def sensitivity(report: dict, twin: dict, ref: dict, slack: float = DEFAULT_SLACK) -> dict:
    """How far the twin reference run (its weights changed by one rounding step, `record.perturb`) departs from
    the reference at the record where the tpu run first departs. When the tpu run's error there is within
    `slack` times the twin's, the departure is this script amplifying rounding, which every device's rounding
    sets off: the finding moves from `findings` to `explained` (see report.py)."""
    f = report["findings"][0]
    t = next((e for e in twin.get("entries", []) if e["key"] == f["key"]), None)
    r = next((e for e in ref["entries"] if e["key"] == f["key"]), None)
    twin_abs = None if t is None or r is None else diff(t, r, f["step"], slack).get("max_abs")
    explains = twin.get("status") in ("ok", "step_limit") and bool(twin_abs) and f["max_abs"] <= slack * twin_abs
    out = {"key": f["key"], "step": f["step"], "module": f["seen_in"], "tpu_max_abs": f["max_abs"],
           "twin_max_abs": twin_abs, "twin_status": twin.get("status"), "explains": explains}
    if explains:
        report["explained"] = [report["findings"].pop(0)]
    return out


def _message(e: dict, d: dict) -> str:
    what = {"out": "output", "grad": "gradient", "in": "input"}[e["kind"]]
    size = "" if d.get("max_abs") is None else f": max abs {d['max_abs']:.3g}, max rel {d['max_rel']:.3g}"
    return f"the {what} of {e['name']} ({e['cls']}) at step {e['step']} departs from the reference{size}"
