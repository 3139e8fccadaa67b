"""`tputool tune` output: how many candidates were predicted and measured, what CPU measurements say (and do
not say) about a TPU ranking, the run cap `--measure`, and a progress display that stays out of JSON and pipes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from tests.tune.test_search import DIMS, fake_hw, synthetic_run
from tputool.tune.report import how_used, print_result, to_json
from tputool.tune.search import tune_measured
from tputool.tune.space import SearchSpace

ROOT = Path(__file__).resolve().parents[2]
SPACE = SearchSpace(batches=(1, 4), remats=("none", "full"), attentions=(("plain", 0),), precisions=("bf16", "fp32"))


def _text(result) -> str:
    buf = io.StringIO()
    print_result(result, Console(file=buf, width=200))
    return buf.getvalue()


def test_top_caps_the_runs_and_progress_sees_each_before_and_after():
    log: list = []
    seen: list[tuple[str, str]] = []
    result = tune_measured(DIMS, fake_hw(), SPACE, synthetic_run(log), top=3,
                           progress=lambda r, i, n: seen.append((r.candidate.key, r.status)))
    assert len(result.rows) > 9  # so the third of them (the fraction cap) is above 3
    assert result.budget == 3 and len(log) == 3 == len(result.measured)
    keys = [c.key for c in log]
    assert seen == [s for k in keys for s in ((k, "running"), (k, "measured"))]


def test_cpu_report_says_how_prediction_and_measurement_are_used():
    result = tune_measured(DIMS, fake_hw(), SPACE, synthetic_run([]), top=4)
    n = len(result.rows)
    text = _text(result)
    flat = " ".join(text.split())
    assert f"predicted {n} candidates with the cost model; ran 4 of them here" in flat
    assert f"the other {n - 4} are ranked by prediction only" in flat
    assert "not evidence for a TPU ranking" in flat and "--target" in flat
    assert "rates calibrated on this host (fake x8), not a TPU's" in flat
    # the rank agreement is named as a check on this CPU, never as a bare "Spearman(predicted, measured)"
    assert "Spearman(predicted, measured)" not in flat
    assert "(a check of the model on this CPU)" in flat
    assert "fastest measured on this host: a configuration that runs, not the best for a TPU" in flat
    assert text.rstrip().splitlines()[-1] == f"winner: {result.winner.candidate.key}"


def test_tpu_measurements_are_not_called_cpu_ones():
    import dataclasses

    hw = dataclasses.replace(fake_hw(), name="v5e x8", kind="tpu")
    lines = how_used(tune_measured(DIMS, hw, SPACE, synthetic_run([]), top=4))
    assert not any("CPU" in ln or "this host" in ln for ln in lines)
    assert any(ln.startswith("Spearman(predicted, measured) over the 4 measured rows") for ln in lines)


def test_json_document_counts_predicted_and_measured():
    result = tune_measured(DIMS, fake_hw(), SPACE, synthetic_run([]), top=4)
    doc = json.loads(to_json(result))
    assert doc["schema"] == "tputool.tune/1" and doc["mode"] == "measured"
    assert doc["predicted"] == len(result.rows) and doc["measured"] == 4 == doc["budget"]
    assert sum(r["measured"] is not None for r in doc["rows"]) == 4
    assert doc["winner"] == result.winner.candidate.key and doc["how"] == how_used(result)


def _tune(fmt: str) -> subprocess.CompletedProcess:
    """A two-candidate measured search on 2 CPU devices, with rich believing stderr is a terminal."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), FORCE_COLOR="1")
    env.pop("NO_COLOR", None)
    args = ["tune", "--model", "llama", "--cpu-devices", "2", "--mesh", "d2f1t1", "--batch", "1,2", "--remat", "none",
            "--attention", "plain", "--precision", "bf16", "--fraction", "1", "--measure", "2", "--steps", "1",
            "--format", fmt, "--out", os.devnull]
    return subprocess.run([sys.executable, "-m", "tputool", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)


def test_progress_on_a_terminal_but_never_in_json_output():
    text = _tune("text")
    assert text.returncode == 0, text.stdout + text.stderr
    assert "measuring d2f1t1" in text.stderr  # the bar shows on a (forced) terminal, on stderr
    assert "measuring d2f1t1" not in text.stdout

    js = _tune("json")
    assert js.returncode == 0, js.stdout + js.stderr
    doc = json.loads(js.stdout)  # stdout is the JSON document and nothing else
    assert doc["predicted"] == 2 and doc["measured"] == 2
    assert "measuring" not in js.stderr and "\x1b[?25l" not in js.stderr  # no bar, no cursor hiding
