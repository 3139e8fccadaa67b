"""Factories honour device=, dtype=, layout=, generator=, requires_grad= and pin_memory= as PyTorch does: each
call is held against the same call on CPU (device="cpu" while tpu is the default device gives CPU's tensor and,
with a CPU generator, CPU's values; on tpu the same dtype, shape, strides and autograd flags, and CPU's values
for the deterministic ones; a call CPU refuses is refused with the same exception type)."""

import pytest
import torch

FACTORIES = {
    "empty": lambda **k: torch.empty(2, 3, **k),
    "empty_strided": lambda **k: torch.empty_strided((2, 3), (1, 2), **k),
    "zeros": lambda **k: torch.zeros(2, 3, **k),
    "ones": lambda **k: torch.ones(2, 3, **k),
    "full": lambda **k: torch.full((2, 3), 2.5, **k),
    "full_int": lambda **k: torch.full((4,), 3, **k),
    "arange": lambda **k: torch.arange(0, 6, 1.5, **k),
    "arange_negative_start": lambda **k: torch.arange(-3, 6, 2.5, **k),
    "linspace": lambda **k: torch.linspace(0, 1, 5, **k),
    "logspace": lambda **k: torch.logspace(0, 1, 5, **k),
    "eye": lambda **k: torch.eye(3, **k),
    "tensor": lambda **k: torch.tensor([1.0, 2.0], **k),
    "rand": lambda **k: torch.rand(2, 3, **k),
    "randn": lambda **k: torch.randn(2, 3, **k),
    "randint": lambda **k: torch.randint(0, 9, (2, 3), **k),
    "randint_high": lambda **k: torch.randint(9, (2, 3), **k),
    "randperm": lambda **k: torch.randperm(7, **k),
    "normal": lambda **k: torch.normal(0.0, 2.0, (2, 3), **k),
}
RANDOM = {"rand", "randn", "randint", "randint_high", "randperm", "normal"}
UNSET = {"empty", "empty_strided"}  # (values not defined)
KWARGS = [{}, {"dtype": torch.float64}, {"dtype": torch.bfloat16}, {"dtype": torch.int32}, {"requires_grad": True},
          {"layout": torch.strided}, {"pin_memory": False}]
KW_IDS = ["default", "float64", "bfloat16", "int32", "requires_grad", "strided", "no_pin"]


def _call(make, kw: dict):
    try:
        return make(**kw)
    except Exception as e:  # noqa: BLE001 - compared with CPU's refusal
        return e


def _same_meta(got: torch.Tensor, want: torch.Tensor) -> None:
    assert (got.dtype, got.shape, got.stride(), got.requires_grad, got.is_leaf, got.layout) == \
        (want.dtype, want.shape, want.stride(), want.requires_grad, want.is_leaf, want.layout)


def _seeded(name: str, kw: dict, device: str) -> dict:
    """`kw` with a generator on `device` seeded alike, for a random factory."""
    return {**kw, "generator": torch.Generator(device).manual_seed(3)} if name in RANDOM else kw


@pytest.mark.parametrize("kw", KWARGS, ids=KW_IDS)
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_cpu_factory_under_tpu_default_device_is_cpus(name, kw):
    make = FACTORIES[name]
    want = _call(make, _seeded(name, {**kw, "device": "cpu"}, "cpu"))
    torch.set_default_device("tpu")
    try:
        got = _call(make, _seeded(name, {**kw, "device": "cpu"}, "cpu"))
    finally:
        torch.set_default_device(None)
    if isinstance(want, Exception):
        assert type(got) is type(want), got
        return
    assert got.device.type == "cpu"
    _same_meta(got, want)
    if name not in UNSET:
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # the CPU generator's values included


@pytest.mark.parametrize("kw", KWARGS, ids=KW_IDS)
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_tpu_factory_matches_cpu(name, kw):
    make = FACTORIES[name]
    want = _call(make, {**kw, "device": "cpu"})
    got = _call(make, _seeded(name, {**kw, "device": "tpu"}, "tpu"))
    if isinstance(want, Exception):
        assert type(got) is type(want), got
        return
    assert got.device.type == "tpu"
    _same_meta(got, want)
    if name in RANDOM:  # a tpu generator: the same seed gives the same values, and the default stream's
        again = make(**_seeded(name, {**kw, "device": "tpu"}, "tpu"))
        torch.tpu.manual_seed(3)
        default = make(**{**kw, "device": "tpu"})
        torch.testing.assert_close(got.cpu(), again.cpu(), rtol=0, atol=0)
        torch.testing.assert_close(got.cpu(), default.cpu(), rtol=0, atol=0)
    elif name not in UNSET:
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_tpu_factory_with_a_cpu_generator_fails_as_on_cuda():
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.randn(3, device="tpu", generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator"):
        torch.randint(0, 5, (3,), device="tpu", generator=torch.Generator())


@pytest.mark.parametrize("memory_format", [None, torch.preserve_format, torch.contiguous_format,
                                           torch.channels_last])
def test_copy_to_cpu_lays_out_as_pytorch_does(memory_format):
    base = torch.arange(24.0).reshape(1, 2, 3, 4)
    src = base.permute(0, 2, 3, 1)  # dense, not contiguous
    kw = {} if memory_format is None else {"memory_format": memory_format}
    got, want = base.to("tpu").permute(0, 2, 3, 1).to("cpu", **kw), src.to(torch.float64, **kw)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, src, rtol=0, atol=0)
    assert base[0, 0].to("tpu").t().cpu().stride() == (1, 4)  # (a transposed 3x4: CPU's and CUDA's strides)
