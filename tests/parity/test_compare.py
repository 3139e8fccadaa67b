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
