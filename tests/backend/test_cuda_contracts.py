"""The tpu device keeps CUDA's contracts (issue 17): one device per op, bfloat16 autocast by default,
torch.OutOfMemoryError and memory statistics, synchronize waits for compiled work, fork-safe DataLoader workers."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import tputool.backend  # noqa: F401 - registers the device
from tputool.backend import runtime

MIXED = r"Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!"
MODES = [runtime.EagerMode.DEFER_NEVER, runtime.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
         runtime.EagerMode.DEFER_AND_FUSE]


@pytest.fixture(params=MODES, ids=lambda m: m.value)
def mode(request):
    """Each test in Strict, Debug and Fused eager mode."""
    runtime.set_mode(request.param)
    yield request.param
    runtime.set_mode(runtime.EagerMode.DEFER_NEVER)


# ---- one device per op ----------------------------------------------------------------------------------

def test_mixing_cpu_and_tpu_tensors_raises_as_on_cuda(mode):
    a = torch.randn(3, 3, device="tpu")
    b = torch.randn(3, 3)
    cases = {
        "cpu @ tpu": lambda: b @ a,
        "tpu @ cpu": lambda: a @ b,
        "tpu + cpu": lambda: a + b,
        "cat": lambda: torch.cat([a, b]),
        "where": lambda: torch.where(a > 0, a, b),
        "tpu model on a cpu batch": lambda: torch.nn.Linear(3, 3).to("tpu")(b),
        "cpu fallback op": lambda: torch.ops.aten.put.default(a, torch.tensor([0, 1]), a[0, :2]),
    }
    for name, f in cases.items():
        with pytest.raises(RuntimeError, match=MIXED.replace("!", "")):
            f()
            torch.tpu.synchronize()
        del name
    assert torch.equal((a + 1).cpu(), a.cpu() + 1)  # the device still works afterwards


def test_cpu_scalars_indices_and_copies_still_mix(mode):
    a = torch.arange(6.0, device="tpu").reshape(2, 3)
    ca = a.cpu()
    assert torch.equal((a + torch.tensor(2.0)).cpu(), ca + 2)  # a 0-dim CPU tensor is a scalar
    assert torch.equal((a * torch.tensor(3)).cpu(), ca * 3)
    assert torch.equal(a[torch.tensor([1, 0])].cpu(), ca[torch.tensor([1, 0])])  # CPU indices, as CUDA allows
    assert torch.equal(a[torch.tensor([True, False])].cpu(), ca[torch.tensor([True, False])])
    b = a.clone()
    b[torch.tensor([0]), torch.tensor([2])] = torch.tensor(9.0, device="tpu")
    cb = ca.clone()
    cb[torch.tensor([0]), torch.tensor([2])] = 9.0
    assert torch.equal(b.cpu(), cb)
    c = torch.empty(2, 3, device="tpu")
    c.copy_(ca)  # copies between devices are legal
    assert torch.equal(c.cpu(), ca)
    assert torch.equal(ca.to("tpu").cpu(), ca)
    assert torch.equal(torch.tensor([[1.0, 2.0]], device="tpu").cpu(), torch.tensor([[1.0, 2.0]]))
    assert torch.equal(torch.zeros_like(ca, device="tpu").cpu(), torch.zeros(2, 3))
    assert torch.ones(2, device="tpu").new_tensor([1.0, 2.0]).device.type == "tpu"


def test_compiled_graph_keeps_each_output_on_its_device():
    def f(x, y):
        return x.sin(), y.cos()

    x, y = torch.randn(3, device="tpu"), torch.randn(3)
    gx, gy = torch.compile(f, backend="tpu")(x, y)
    assert gx.device.type == "tpu" and gy.device.type == "cpu"
    torch.testing.assert_close(gy, y.cos())


def test_compiled_model_on_cpu_batch_raises():
    m = torch.compile(torch.nn.Linear(3, 3).to("tpu"), backend="tpu")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        m(torch.randn(2, 3))


# ---- autocast ---------------------------------------------------------------------------------------------

def test_autocast_defaults_to_bfloat16():
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    a = torch.randn(4, 4, device="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("tpu"):
            assert (a @ a).dtype == torch.bfloat16
        with torch.autocast(device_type=a.device.type):
            assert torch.nn.functional.linear(a, a).dtype == torch.bfloat16
    assert (a @ a).dtype == torch.float32


# ---- out of memory and memory statistics ---------------------------------------------------------------

def test_impossible_allocation_raises_out_of_memory_at_the_call():
    for make in (lambda: torch.empty(1 << 40, device="tpu"), lambda: torch.zeros(1 << 40, device="tpu"),
                 lambda: torch.empty((1 << 20, 1 << 20), dtype=torch.float64, device="tpu")):
        with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory. Tried to allocate"):
            make()
    assert torch.ones(2, device="tpu").sum().item() == 2.0


def test_jax_out_of_memory_becomes_torch_out_of_memory(mode):
    x = torch.ones(1, device="tpu", dtype=torch.uint8)
    with pytest.raises(torch.OutOfMemoryError) as info:
        y = x.expand(1 << 44).contiguous()  # 16 TiB: past the pre-check (a view's copy), JAX refuses it
        torch.tpu.synchronize()  # (Fused mode runs it here)
        del y
    assert isinstance(info.value, RuntimeError)
    assert "RESOURCE_EXHAUSTED" in str(info.value.__cause__)
    torch.tpu.synchronize()
    assert torch.ones(2, device="tpu").sum().item() == 2.0


def test_memory_statistics_follow_live_buffers():
    torch.tpu.synchronize()
    gc.collect()  # (earlier tests' garbage holding small device arrays, collected mid-test, would move the base)
    torch.tpu.empty_cache()
    base = torch.tpu.memory_allocated()
    x = torch.ones(1 << 20, device="tpu")  # 4 MiB, materialized
    x.add_(1)
    torch.tpu.synchronize()
    grown = torch.tpu.memory_allocated()
    assert grown - base >= 4 << 20
    assert torch.tpu.max_memory_allocated() >= grown
    del x
    torch.tpu.empty_cache()
    assert torch.tpu.memory_allocated() <= grown - (4 << 20)
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    assert stats["allocated_bytes.all.peak"] == torch.tpu.max_memory_allocated()
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated()


# ---- synchronize waits for every computation ----------------------------------------------------------

def _chain(x):
    for _ in range(6):
        x = torch.tanh(x @ x)
    return x


def _ready(t: torch.Tensor) -> bool:
    return t.untyped_storage()._tpu.is_ready()


def test_synchronize_waits_for_compiled_graph_outputs():
    x = torch.randn(1024, 1024, device="tpu") / 32
    f = torch.compile(_chain, backend="tpu")
    f(x)  # compile
    torch.tpu.synchronize()
    y = f(x)
    torch.tpu.synchronize()
    assert _ready(y)
    z = f(x)
    ev = torch.tpu.Event()
    ev.record()
    ev.synchronize()
    assert _ready(z)


def test_synchronize_waits_for_fused_results():
    runtime.set_mode(runtime.EagerMode.DEFER_AND_FUSE)
    try:
        x = torch.randn(1024, 1024, device="tpu") / 32
        _chain(x)
        torch.tpu.synchronize()
        y = _chain(x)
        torch.tpu.synchronize()
        assert _ready(y)
    finally:
        runtime.set_mode(runtime.EagerMode.DEFER_NEVER)


# ---- DataLoader workers -----------------------------------------------------------------------------------

LOADER = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class DS(Dataset):
        def __len__(self):
            return 8
        def __getitem__(self, i):
            return {WORK}

    x = torch.ones(2, device="tpu") + 1  # JAX is running (threads started) before the workers fork
    total = 0.0
    for b in DataLoader(DS(), batch_size=4, num_workers=2, pin_memory={PIN}):
        assert b.is_pinned() == {PIN}
        total += b.to("tpu").sum().item()
    print("total", total)
""")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("pin", [False, True])
def test_dataloader_workers_fork_quietly(pin):
    proc = _run(LOADER.replace("{WORK}", "torch.full((4,), float(i))").replace("{PIN}", str(pin)))
    assert proc.returncode == 0, proc.stderr
    assert "total 112.0" in proc.stdout
    assert "fork" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_tpu_use_in_a_forked_worker_raises_instead_of_hanging(mode):
    set_mode = f"torch.tpu.set_eager_mode(torch.tpu.EagerMode.{mode})\n"
    started = 'x = torch.ones(2, device="tpu") + 1'
    assert started in LOADER
    proc = _run(LOADER.replace(started, set_mode + started)
                .replace("{WORK}", "torch.ones(4, device='tpu').cpu()").replace("{PIN}", "False"))
    assert proc.returncode != 0
    assert "forked" in proc.stderr and "RuntimeError" in proc.stderr, proc.stderr[-2000:]


