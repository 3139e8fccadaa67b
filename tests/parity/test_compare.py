"""parity's tensor comparison: what the dtypes explain, the tolerance assert_close needs, ULPs."""

import math

import pytest
import torch

from tputool.parity.compare import diff, lower_precision, tolerance, ulps


def _rec(t: torch.Tensor, dtype: torch.dtype | None = None) -> dict:
    return {"value": t.float(), "dtype": str(dtype or t.dtype), "stats": None}


def test_rounding_of_the_dtype_is_explained_and_a_real_change_is_not():
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(64, 64, generator=g)
    same = ref.to(torch.float64).add(1e-9).float()  # at most an ulp or so of float32
    assert not diff(_rec(same), _rec(ref))["beyond"]
    changed = ref.clone()
    changed[3, 4] += 1e-3
    d = diff(_rec(changed), _rec(ref))
    assert d["beyond"] and d["max_abs"] == pytest.approx(1e-3, rel=1e-3)


def test_the_reference_dtype_sets_the_tolerance_so_bf16_vs_float32_departs():
    g = torch.Generator().manual_seed(2)
    ref = torch.randn(256, generator=g) * 3
    low = ref.to(torch.bfloat16)
    assert diff(_rec(low), _rec(ref))["beyond"]  # bf16 output against a float32 reference
    assert not diff(_rec(low), _rec(ref.to(torch.bfloat16).float(), torch.bfloat16))["beyond"]


@pytest.mark.parametrize("scale", [1e-3, 1.0, 50.0])
def test_needed_tolerance_makes_assert_close_pass_and_a_smaller_one_fails(scale):
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(32, 8, generator=g) * scale
    x = ref + torch.randn(32, 8, generator=g) * scale * 1e-3
    need = diff(_rec(x), _rec(ref))["needed"]
    torch.testing.assert_close(x, ref, rtol=need["at_rtol"], atol=need["atol"] * (1 + 1e-6) + 1e-30)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(x, ref, rtol=need["at_rtol"], atol=need["atol"] * 0.9)
    if math.isfinite(need["rtol"]):
        torch.testing.assert_close(x, ref, rtol=need["rtol"] * (1 + 1e-6), atol=need["at_atol"])


def test_later_steps_get_a_wider_tolerance():
    ref = torch.ones(10)
    x = ref + 2e-4  # step 0 explains 8 * (1e-5 + 1.3e-6); step 3 four times that
    assert diff(_rec(x), _rec(ref), step=0)["beyond"]
    assert not diff(_rec(x), _rec(ref), step=3)["beyond"]


def test_ulps_count_units_in_the_last_place():
    ref = torch.tensor([1.0, 2.0, 0.75], dtype=torch.float64)
    d = torch.tensor([2 ** -23, 2 * 2 ** -22, 0.0], dtype=torch.float64)
    assert ulps(d, ref, "torch.float32") == pytest.approx(2.0)
    assert ulps(torch.tensor([2 ** -7]), torch.tensor([1.0]), "torch.bfloat16") == pytest.approx(1.0)


def test_exact_dtypes_compare_exactly_and_shapes_must_match():
    a = {"value": torch.tensor([1, 2, 3]), "dtype": "torch.int64", "stats": None}
    b = {"value": torch.tensor([1, 2, 4]), "dtype": "torch.int64", "stats": None}
    assert tolerance("torch.int64") == (0.0, 0.0)
    assert diff(a, b)["beyond"] and not diff(a, a)["beyond"]
    assert diff(_rec(torch.zeros(3)), _rec(torch.zeros(4)))["beyond"]


def test_lower_precision():
    assert lower_precision("torch.bfloat16", "torch.float32")
    assert not lower_precision("torch.float32", "torch.float32")
    assert not lower_precision("torch.int64", "torch.float32")


def test_stats_of_a_big_tensor_are_exact_so_the_cpu_reference_does_not_depart_from_itself():
    """A tensor too big to keep is compared by summary stats. Summed in float32, CPU's norm of 16M elements is off
    by ~7e-4 (llm.c's 38.6M-element wte gradient: 2.4e-4), beyond float32's allowance: parity called a correct
    port's gradient a departure. Summed in float64 a chunk at a time, both sides agree with the exact values."""
    import tputool.backend  # noqa: F401 - registers the tpu device
    from tputool.parity.record import capture, exact_stats

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 24, generator=g) * 1e-3 + 1e-4
    assert abs(float(x.norm()) - float(x.double().norm())) / float(x.double().norm()) > 1e-4  # float32 is off
    s = exact_stats(x)
    x64 = x.double()
    assert s["mean"] == pytest.approx(float(x64.mean()), rel=1e-12)
    assert s["std"] == pytest.approx(float(x64.std()), rel=1e-12)
    assert s["norm"] == pytest.approx(float(x64.norm()), rel=1e-12)
    on_tpu, on_cpu = capture(x.to("tpu"), max_bytes=1 << 20), capture(x, max_bytes=1 << 20)
    assert on_cpu["value"] is None and on_cpu["stats"] == on_tpu["stats"]
    assert not diff(on_tpu, on_cpu)["beyond"]
    moved = capture(x * (1 + 1e-3), max_bytes=1 << 20)
    assert diff(moved, on_cpu)["beyond"]  # a real 1e-3 change still departs


def test_exact_stats_of_empty_and_single_element_tensors():
    from tputool.parity.record import exact_stats

    assert exact_stats(torch.tensor([2.0])) == {"mean": 2.0, "std": 0.0, "norm": 2.0}
    s = exact_stats(torch.zeros(0))
    assert math.isnan(s["mean"]) and s["norm"] == 0.0


def test_max_rel_leaves_out_elements_near_zero():
    """parity printed "step 0: max rel 8.67e+18" for llm.c's correct port: a gradient element of ~1e-25 off by
    1e-7 of the tensor's scale. The relative error is reported where it means something."""
    ref = torch.tensor([1.0, -2.0, 3e-25, 0.5])
    got = ref + torch.tensor([1e-7, 0.0, 2e-7, 0.0])
    d = diff(_rec(got), _rec(ref))
    assert not d["beyond"] and d["max_rel"] < 2e-7  # (the element of 1.0: one float32 ulp)
    assert diff(_rec(torch.zeros(3)), _rec(torch.zeros(3)))["max_rel"] == 0.0
