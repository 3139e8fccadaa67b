"""`*_like` factories on a tpu input honour `device=`, `dtype=` and `memory_format=` as PyTorch does, in every
eager mode: held against the same call on a CPU input."""

import pytest
import torch

LIKE = {
    "empty_like": lambda x, **kw: torch.empty_like(x, **kw),
    "zeros_like": lambda x, **kw: torch.zeros_like(x, **kw),
    "ones_like": lambda x, **kw: torch.ones_like(x, **kw),
    "full_like": lambda x, **kw: torch.full_like(x, 3.0, **kw),
    "rand_like": lambda x, **kw: torch.rand_like(x, **kw),
    "randn_like": lambda x, **kw: torch.randn_like(x, **kw),
    "randint_like": lambda x, **kw: torch.randint_like(x, 7, **kw),
}
RANDOM = {"rand_like", "randn_like", "randint_like"}
MODES = list(torch.tpu.EagerMode)


def _src(device):
    return torch.arange(12.0, device=device).reshape(3, 4).t()  # a transposed (non-contiguous) input


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("name", sorted(LIKE))
@pytest.mark.parametrize("kw", [{"device": "cpu"}, {"device": "cpu", "dtype": torch.float64},
                                {"device": torch.device("cpu"), "memory_format": torch.contiguous_format}, {}],
                         ids=["cpu", "cpu-float64", "cpu-contiguous", "same-device"])
def test_like_factory_matches_cpu(mode, name, kw):
    make = LIKE[name]
    with torch.tpu.eager_mode(mode):
        src = _src("tpu") * 1  # (a value the fused mode has not computed yet)
        torch.manual_seed(0)
        got = make(src, **kw)
    ref = torch.empty_strided(src.size(), src.stride()).copy_(src.cpu())  # the same values and strides on CPU
    torch.manual_seed(0)
    want = make(ref, **kw)
    assert got.device.type == ("cpu" if "device" in kw else "tpu")
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    if got.device.type == "cpu" and name != "empty_like":  # made on the CPU: CPU's values, CPU's generator
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    elif name not in RANDOM | {"empty_like"}:
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_like_factory_for_cuda_fails_as_on_cpu():
    with pytest.raises(Exception) as on_cpu:
        torch.zeros_like(torch.ones(2), device="cuda")
    with pytest.raises(type(on_cpu.value)):
        torch.zeros_like(torch.ones(2, device="tpu"), device="cuda")


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_random_like_to_cpu_uses_the_cpu_generator(name):
    src = _src("tpu")
    got = LIKE[name](src, device="cpu", generator=torch.Generator().manual_seed(4))
    want = LIKE[name](src.cpu(), generator=torch.Generator().manual_seed(4))
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, want, rtol=0, atol=0)
