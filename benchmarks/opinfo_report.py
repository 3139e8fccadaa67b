"""Turn the OpInfo sweep's JSON report (build/opinfo.json) into a markdown list of failing ops, grouped by cause.

    .venv/bin/python benchmarks/opinfo_report.py [build/opinfo.json] [-o failures.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path


def render(report: dict) -> str:
    """Markdown: totals per status and dtype, failures by cause (op, dtype, failed/total samples), fallback ops."""
    results = report["results"]
    meta = report.get("meta", {})
    status = Counter(r["status"] for r in results)
    lines = [
        "# OpInfo sweep results",
        "",
        f"device {meta.get('device', '?')}, eager mode {meta.get('eager_mode', '?')}, "
        f"{len(results)} op/dtype pairs, {meta.get('wall_seconds', '?')} s",
        "",
        ", ".join(f"{n} {s}" for s, n in status.most_common()),
        "",
    ]
    for dtype in sorted({r["dtype"] for r in results}):
        c = Counter(r["status"] for r in results if r["dtype"] == dtype)
        ran = sum(c.values()) - c["skipped"]
        pct = 100 * c["passed"] / ran if ran else 0
        lines.append(f"- {dtype}: {c['passed']}/{ran} pass on the device ({pct:.1f}%), "
                     f"{c['passed (fallback)']} only via fallback, {c['failed']} failed, {c['skipped']} skipped")
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        if r["status"] == "failed":
            groups[r["cause"]].append(r)
    lines += ["", "## Failures by cause (op[dtype] failed/run samples)", ""]
    for cause, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"- **{len(rs)}** `{cause}`")
        lines.append("  " + ", ".join(f"{r['op']}[{r['dtype']}] {r['samples_failed']}/{r['samples_total']}"
                                      for r in rs))
    fallback: Counter[str] = Counter()
    for r in results:
        fallback.update(r.get("fallback_ops", {}))
    if fallback:
        lines += ["", "## ATen ops that went through the CPU fallback (calls during the sweep)", ""]
        lines.append(", ".join(f"{op} ({n})" for op, n in fallback.most_common()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Read the report, print or write the markdown."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", nargs="?", default="build/opinfo.json")
    p.add_argument("-o", "--output", default=None)
    args = p.parse_args(argv)
    path = Path(args.report)
    if not path.is_file():
        print(f"error: no report at {path} (run pytest tests/backend/test_opinfo.py first)", file=sys.stderr)
        return 2
    text = render(json.loads(path.read_text()))
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
