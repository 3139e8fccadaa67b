"""torch.tpu: every public name of torch_tpu that has a meaning in the bundled backend."""

from __future__ import annotations

import pytest
import torch

import tputool.backend  # noqa: F401 - registers the device
from tputool.backend.runtime import DEFAULT_MODE, STATE

API = ("EagerMode Event Precision Stream allow_excess_precision current_device current_stream default_generators "
       "default_stream device device_count device_of eager_mode get_amp_supported_dtype get_device_name "
       "get_device_properties get_rng_state initial_seed is_available is_initialized manual_seed manual_seed_all "
       "precision set_device set_eager_mode set_rng_state set_stream stream synchronize topology_aware_mesh").split()


def test_every_public_name_exists():
    import jax

    missing = [n for n in API if not hasattr(torch.tpu, n)]
    assert missing == []
    assert torch.tpu.is_available() and torch.tpu.is_initialized()
    assert torch.tpu.device_count() == jax.device_count()
    assert torch.tpu.get_device_name() == jax.devices()[0].device_kind
    props = torch.tpu.get_device_properties(0)
    assert props.name == jax.devices()[0].device_kind and props.platform == jax.devices()[0].platform
    assert torch.tpu.current_device() == 0
    with torch.tpu.device(0):
        assert torch.tpu.current_device() == 0
    with pytest.raises(RuntimeError, match="invalid tpu device"):
        torch.tpu.set_device(torch.tpu.device_count())
    x = torch.ones(1, device="tpu")
    with torch.tpu.device_of(x):
        assert torch.tpu.current_device() == 0


def test_seeding_through_torch_and_torch_tpu():
    torch.manual_seed(123)
    assert torch.tpu.initial_seed() == 123
    a = torch.rand(5, device="tpu").cpu()
    torch.tpu.manual_seed(123)
    assert torch.equal(torch.rand(5, device="tpu").cpu(), a)
    s = torch.tpu.get_rng_state()
    assert s.dtype == torch.uint8 and s.device.type == "cpu"
    b = torch.rand(5, device="tpu").cpu()
    torch.tpu.set_rng_state(s)  # one argument, as torch.random.fork_rng/freeze_rng_state call it
    assert torch.equal(torch.rand(5, device="tpu").cpu(), b)
    with pytest.raises(ValueError):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))


def test_event_elapsed_time_and_streams():
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    y = torch.randn(64, 64, device="tpu") @ torch.randn(64, 64, device="tpu")
    end.record()
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0.0
    with pytest.raises(RuntimeError, match="enable_timing"):
        torch.tpu.Event().elapsed_time(torch.tpu.Event())
    s = torch.tpu.current_stream()
    assert s == torch.tpu.default_stream() and s.query()
    with torch.tpu.stream(torch.tpu.Stream()):
        z = y + 1
    torch.tpu.set_stream(s)
    torch.tpu.synchronize()
    assert z.shape == (64, 64)


def test_eager_modes():
    E = torch.tpu.EagerMode
    assert {m.name for m in E} == {"DEFER_NEVER_AND_LAUNCH_BLOCKING", "DEFER_NEVER", "DEFER_AND_FUSE"}
    assert torch.tpu.eager_mode() is DEFAULT_MODE
    with torch.tpu.eager_mode(E.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        assert STATE.blocking and torch.tpu.eager_mode() is E.DEFER_NEVER_AND_LAUNCH_BLOCKING
        assert (torch.ones(3, device="tpu") * 2).sum().item() == 6.0
    assert not STATE.blocking and torch.tpu.eager_mode() is DEFAULT_MODE
    with pytest.raises(ValueError):
        torch.tpu.set_eager_mode("fast")


def test_precision_maps_to_jax():
    import jax

    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        assert jax.config.jax_default_matmul_precision == "highest"
        (torch.ones(4, 4, device="tpu") @ torch.ones(4, 4, device="tpu")).cpu()
    assert jax.config.jax_default_matmul_precision is None
    torch.tpu.allow_excess_precision(False)
    assert jax.config.jax_default_matmul_precision == "highest"
    torch.tpu.allow_excess_precision(True)
    assert jax.config.jax_default_matmul_precision is None


def test_autocast_tpu():
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float32]
    lin = torch.nn.Linear(8, 8).to("tpu")
    x = torch.randn(4, 8, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = lin(x)
        s = torch.softmax(y, -1)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    ref = torch.nn.functional.linear(x.cpu().bfloat16(), lin.weight.cpu().bfloat16(), lin.bias.cpu().bfloat16())
    torch.testing.assert_close(y.cpu(), ref, atol=2e-2, rtol=2e-2)
    y.float().sum().backward()
    assert lin.weight.grad.dtype == torch.float32


def test_topology_aware_mesh():
    import jax

    mesh = torch.tpu.topology_aware_mesh()
    assert mesh.devices.size == jax.device_count() and mesh.axis_names == ("data",)
    with pytest.raises(ValueError):
        torch.tpu.topology_aware_mesh((1,), ("a", "b"))


def test_default_generators_are_the_default_stream():
    gens = torch.tpu.default_generators
    assert len(gens) == torch.tpu.device_count() and gens[0].device == torch.device("tpu", 0)
    torch.tpu.manual_seed(5)
    assert gens[0].initial_seed() == 5
    a = torch.rand(3, device="tpu").cpu()
    gens[0].manual_seed(5)  # seeds the default stream itself
    assert torch.equal(torch.rand(3, device="tpu").cpu(), a)
    assert torch.equal(gens[0].get_state(), torch.tpu.get_rng_state())
