"""`tputool tune --html`: predicted against measured throughput of every candidate run with the winner
starred, and memory per device against the chip's; on a synthetic measured search and a predicted one."""

from __future__ import annotations

import dataclasses

import pytest

from tests.reports.conftest import assert_self_contained, group, markers, plots_of, table_rows, texts, tputool
from tests.tune.test_search import DIMS, fake_hw, synthetic_run
from tputool.reports import tune as report
from tputool.reports.plots import short
from tputool.tune.search import tune_measured
from tputool.tune.space import SearchSpace


@pytest.fixture(scope="module")
def measured():
    space = SearchSpace(batches=(1, 4, 64), remats=("none", "full"), attentions=(("plain", 0),),
                        precisions=("bf16", "fp32"))
    timed = synthetic_run([])

    def run(c):  # the synthetic times, and XLA's memory analysis of a compiled step: 1 MB per sequence
        return dataclasses.replace(timed(c), temp_bytes=c.batch * 10**6, argument_bytes=2 * 10**6)

    return tune_measured(DIMS, fake_hw(hbm=40e6), space, run)  # batch 64 without remat: no fit


def test_measured_page_plots_each_run_candidates_prediction_and_measurement(measured):
    page = report.render(measured)
    assert_self_contained(page)
    plots = plots_of(page)
    assert sorted(plots) == ["memory", "throughput"]
    rows = report.shown(measured)
    assert rows and all(r.status == "measured" for r in rows) and len(rows) == len(measured.measured)
    labels = texts(plots["throughput"])
    for r in rows:
        assert short(r.estimate.tokens_per_s) in labels and short(r.measured_tokens_per_s) in labels
    assert f"\u2605 {measured.winner.candidate.key}" in labels
    assert measured.winner is rows[0]  # fastest measured first
    table = table_rows(page, "candidates")
    assert table[0][1] == f"\u2605 {measured.winner.candidate.key}"
    assert [t[3] for t in table[:len(rows)]] == [short(r.measured_tokens_per_s) for r in rows]


def test_memory_plot_draws_the_capacity_and_the_misfits(measured):
    page = report.render(measured)
    mem = plots_of(page)["memory"]
    labels = texts(mem)
    misfits = report.misfits(measured)
    assert misfits and len(misfits) <= report.MISFITS_SHOWN
    assert sum(t.endswith("(does not fit)") for t in labels) == len(misfits)
    xla = {r.candidate.key: r.measurement.temp_bytes + r.measurement.argument_bytes for r in report.shown(measured)}
    unit, size = report._unit(max(measured.hardware.hbm_bytes, *(r.estimate.memory.total for r in misfits)))
    assert any(t.endswith(f"host memory per device: {short(40e6 / size, unit)}") for t in labels), labels
    for r in report.shown(measured) + misfits:
        compiled = f", XLA {short(xla[r.candidate.key] / size, unit)}" if r.candidate.key in xla else ""
        assert short(r.estimate.memory.total / size, unit) + compiled + (" (does not fit)" if r in misfits else "") \
            in labels
    assert markers(group(mem, "xla-memory")) == len(report.shown(measured))  # one per measured candidate
    assert "compiled (XLA)" in labels


def test_capacity_far_off_the_scale_is_named_not_drawn(measured):
    huge = dataclasses.replace(measured, hardware=dataclasses.replace(measured.hardware, hbm_bytes=1e15))
    labels = texts(plots_of(report.render(huge))["memory"])
    assert any("off the scale" in t for t in labels)
    assert not any("memory per device:" in t for t in labels)  # no capacity line


def test_tune_html_predicted_end_to_end(tmp_path, monkeypatch):
    out = tmp_path / "tune.html"
    r = tputool("tune", "--model", "llama", "--target", "v5e-8", "--set", "dim=2048", "--set", "n_layers=16",
                "--set", "n_heads=16", "--set", "n_kv_heads=8", "--set", "ffn_dim=5632", "--set", "max_seq_len=2048",
                "--set", "vocab_size=32000", "--batch", "1,8", "--remat", "none,full", "--attention", "plain",
                "--precision", "bf16", "--show", "6", "--compile-top", "0", "--out", str(tmp_path / "t.yaml"),
                "--html", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    page = out.read_text()
    assert_self_contained(page)
    plots = plots_of(page)
    assert sorted(plots) == ["memory", "throughput"]
    winner = next(ln.split(": ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("winner: "))
    assert f"\u2605 {winner.strip()}" in texts(plots["throughput"])
    assert "HBM per chip: 15.8 GiB" in " ".join(texts(plots["memory"]))  # v5e: 16 GB, 15.75 GiB usable
    assert len(table_rows(page, "candidates")) <= 6 + report.MISFITS_SHOWN
