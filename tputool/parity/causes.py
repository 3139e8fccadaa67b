"""Known causes of a departure, named from what the two records and the op-by-op replay show.

Each cause: {name, message, file, line}, plus {module, cls} when an op-by-op replay of that module showed it,
or {op, site_file, site_line, key} when a random op called outside any module drew other values before the
departure (`from_draw`). Names: device-branch, bf16-autocast, matmul-precision, random-op,
cpu-fallback, reduction-order, input-data, inherited (the module computes the same from the same inputs:
the difference came with them), unknown.
"""

from __future__ import annotations

from tputool.diagnose.report import display_path
from tputool.parity.compare import DEFAULT_SLACK, diff, lower_precision
from tputool.parity.record import is_random

MATMUL_OPS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear", "aten.mv",
              "aten.addmv", "aten.dot", "aten.convolution", "aten._scaled_dot_product", "aten.scaled_dot_product")
REDUCTION_OPS = ("aten.sum", "aten.mean", "aten.var", "aten.std", "aten.norm", "aten.linalg_vector_norm",
                 "aten._softmax", "aten._log_softmax", "aten.native_layer_norm", "aten.native_batch_norm",
                 "aten._native_batch_norm", "aten.cumsum", "aten.logsumexp", "aten.prod", "aten.amax",
                 "aten.native_group_norm", "aten._fused_rms_norm", "aten.nll_loss")


def _cause(name: str, message: str, file: str = "", line: int = 0) -> dict:
    return {"name": name, "message": message, "file": file, "line": line}


def from_divergence(div: dict) -> dict:
    """A module only one run called: the script took another path on one device."""
    e = div["entry"]
    other = "reference" if div["side"] == "tpu" else "tpu"
    return _cause("device-branch", f"the {div['side']} run calls {e['name']} ({e['cls']}) here and the {other} "
                  "run does not: a device-dependent branch in the script", e["file"], e["line"])


def from_op(rp: dict, matmul_precision: str) -> dict | None:
    """The cause a replay shows: a line only one device ran, or the kind of the first op beyond tolerance."""
    div = rp.get("divergence")
    if div is not None:
        return _cause("device-branch", f"only the {div['side']} run executes this line inside {rp['name']} "
                      "(same inputs, same weights): a device-dependent branch", div["file"], div["line"])
    op = rp.get("first")
    rnd = rp.get("random_at")
    if rnd is not None and (op is None or is_random(op["op"]) or op["random_before"]):
        ops = rp["random_ops"]
        what = ("dropout masks differ (compare in eval mode, or with dropout off)" if any("dropout" in o for o in ops)
                else "its values differ (a generator of another device gives other values for the same seed: "
                "draw them with a CPU generator and move them)")
        return _cause("random-op", f"a random op ({', '.join(ops)}) draws another random stream on tpu than on "
                      f"the reference: {what}", rnd["file"], rnd["line"])
    if op is None:
        return None
    where = (op["file"], op["line"])
    name = op["op"]
    if op["fallback"]:
        return _cause("cpu-fallback", f"{name} has no tpu kernel and ran on CPU through the backend's fallback; "
                      "its result differs from the reference's", *where)
    if lower_precision(op["dtype"], op["ref_dtype"]):
        return _cause("bf16-autocast", f"{name} ran in {op['dtype'].removeprefix('torch.')} on tpu and in "
                      f"{op['ref_dtype'].removeprefix('torch.')} on the reference (autocast)", *where)
    if name.startswith(MATMUL_OPS) and op["dtype"] == "torch.float32":
        how = (f'torch.set_float32_matmul_precision("{matmul_precision}")' if matmul_precision != "highest"
               else "the TPU's default matmul precision (torch.tpu.precision)")
        return _cause("matmul-precision", f"this float32 {name} is off by {_rel(op)} relative, the size "
                      f"of bfloat16 rounding: {how} multiplies in reduced precision; use "
                      '"highest" where it matters', *where)
    if name.startswith(REDUCTION_OPS):
        return _cause("reduction-order", f"{name} sums in another order on tpu (a tree reduction); the "
                      "difference grows with the reduced size", *where)
    # Both runs executed the same lines (no divergence): nothing shows a branch in the script.
    return _cause("unknown", f"{name} gives another value from the same inputs on tpu (off by "
                  f"{_rel(op)} relative) while both runs executed the same lines: no device branch was seen; "
                  "a device-dependent value computed at this line, or a backend difference", *where)


def _rel(op: dict) -> str:
    return "-" if op.get("max_rel") is None else f"{op['max_rel']:.2g}"


