"""tputool parity: run a script on the reference device and on tpu, and report where the tpu run departs.

`parity(script, args)` runs the reference child (the script's `tpu` mapped to CPU) and the tpu child with the
same seeds, records every module output and parameter gradient of the first steps, and returns a report dict
(`analyze.analyze` plus the runs' facts; schema in `report.py`). A departure that only the earlier updates
brought (`inherited`) is measured against a third run, the reference with its weights changed by one rounding
step (`analyze.sensitivity`): a script that amplifies that much has no departure of the tpu run's. `record_reference(...)` runs only the
reference side and keeps its record (`--reference` reads it back). Importing this package does not import torch.
"""

from __future__ import annotations

import os
import tempfile

from tputool.errors import UserError

__all__ = ["parity", "record_reference"]


def _check(script: str, steps: int, timeout_s: float) -> None:
    if not os.path.isfile(script):
        raise UserError(f"no such script: {script}")
    if steps < 1:
        raise UserError("--steps must be at least 1")
    if timeout_s <= 0:
        raise UserError("--timeout must be positive")


def record_reference(script: str, args: list[str], out: str, *, steps: int = 3, timeout_s: float = 600.0,
                     target: str | None = None, fp32: bool = False, max_mb: float = 16.0,
                     quiet: bool = False) -> dict:
    """Run only the reference side (on `target`: cuda when available, else cpu) and save its record to `out`."""
    from tputool.parity.runner import run_side

    _check(script, steps, timeout_s)
    if target is None:
        import torch

        target = "cuda" if torch.cuda.is_available() else "cpu"
    rec = run_side("reference", script, args, os.path.abspath(out), steps=steps, timeout_s=timeout_s,
                   max_mb=max_mb, target=target, fp32=fp32, quiet=quiet)
    return {"script": os.path.abspath(script), "out": os.path.abspath(out), "status": rec["status"],
            "exit_code": rec.get("exit_code", 0), "error": rec.get("error"), "device": target,
            "steps": rec.get("steps", 0), "records": len(rec.get("entries", [])), "wall_s": rec.get("wall_s")}


def parity(script: str, args: list[str] | None = None, *, reference: str | None = None, steps: int = 3,
           timeout_s: float = 600.0, fp32: bool = False, slack: float | None = None, max_mb: float = 16.0,
           quiet: bool = False, device_random: bool = False) -> dict:
    """Run both sides (or only tpu, against the saved `reference`) and return the parity report dict. The tpu
    run's random ops draw from the CPU generator, as the reference's do (the same dropout masks, noise and
    initializations), unless `device_random` (the tpu's own stream)."""
    import torch

    from tputool.parity.analyze import analyze, needs_twin, sensitivity
    from tputool.parity.compare import DEFAULT_SLACK
    from tputool.parity.runner import run_side

    _check(script, steps, timeout_s)
    if slack is not None and slack <= 0:
        raise UserError("--slack must be positive")
    args = list(args or [])
    with tempfile.TemporaryDirectory(prefix="tputool-parity-") as tmp:
        if reference is not None:
            try:
                ref = torch.load(reference, weights_only=False)
            except Exception as e:  # noqa: BLE001 - whatever torch.load raises, the file is not a record
                raise UserError(f"cannot read the reference {reference}: {e}") from None
            if not isinstance(ref, dict) or not str(ref.get("schema", "")).startswith("tputool.parity-record/"):
                raise UserError(f"{reference} is not a record of `tputool parity record`")
            ref_path = reference
        else:
            ref_path = os.path.join(tmp, "reference.pt")
            ref = run_side("reference", script, args, ref_path, steps=steps, timeout_s=timeout_s, max_mb=max_mb,
                           fp32=fp32, quiet=quiet)
        tpu = run_side("tpu", script, args, os.path.join(tmp, "tpu.pt"), steps=steps, timeout_s=timeout_s,
                       max_mb=max_mb, compare=ref_path if ref.get("entries") else None, slack=slack, quiet=quiet,
                       host_random=not device_random)
        report = analyze(tpu, ref, slack or DEFAULT_SLACK)
        report["sensitivity"], report["explained"] = None, []
        if reference is None and needs_twin(report):  # (a departure the earlier updates brought: how much does
            # the script itself amplify a rounding step? the twin: the reference with its weights changed by one)
            twin = run_side("reference", script, args, os.path.join(tmp, "twin.pt"), steps=steps,
                            timeout_s=timeout_s, max_mb=max_mb, fp32=fp32, perturb=True)
            report["sensitivity"] = sensitivity(report, twin, ref, slack or DEFAULT_SLACK)
    report.update({
        "script": os.path.abspath(script), "steps": min(tpu.get("steps", 0), ref.get("steps", 0)),
        "loop": tpu.get("loop"), "slack": slack or DEFAULT_SLACK,
        "reference": {"source": reference or "run", "device": ref.get("device"), "status": ref.get("status"),
                      "exit_code": ref.get("exit_code", 0), "error": ref.get("error"), "fp32": ref.get("fp32"),
                      "records": len(ref.get("entries", [])), "wall_s": ref.get("wall_s")},
        "tpu": {"status": tpu.get("status"), "exit_code": tpu.get("exit_code", 0), "error": tpu.get("error"),
                "records": len(tpu.get("entries", [])), "wall_s": tpu.get("wall_s"),
                "matmul_precision": tpu.get("matmul_precision"), "random": "device" if device_random else "host"},
    })
    return report
