"""`tputool parity --html`: each compared record's error against its tolerance, step by step, with the first
departure starred; end to end on a script of our own that departs from its second step on."""

from __future__ import annotations

import json

import pytest
import torch

from tests.reports.conftest import (
    SCRIPTS,
    assert_self_contained,
    group,
    markers,
    plots_of,
    table_rows,
    texts,
    tputool,
)
from tputool.parity.compare import diff
from tputool.reports import parity as report
from tputool.reports.plots import short


@pytest.mark.parametrize("scale", [0.0, 1e-7, 1e-5, 1e-3, 1e-1])
def test_ratio_above_one_is_exactly_a_departure(scale):
    torch.manual_seed(0)
    ref = torch.randn(64, 32)
    for step in (0, 2):
        d = diff({"value": ref + scale * torch.randn_like(ref), "dtype": "torch.float32"},
                 {"value": ref, "dtype": "torch.float32"}, step)
        assert (d["ratio"] > 1) == d["beyond"], d


def test_ratio_of_a_nan_mismatch_and_of_an_exact_dtype_is_infinite():
    nan = diff({"value": torch.tensor([float("nan"), 1.0]), "dtype": "torch.float32"},
               {"value": torch.tensor([0.0, 1.0]), "dtype": "torch.float32"})
    ints = diff({"value": torch.tensor([1, 2]), "dtype": "torch.int64"},
                {"value": torch.tensor([1, 3]), "dtype": "torch.int64"})
    assert nan["ratio"] == ints["ratio"] == float("inf") and nan["beyond"] and ints["beyond"]


@pytest.fixture(scope="module")
def drift(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity") / "parity.html"
    r = tputool("parity", str(SCRIPTS / "drift_mlp.py"), "--format", "json", "--html", str(out))
    assert r.returncode == 1, r.stderr  # a departure: parity's usual status
    return json.loads(r.stdout), out.read_text()


def test_the_page_plots_every_record_per_step_and_stars_the_first_departure(drift):
    doc, page = drift
    assert_self_contained(page)
    plots = plots_of(page)
    assert sorted(plots) == ["records", "steps"]
    first = report.first_departure(doc)
    assert first["module"] == "Net.blocks.1" and first["step"] == 1
    records = plots["records"]
    for step in range(doc["steps"]):
        for panel, kinds, _ in report.PANELS:
            n = sum(1 for lv in doc["levels"] if lv["step"] == step and lv["kind"] in kinds)
            assert markers(group(records, f"step{step}-{panel}")) == n
    assert markers(group(records, "first-departure")) == 1
    starred = f"first departure: Net.blocks.1, step 1 ({short(report.ratio(first))}x)"
    assert starred in texts(records)
    level = next(lv for lv in doc["levels"] if lv["key"] == first["key"])
    assert report.ratio(level) == report.ratio(first) > 1


def test_per_step_maxima_match_the_levels(drift):
    doc, page = drift
    maxima = report.step_maxima(doc)
    assert [s for s, _, _ in maxima] == [s["step"] for s in doc["per_step"]]
    assert maxima[0][1] < 1 and maxima[1][1] > 1  # step 0 agrees, step 1 departs
    for step, out, grad in maxima:
        assert out == max(report.ratio(lv) for lv in doc["levels"] if lv["step"] == step and lv["kind"] != "grad")
        assert grad == max(report.ratio(lv) for lv in doc["levels"] if lv["step"] == step and lv["kind"] == "grad")
    labels = texts(plots_of(page)["steps"])
    assert all(short(v) in labels for _, *vs in maxima for v in vs)
    rows = table_rows(page, "steps")
    assert [r[1] for r in rows] == [short(o) for _, o, _ in maxima]
    assert [int(r[3]) for r in rows] == [s["beyond"] for s in doc["per_step"]]
    beyond = table_rows(page, "beyond")
    assert len(beyond) == sum(lv["beyond"] for lv in doc["levels"])
    assert all(float(r[5]) > 1 for r in beyond)


def test_a_clean_run_has_no_star():
    clean = {"script": "s.py", "verdict": "No departure", "steps": 1, "slack": 8.0, "findings": [],
             "reference": {"device": "cpu", "records": 2}, "tpu": {"records": 2},
             "levels": [{"key": f"0/{k}", "kind": k, "name": "m", "call": 0, "step": 0, "file": "s.py", "line": 3,
                         "dtype": "torch.float32", "ratio": r, "beyond": False, "max_abs": 0.0, "max_rel": 0.0}
                        for k, r in (("out", 0.01), ("grad", 0.2))],
             "per_step": [{"step": 0, "records": 2, "beyond": 0, "max_abs": 0.0}]}
    page = report.render(clean)
    assert_self_contained(page)
    assert "first-departure" not in page and sorted(plots_of(page)) == ["records", "steps"]
