"""Read what torch.compile (Dynamo) recorded during the run: graph breaks, compiles and recompile reasons.

Sources (torch 2.13): `torch._dynamo.utils.graph_break_reasons` (one GraphCompileReason with the user stack
per break), `counters["graph_break"]` (how often each reason was hit), `get_compilation_metrics()` (one
entry per frame compile: function, ops in the graph, the guard that failed). Nothing here imports Dynamo:
when the script never imported it, nothing was compiled.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable

from tputool.diagnose.userframes import UserFrames

METRICS_LIMIT = 100_000
_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_(\d+)$")


class CallSites:
    """Where each Dynamo compile was triggered from: the innermost user frame when a compile starts.

    Registered on the first `torch.compile(...)` call (wrapping it), so scripts that never compile do
    not pay for importing Dynamo.
    """

    def __init__(self, frames: UserFrames, iteration: Callable[[], int] | None = None) -> None:
        self.frames = frames
        self.iteration = iteration
        self.sites: dict[str, tuple[str, int]] = {}  # compile id ("0/1") -> (file, line)
        self.started_in: dict[str, int] = {}  # compile id -> the loop iteration it started in
        # (index into graph_break_reasons when a compile started, that compile's call site), in order
        self.break_marks: list[tuple[int, tuple[str, int]]] = []
        self._original = None

    def install(self) -> None:
        """Wrap torch.compile so that its first call registers the compile-start callback."""
        import torch

        original = self._original = torch.compile
        state = {"registered": False}

        @functools.wraps(original)
        def compile(*args, **kwargs):
            if not state["registered"]:
                from torch._dynamo.callback import on_compile_start

                on_compile_start(self._on_start)
                raise_metrics_limit()
                state["registered"] = True
            return original(*args, **kwargs)

        torch.compile = compile

    def remove(self) -> None:
        """Put torch.compile back."""
        if self._original is not None:
            import torch

            torch.compile = self._original
            self._original = None

    def _on_start(self, args: object) -> None:
        if self.iteration is not None:
            self.started_in[str(getattr(args, "compile_id", ""))] = self.iteration()
        loc = self.frames.location(1)
        if loc is not None:
            self.sites[str(getattr(args, "compile_id", ""))] = loc
            utils = sys.modules.get("torch._dynamo.utils")
            if utils is not None:
                self.break_marks.append((len(utils.graph_break_reasons), loc))


def raise_metrics_limit() -> None:
    """Keep every compile's metrics (Dynamo keeps the last 64 by default); no-op before Dynamo is imported."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is not None and getattr(utils, "_compilation_metrics", None) is not None:
        if utils._compilation_metrics.maxlen != METRICS_LIMIT:
            utils.set_compilation_metrics_limit(METRICS_LIMIT)


def _is_torch(filename: str) -> bool:
    """True for PyTorch's own files (their compiles and breaks are not the user's to fix)."""
    return f"{os.sep}torch{os.sep}" in filename or filename.startswith("<")


def _short_reason(reason: str) -> str:
    """The first line of a Dynamo reason plus its `Explanation:` line, without hints, context and links."""
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    if not lines:
        return "unknown"
    why = next((ln.split(":", 1)[1].strip() for ln in lines[1:] if ln.startswith("Explanation:")), "")
    return f"{lines[0]}: {why}" if why else lines[0]


def _site_of_break(index: int, marks: list[tuple[int, tuple[str, int]]]) -> tuple[str, int] | None:
    """The call site of the compile during which graph break number `index` was recorded."""
    site = None
    for start, loc in marks:
        if start > index:
            break
        site = loc
    return site


def collect(frames: UserFrames, sites: dict[str, tuple[str, int]] | None = None,
            break_marks: list[tuple[int, tuple[str, int]]] | None = None,
            started_in: dict[str, int] | None = None) -> dict:
    """Graph breaks and compiles seen by Dynamo, located at the user's frames, as JSON-ready lists.

    A break inside compiled library code (a Hugging Face forward, say) is located at the user's call
    site when one is known, with the library's file:line kept as `in_library`."""
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
            "file": file, "line": line, "user": frames.is_user(file), "torch": _is_torch(file),
            "ops": m.graph_op_count, "compile_id": m.compile_id,
            "recompile_reason": m.recompile_reason, "fail_type": m.fail_type,
            "call_site": (sites or {}).get(str(m.compile_id)),
            "iteration": (started_in or {}).get(str(m.compile_id)),
            "fail_reason": m.fail_reason,
        })

    hits = utils.counters.get("graph_break", {})
    breaks: dict[tuple[str, int, str], dict] = {}
    for i, gb in enumerate(utils.graph_break_reasons):
        user = [fs for fs in gb.user_stack if frames.is_user(fs.filename)]
        outside = [fs for fs in gb.user_stack if not _is_torch(fs.filename)]
        if not (user or outside):
            continue
        fs = (user or outside)[-1]
        where, in_library = (fs.filename, fs.lineno or 0), None
        site = None if user else _site_of_break(i, break_marks or [])
        if site is not None:
            where, in_library = site, f"{fs.filename}:{fs.lineno}"
        key = (*where, _short_reason(gb.reason))
        entry = breaks.setdefault(key, {"file": key[0], "line": key[1], "reason": key[2], "function": fs.name,
                                        "compiles": 0, "count": hits.get(gb.reason, 0), "in_library": in_library,
                                        "break_line": fs.lineno or 0})
        entry["compiles"] += 1
    for entry in breaks.values():
        before = [c["ops"] for c in compiles
                  if c["function"] == entry["function"] and c["resume_at"] is None and c["ops"] is not None]
        after = [c["ops"] for c in compiles if c["resume_at"] == entry["break_line"] and c["ops"] is not None]
        entry["ops_before"] = max(before) if before else None
        entry["ops_after"] = max(after) if after else None
    limit = getattr(dconfig, "recompile_limit", None) or getattr(dconfig, "cache_size_limit", None)
    return {"graph_breaks": list(breaks.values()), "compiles": compiles, "recompile_limit": limit}
