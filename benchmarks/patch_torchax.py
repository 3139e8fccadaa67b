"""Make a `pip install --target DIR torchax` importable on this torch (benchmark environment only).

torchax 0.0.13 names aten overloads (e.g. `aten.prod.dim_Dimname`, `aten.index_copy.dimname`) that the torch in
this venv no longer has; its modules then fail at import time with "has no overload name". This script edits the
copy in DIR only: every line that names such a missing overload is commented out (the op cannot reach torchax
anyway, since torch has no such overload). torchax is never a tputool dependency.

    pip install --target /tmp/torchax_pkgs --no-deps torchax
    python benchmarks/patch_torchax.py /tmp/torchax_pkgs
    python benchmarks/train_step.py --rows jax,tpu-compile,torchax --torchax-path /tmp/torchax_pkgs
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PROBE = "import sys; sys.path.insert(0, {d!r}); import torchax"
MISSING = re.compile(r"The underlying op of 'aten\.(\w+)' has no overload name '(\w+)'")


def _missing_overloads(target: Path) -> list[str]:
    """Every `torch.ops.aten.OP.OVERLOAD` written in torchax's sources that this torch lacks."""
    import torch

    found = set()
    for f in (target / "torchax").rglob("*.py"):
        found.update(re.findall(r"torch\.ops\.aten\.(\w+)\.(\w+)\b", f.read_text()))
    out = []
    for op, ov in sorted(found):
        packet = getattr(torch.ops.aten, op, None)
        if packet is None or ov not in packet.overloads():
            out.append(f"torch.ops.aten.{op}.{ov}")
    return out


def _comment_out(text: str, names: list[str]) -> str:
    pats = [re.compile(re.escape(n) + r"\b") for n in names]
    return "".join(("# (absent in this torch) " + ln) if any(p.search(ln) for p in pats)
                   and not ln.lstrip().startswith("#") else ln for ln in text.splitlines(keepends=True))


def main(argv: list[str]) -> int:
    target = Path(argv[0] if argv else "/tmp/torchax_pkgs")
    env = {**os.environ, "TPUTOOL_BACKEND": "0"}
    missing = _missing_overloads(target)
    for f in (target / "torchax").rglob("*.py"):
        text = f.read_text()
        names = [n for n in missing if n in text]
        if names:
            f.write_text(_comment_out(text, names))
            print(f"{f.relative_to(target)}: commented out {', '.join(names)}")
    for _ in range(100):
        proc = subprocess.run([sys.executable, "-c", PROBE.format(d=str(target))], capture_output=True, text=True,
                              env=env)
        if proc.returncode == 0:
            print(f"torchax in {target} imports")
            return 0
        m = MISSING.search(proc.stderr)
        if not m:
            print(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "import failed", file=sys.stderr)
            return 1
        name = f"torch.ops.aten.{m.group(1)}.{m.group(2)}"
        hit = False
        for f in (target / "torchax").rglob("*.py"):
            text = f.read_text()
            if name not in text:
                continue
            lines = [("# (absent in this torch) " + ln) if re.search(re.escape(name) + r"\b", ln)
                     and not ln.lstrip().startswith("#") else ln for ln in text.splitlines(keepends=True)]
            f.write_text("".join(lines))
            hit = True
            print(f"{f.relative_to(target)}: commented out {name}")
        if not hit:
            print(f"cannot find {name} in {target}", file=sys.stderr)
            return 1
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