def from_draw(e: dict, r: dict, slack: float = DEFAULT_SLACK) -> dict:
    """A random op called outside any module (tpu record `e`, reference `r`) drew other values before the
    departure in the same step: another random stream on tpu, float rounding of its input flipping the draw
    (the online redraw tells them apart), or an input that already differs."""
    op = e["cls"]
    where = (e.get("site_file") or e["file"], e.get("site_line") or e["line"])
    at = f"{op} (called outside any module" + ("" if where == (e["file"], e["line"]) else
                                                f", at {display_path(where[0])}:{where[1]}") + ")"
    last = f"it is the last draw that differs before this departure (step {e['step']})"
    d = diff(e["input"], r["input"], e["step"], slack) if e.get("input") and r.get("input") else None
    rel = "-" if d is None or d.get("max_rel") is None else f"{d['max_rel']:.2g}"
    redraw = e.get("redraw") or ""
    if d is not None and d["beyond"]:
        name, msg = "unknown", (f"the input of {at} already differs from the reference's beyond float tolerance "
                                f"(max rel {rel}): it is computed between module calls, where parity records "
                                f"nothing; {last}")
    elif e.get("input") is None:
        name, msg = "random-op", (f"{at} draws other values on tpu: they depend only on the random stream, "
                                  f"another one on tpu than on the reference; {last}")
    elif redraw == "same":
        name, msg = "random-op", (f"{at} draws from another random stream on tpu: its input agrees with the "
                                  f"reference's (max rel {rel}) and, drawn again on CPU from one random state, "
                                  f"both inputs give the same draw; {last}. To compare past it, draw on the "
                                  "CPU from a seeded torch.Generator on both sides, or sample greedily")
    elif redraw == "differs":
        name, msg = "random-op", (f"{at} draws other values on tpu, and float rounding of its input (max rel "
                                  f"{rel}, within tolerance) alone changes the draw: drawn again on CPU from "
                                  "one random state, the tpu's input and the reference's give different "
                                  f"draws; {last}")
    else:
        why = f" ({redraw})" if redraw else ""
        name, msg = "random-op", (f"{at} draws other values on tpu from an input that agrees with the "
                                  f"reference's (max rel {rel}): another random stream on tpu, or float rounding "
                                  f"of its input changing the draw, not told apart{why}; {last}")
    c = _cause(name, msg, e["file"], e["line"])
    c.update(op=op, site_file=where[0], site_line=where[1], key=e["key"])
    return c


def name_causes(first: dict, ref: dict, replays: list[dict], tpu_record: dict,
                drawn: tuple[dict, dict] | None = None, slack: float = DEFAULT_SLACK) -> list[dict]:
    """The causes of the first departure `first` (tpu entry) against `ref` (reference entry); `drawn`: the
    random op record (tpu, reference) outside modules whose draw departed last before it, in its step."""
    out = []
    if first["kind"] == "in":
        if drawn is not None:
            return [from_draw(*drawn, slack)]
        early = tpu_record.get("early_draws") or []
        if early:  # (e.g. weights initialized after .to(device): the reference made those draws from CPU's stream)
            e0, n = early[0], sum(x["count"] for x in early)
            return [_cause("input-data", f"the input of {first['name']} differs before any layer ran: random ops "
                           f"drew on tpu before the model's first call ({n} draws, the first {e0['op']} here); the "
                           "reference makes them from CPU's stream, so what the script draws from that stream after "
                           "them (a DataLoader's shuffle, data made on the host) differs too. As between CUDA and "
                           "CPU: draw them before moving to the device to compare the runs",
                           e0["file"], e0["line"])]
        return [_cause("input-data", f"the input of {first['name']} differs before any layer ran: data made on "
                       "the device (a random op draws another stream there) or a device-dependent branch in "
                       "the data code", first["file"], first["line"])]
    if lower_precision(first["dtype"], ref["dtype"]) and first.get("autocast"):
        out.append(_cause("bf16-autocast", f"{first['name']} ran under torch.autocast({first['autocast']}) on tpu "
                          f"and in {ref['dtype'].removeprefix('torch.')} on the reference", first["file"],
                          first["line"]))
    for rp in replays:
        c = from_op(rp, tpu_record.get("matmul_precision", "highest"))
        if c is not None:
            c["module"], c["cls"] = rp["name"], rp["cls"]  # the module whose replay showed it (may be a parent)
            if not any(x["name"] == c["name"] for x in out):
                out.append(c)
            break
    if not out and drawn is not None:
        out.append(from_draw(*drawn, slack))
    if first.get("random") and not any(c["name"] == "random-op" for c in out):
        out.append(_cause("random-op", f"{first['name']} runs a dropout in training mode: the masks come from "
                          "another random stream on tpu", first["file"], first["line"]))
    if first.get("fallbacks") and not any(c["name"] == "cpu-fallback" for c in out):
        out.append(_cause("cpu-fallback", f"{first['fallbacks']} op(s) inside {first['name']} ran on CPU "
                          "through the backend's fallback", first["file"], first["line"]))
    if not out and replays:
        at = f" (step {first['step']}: the parameters after the earlier steps' updates differ)" if first["step"] \
            else ""
        out.append(_cause("inherited", f"{replays[-1]['name']} computes the same from the same inputs on both "
                          f"devices: the difference came with its inputs or parameters{at}", first["file"],
                          first["line"]))
    if not out:
        out.append(_cause("unknown", "no known cause matched", first["file"], first["line"]))
    return out
