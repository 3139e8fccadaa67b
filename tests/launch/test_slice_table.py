"""The one slice table (tune's) against published slice shapes: Cloud TPU / GKE / xpk accelerator types, their
topology, hosts, chips per host, GKE accelerator label and machine type (GKE's TPU docs and
AI-Hypercomputer/xpk's system_characteristics.py), and the names users type."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tputool.cli import app
from tputool.errors import UserError
from tputool.tune.slices import parse_target
from tputool.tune.specs import GIB

# name as typed -> (topology, hosts, chips per host, GKE accelerator label, machine type)
PUBLISHED = {
    "v4-8": ("2x2x1", 1, 4, "tpu-v4-podslice", "ct4p-hightpu-4t"),
    "v4-16": ("2x2x2", 2, 4, "tpu-v4-podslice", "ct4p-hightpu-4t"),
    "v4-32": ("2x2x4", 4, 4, "tpu-v4-podslice", "ct4p-hightpu-4t"),
    "v4-64": ("2x4x4", 8, 4, "tpu-v4-podslice", "ct4p-hightpu-4t"),
    "v4-128": ("4x4x4", 16, 4, "tpu-v4-podslice", "ct4p-hightpu-4t"),
    "v5litepod-1": ("1x1", 1, 1, "tpu-v5-lite-podslice", "ct5lp-hightpu-1t"),
    "v5litepod-4": ("2x2", 1, 4, "tpu-v5-lite-podslice", "ct5lp-hightpu-4t"),
    "v5litepod-8": ("2x4", 1, 8, "tpu-v5-lite-podslice", "ct5lp-hightpu-8t"),
    "v5litepod-16": ("4x4", 4, 4, "tpu-v5-lite-podslice", "ct5lp-hightpu-4t"),
    "v5litepod-32": ("4x8", 8, 4, "tpu-v5-lite-podslice", "ct5lp-hightpu-4t"),
    "v5litepod-64": ("8x8", 16, 4, "tpu-v5-lite-podslice", "ct5lp-hightpu-4t"),
    "v5litepod-256": ("16x16", 64, 4, "tpu-v5-lite-podslice", "ct5lp-hightpu-4t"),
    "v5p-8": ("2x2x1", 1, 4, "tpu-v5p-slice", "ct5p-hightpu-4t"),
    "v5p-16": ("2x2x2", 2, 4, "tpu-v5p-slice", "ct5p-hightpu-4t"),
    "v5p-32": ("2x2x4", 4, 4, "tpu-v5p-slice", "ct5p-hightpu-4t"),
    "v5p-128": ("4x4x4", 16, 4, "tpu-v5p-slice", "ct5p-hightpu-4t"),
    "v6e-1": ("1x1", 1, 1, "tpu-v6e-slice", "ct6e-standard-1t"),
    "v6e-8": ("2x4", 1, 8, "tpu-v6e-slice", "ct6e-standard-8t"),
    "v6e-16": ("4x4", 4, 4, "tpu-v6e-slice", "ct6e-standard-4t"),
    "v6e-64": ("8x8", 16, 4, "tpu-v6e-slice", "ct6e-standard-4t"),
    "v6e-256": ("16x16", 64, 4, "tpu-v6e-slice", "ct6e-standard-4t"),
    "tpu7x-2": ("1x1x1", 1, 1, "tpu7x", "tpu7x-standard-1t"),
    "tpu7x-8": ("2x2x1", 1, 4, "tpu7x", "tpu7x-standard-4t"),
    "tpu7x-16": ("2x2x2", 2, 4, "tpu7x", "tpu7x-standard-4t"),
    "tpu7x-32": ("2x2x4", 4, 4, "tpu7x", "tpu7x-standard-4t"),
    "tpu7x-128": ("4x4x4", 16, 4, "tpu7x", "tpu7x-standard-4t"),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_shapes(name):
    topology, hosts, per_host, label, machine = PUBLISHED[name]
    sl = parse_target(name)
    assert (sl.gke_topology, sl.hosts, sl.chips_per_host, sl.chip.gke_accelerator, sl.machine_type) == \
        (topology, hosts, per_host, label, machine)
    assert sl.cloud_name == name
    assert sl.hosts * sl.chips_per_host == sl.chips_per_slice
    sl.check_hosts()


def test_every_generation_has_three_multi_host_sizes_checked():
    multi = {}
    for name, (_, hosts, *_rest) in PUBLISHED.items():
        if hosts > 1:
            multi.setdefault(parse_target(name).chip.name, []).append(name)
    assert {k: len(v) >= 3 for k, v in multi.items()} == dict.fromkeys(("v4", "v5e", "v5p", "v6e", "v7x"), True)


@pytest.mark.parametrize(("name", "cores", "hbm_gib"), [
    ("v4-32", 2, 32), ("v5p-32", 2, 95), ("v5e-16", 1, 15.75), ("v6e-256", 1, 31.25), ("tpu7x-8", 2, 192)])
def test_tensorcores_and_hbm_per_chip(name, cores, hbm_gib):
    sl = parse_target(name)
    assert sl.tensorcores_per_chip == cores
    assert sl.hbm_bytes_per_chip == hbm_gib * GIB


@pytest.mark.parametrize(("typed", "same"), [
    ("v5e-16", "v5litepod-16"), ("v7x-8", "tpu7x-8"), ("V6E-256", "v6e-256"), ("v5p-32", "v5p:2x2x4"),
    ("v5litepod-256x2", "v5e-256x2")])
def test_spellings_name_one_slice(typed, same):
    assert parse_target(typed) == parse_target(same)


def test_multi_slice_names():
    sl = parse_target("v6e-256x2")
    assert (sl.slices, sl.hosts, sl.n_chips, sl.name, sl.cloud_name) == (2, 64, 512, "v6e-256x2", "v6e-256")


@pytest.mark.parametrize("name", ["v5p-2", "v5e-2", "v7x-4"])
def test_shapes_no_host_holds_are_refused(name):
    with pytest.raises(UserError, match="no .* host holds"):
        parse_target(name).check_hosts()


def test_an_unknown_name_lists_the_near_ones():
    with pytest.raises(UserError) as e:
        parse_target("v5x-32")
    assert "v5p-32" in str(e.value) and "v5e-32" in str(e.value)
    with pytest.raises(UserError, match="v5litepod-16"):
        parse_target("v5litepd-16")


def test_launch_with_an_unknown_target_is_one_line_and_exit_2(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    r = CliRunner().invoke(app, ["launch", "--target", "v6f-256", "--via", "local", str(script)])
    assert isinstance(r.exception, UserError) and r.exception.exit_code == 2  # (main() prints it as one line)
    assert "v6e-256" in str(r.exception) and "\n" not in str(r.exception)