def test_pin_memory_marks_batches_pinned():
    from torch.utils.data import DataLoader

    for b in DataLoader(torch.arange(8.0), batch_size=4, pin_memory=True):
        assert b.is_pinned()
    t = torch.ones(3)
    assert not t.is_pinned()
    assert t.pin_memory().is_pinned()


def test_data_parallel_over_one_tpu_device_runs_as_on_one_gpu(mode) -> None:
    """`nn.DataParallel(model).to("tpu")` (pytorch/examples imagenet's one-GPU path) computes what the module does,
    gradients reaching a CPU input too, as DataParallel does over one CUDA GPU (before: PyTorch's CUDA-only
    `torch._C._scatter` was missing); over several tpu devices it is a clear error naming DDP (TPU410)."""
    import copy

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = torch.nn.DataParallel(copy.deepcopy(ref)).to("tpu")
    assert model.device_ids == [0]
    x = torch.randn(3, 4)
    for inp in (x.clone().requires_grad_(), x.to("tpu")):
        out = model(inp)
        assert out.device.type == "tpu"
        torch.testing.assert_close(out.cpu(), ref(x))
    xin = x.clone().requires_grad_()
    model(xin).sum().backward()
    xref = x.clone().requires_grad_()
    ref(xref).sum().backward()
    torch.testing.assert_close(xin.grad, xref.grad)
    torch.testing.assert_close(model.module[0].weight.grad.cpu(), ref[0].weight.grad)
    with pytest.raises(NotImplementedError, match=r"over 2 tpu devices.*DistributedDataParallel.*TPU410"):
        torch.nn.parallel.comm.scatter(x, [0, 1])


def test_index_put_of_another_dtype_raises_as_on_cuda(mode):
    """gpt-fast's mixtral KV cache is bfloat16 and its float32 keys were written into it: CPU and CUDA raise, tpu cast
    them silently and failed later, at attention."""
    for device in ("cpu", "tpu"):
        x = torch.zeros(2, 4, dtype=torch.bfloat16, device=device)
        idx = torch.tensor([1], device=device)
        with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes match, got "
                                               "BFloat16 for the destination and Float for the source"):
            x[:, idx] = torch.ones(2, 1, device=device)
        with pytest.raises(RuntimeError, match="Index put requires"):
            x.index_put_((idx,), torch.ones(4, device=device))
        x[torch.tensor([True, False], device=device)] = torch.tensor(2.0)  # (one value through a mask: masked_fill)
        x[idx] = 3.0  # (a Python number takes the tensor's dtype)
        assert x.cpu().tolist() == [[2.0] * 4, [3.0] * 4]
