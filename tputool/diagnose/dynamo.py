"""Read what torch.compile (Dynamo) recorded during the run: graph breaks, compiles and recompile reasons.

Sources (torch 2.13): `torch._dynamo.utils.graph_break_reasons` (one GraphCompileReason with the user stack
per break), `counters["graph_break"]` (how often each reason was hit), `get_compilation_metrics()` (one
entry per frame compile: function, ops in the graph, the guard that failed). Nothing here imports Dynamo:
when the script never imported it, nothing was compiled.
"""

from __future__ import annotations

import re
import sys

from tputool.diagnose.userframes import UserFrames

METRICS_LIMIT = 100_000
_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_(\d+)$")


def raise_metrics_limit() -> None:
    """Keep every compile's metrics (Dynamo keeps the last 64 by default); no-op before Dynamo is imported."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is not None and getattr(utils, "_compilation_metrics", None) is not None:
        if utils._compilation_metrics.maxlen != METRICS_LIMIT:
            utils.set_compilation_metrics_limit(METRICS_LIMIT)


def _short_reason(reason: str) -> str:
    """The first line of a Dynamo reason plus its `Explanation:` line, without hints, context and links."""
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    if not lines:
        return "unknown"
    why = next((ln.split(":", 1)[1].strip() for ln in lines[1:] if ln.startswith("Explanation:")), "")
    return f"{lines[0]}: {why}" if why else lines[0]


def collect(frames: UserFrames) -> dict:
    """Graph breaks and compiles seen by Dynamo, located at the user's frames, as JSON-ready lists."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return {"graph_breaks": [], "compiles": [], "recompile_limit": None}
    import torch._dynamo.config as dconfig

    compiles = []
    for m in utils.get_compilation_metrics():
        name, file, line = m.co_name or "?", m.co_filename or "?", m.co_firstlineno or 0
        resumed = _RESUME.match(name)
        compiles.append({
            "function": resumed.group(1) if resumed else name,
            "resume_at": int(resumed.group(2)) if resumed else None,
            "file": file, "line": line, "user": frames.is_user(file),
            "ops": m.graph_op_count, "compile_id": m.compile_id,
            "recompile_reason": m.recompile_reason, "fail_type": m.fail_type,
            "fail_reason": m.fail_reason,
        })

    hits = utils.counters.get("graph_break", {})
    breaks: dict[tuple[str, int, str], dict] = {}
    for gb in utils.graph_break_reasons:
        user = [fs for fs in gb.user_stack if frames.is_user(fs.filename)]
        if not user:
            continue
        fs = user[-1]
        key = (fs.filename, fs.lineno or 0, _short_reason(gb.reason))
        entry = breaks.setdefault(key, {"file": key[0], "line": key[1], "reason": key[2], "function": fs.name,
                                        "compiles": 0, "count": hits.get(gb.reason, 0)})
        entry["compiles"] += 1
    for entry in breaks.values():
        before = [c["ops"] for c in compiles
                  if c["function"] == entry["function"] and c["resume_at"] is None and c["ops"] is not None]
        after = [c["ops"] for c in compiles if c["resume_at"] == entry["line"] and c["ops"] is not None]
        entry["ops_before"] = max(before) if before else None
        entry["ops_after"] = max(after) if after else None
    limit = getattr(dconfig, "recompile_limit", None) or getattr(dconfig, "cache_size_limit", None)
    return {"graph_breaks": list(breaks.values()), "compiles": compiles, "recompile_limit": limit}
