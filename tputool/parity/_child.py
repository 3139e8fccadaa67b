"""A parity child: `python -m tputool.parity._child --side reference|tpu --out REC.pt [...] -- SCRIPT [ARGS...]`.

Seeds Python's, NumPy's and torch's generators (all devices) with 0, then runs SCRIPT as `__main__` with a
`record.Recorder` for `--steps` steps. The reference side maps `tpu` to `--target` (`devicemap.install`;
`--fp32` turns its autocast off); the tpu side emulates "medium" matmul precision on a CPU host
(`precision.install`) and, given `--compare REF.pt`, replays the first departing module op by op
(`online.Online`). Whatever happens, one record (a dict, `torch.save`d) is written to REC.pt.
"""

from __future__ import annotations

import argparse
import os
import random
import runpy
import sys
import time

SCHEMA = "tputool.parity-record/1"


def _seed() -> None:
    import torch

    random.seed(0)
    try:
        import numpy as np

        np.random.seed(0)
    except ImportError:
        pass
    torch.manual_seed(0)
    tpu = getattr(torch, "tpu", None)
    if tpu is not None and hasattr(tpu, "manual_seed_all"):
        tpu.manual_seed_all(0)


def _device_of(side: str, target: str) -> str:
    return "tpu" if side == "tpu" else target


def main(argv: list[str] | None = None) -> int:
    """Run the script on one side and write its record; returns 0 unless the record could not be written."""
    p = argparse.ArgumentParser(prog="tputool.parity._child")
    p.add_argument("--side", choices=("reference", "tpu"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--max-mb", type=float, default=16.0)
    p.add_argument("--target", default="cpu")
    p.add_argument("--fp32", action="store_true")
    p.add_argument("--compare", default=None)
    p.add_argument("--slack", type=float, default=None)
    p.add_argument("--perturb", action="store_true", help="the sensitivity twin (`record.perturb`)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    script = os.path.abspath(ns.script)
    os.environ["TPUTOOL_PARITY_SIDE"] = ns.side

    import torch

    from tputool.diagnose.userframes import UserFrames
    from tputool.parity.compare import DEFAULT_SLACK
    from tputool.parity.record import Recorder, StepLimit

    frames = UserFrames(os.path.dirname(script))
    recorder = Recorder(frames, ns.steps, int(ns.max_mb * 2**20))
    recorder.perturb = ns.perturb
    undo = []
    online = None
    if ns.side == "reference":
        from tputool.parity.devicemap import install

        undo.append(install(ns.target, ns.fp32))
    else:
        from tputool.parity import precision

        undo.append(precision.install())
        if ns.compare:
            from tputool.parity.online import Online

            ref = torch.load(ns.compare, weights_only=False)
            online = Online(recorder, ref["entries"], ns.slack or DEFAULT_SLACK, "cpu",
                            bool(ref.get("fp32")))
            recorder.on_entry.append(online.on_entry)
            recorder.on_random.append(online.on_random)
    record = {"schema": SCHEMA, "side": ns.side, "device": _device_of(ns.side, ns.target), "fp32": ns.fp32,
              "script": script, "argv": list(ns.args), "status": "ok", "exit_code": 0, "error": None,
              "steps_asked": ns.steps, "torch": torch.__version__}
    _seed()
    sys.argv = [script, *ns.args]
    sys.path.insert(0, os.path.dirname(script))
    t0 = time.perf_counter()
    recorder.install()
    try:
        runpy.run_path(script, run_name="__main__")
    except StepLimit:
        record["status"] = "step_limit"
    except KeyboardInterrupt:
        record["status"], record["exit_code"] = "interrupted", 130
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            record["status"], record["exit_code"] = "exited", code
            record["error"] = {"type": "SystemExit", "message": f"the script exited with status {code}",
                               "traceback": frames.trim_traceback(e.__traceback__)}
    except BaseException as e:  # noqa: BLE001 - any failure of the user's script goes into the record
        record["status"], record["exit_code"] = "error", 1
        record["error"] = {"type": type(e).__name__, "message": str(e),
                           "traceback": frames.trim_traceback(e.__traceback__)}
    finally:
        recorder.remove()
        for u in reversed(undo):
            u()
    record["run_s"] = time.perf_counter() - t0
    record["steps"] = recorder.step
    record["loop"] = "steps" if recorder.optimizer_steps else "calls"
    record["matmul_precision"] = torch.get_float32_matmul_precision()
    record["entries"] = recorder.entries
    record["early_draws"] = recorder.early_draws()
    record["replays"] = online.replays if online is not None else []
    record["replay_error"] = online.error if online is not None else None
    torch.save(record, ns.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
