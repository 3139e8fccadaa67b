"""The default (safe) port keeps a program's meaning: a device moves as a whole concept or not at all.

Each snippet is our own code reproducing a pattern met in public CUDA repositories (see benchmarks/real_repos.py).
"""

from __future__ import annotations

import textwrap

from tputool.codemods.python import port_python
from tputool.rules.model import Settings, Severity


def port(src: str, unsafe: bool = False):
    out, findings = port_python(textwrap.dedent(src), "m.py", Settings(unsafe_fixes=unsafe))
    return out, findings


def codes(findings, fixed=None) -> set[str]:
    return {f.code for f in findings if fixed is None or f.fixed is fixed}


def test_device_type_derived_from_the_device_moves_with_it():
    out, findings = port("""
        from contextlib import nullcontext
        import torch
        device = 'cuda'
        device_type = 'cuda' if 'cuda' in device else 'cpu'
        ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)
        use_fused = fused_available and device_type == 'cuda'
        """)
    assert "device = 'tpu'" in out
    assert "device_type = 'tpu' if 'tpu' in device else 'cpu'" in out
    assert "device_type == 'tpu'" in out
    assert "cuda" not in out
    assert not [f for f in findings if not f.fixed]


def test_sync_branch_on_a_device_parameter_stays_live():
    out, _ = port("""
        import torch
        def device_sync(device):
            if "cuda" in device:
                torch.cuda.synchronize(device)
            elif dev.type == "cuda":
                pass
        """)
    assert 'if "tpu" in device:\n        torch.tpu.synchronize(device)' in out
    assert 'elif dev.type == "tpu":' in out


def test_a_value_not_known_to_be_a_device_is_left_and_reported():
    src = "if kind == 'cuda':\n    pass\n"
    out, [f] = port(src)
    assert out == src and f.code == "TPU109" and f.fixable and not f.fixed


def test_fstring_device_and_availability_return():
    out, _ = port("""
        import torch as th
        def dev():
            if th.cuda.is_available():
                return th.device(f"cuda")
            return th.device("cpu")
        """)
    assert 'if th.tpu.is_available():\n        return th.device(f"tpu")' in out


def test_backend_map_keyed_by_device_type_gets_its_tpu_entry():
    out, _ = port("""
        import torch.distributed as dist
        def init(device):
            dist.init_process_group({"cuda": "nccl", "cpu": "gloo"}.get(device.type, "gloo"))
        """)
    assert '{"tpu": "tpu", "cpu": "gloo"}.get(device.type, "gloo")' in out


def test_defaults_in_getattr_environ_and_tuples_move():
    out, _ = port("""
        import os
        def conf(args, rest):
            d = getattr(args, "device", "cuda")
            e = os.environ.get("MY_DEVICE", "cuda")
            f = os.getenv("ACCEL", "cuda:0")
            return d, e, f, ("cuda:0",) + rest
        """)
    assert 'getattr(args, "device", "tpu")' in out
    assert 'os.environ.get("MY_DEVICE", "tpu")' in out and 'os.getenv("ACCEL", "tpu:0")' in out
    assert '("tpu:0",) + rest' in out


def test_argparse_compile_backend_const():
    out, _ = port("""
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--compile", nargs="?", const="inductor", default=None)
        """)
    assert 'const="tpu"' in out


def test_compile_mode_is_kept_and_runs_on_tpu():
    import torch

    out, findings = port("""
        import torch
        step = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        """)
    assert 'torch.compile(step, mode="reduce-overhead", fullgraph=True, backend="tpu")' in out
    assert codes(findings) == {"TPU415"}
    f = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead", fullgraph=True, backend="tpu")
    x = torch.arange(4.0, device="tpu")
    assert f(x).cpu().tolist() == [1.0, 3.0, 5.0, 7.0]


def test_bf16_supported_leaves_no_and_true():
    out, _ = port("""
        import torch
        dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'
        """)
    assert "dtype = 'bfloat16' if torch.tpu.is_available() else 'float16'" in out


def test_float16_as_data_is_never_rewritten_even_unsafe():
    src = textwrap.dedent("""
        import torch
        ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
        ok = dtype in {torch.float16, torch.bfloat16}
        if dtype == torch.float16:
            scale = True
        if device == 'cpu':
            x = x.half()
        if precision == 'float16':
            model_dtype = torch.float16
        amp_dtype = torch.bfloat16 if args.amp_dtype == 'bfloat16' else torch.float16
        """)
    out, findings = port(src, unsafe=True)
    assert out == src
    assert "TPU306" not in codes(findings)
    out, findings = port("import torch\nz = torch.zeros(3, dtype=torch.float16)\n", unsafe=True)
    assert "torch.bfloat16" in out  # a plain float16 use is still fixable with --unsafe-fixes


def test_grad_scaler_keeps_its_condition():
    out, findings = port("""
        import torch
        scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))
        """)
    assert "torch.amp.GradScaler(\"tpu\", enabled=(dtype == 'float16'))" in out


def test_fused_flag_follows_the_device():
    out, _ = port("""
        import torch
        device_type = 'cuda' if 'cuda' in device else 'cpu'
        opt = torch.optim.AdamW(params, lr=1e-3, fused=device_type == 'cuda')
        """)
    assert "fused=device_type == 'tpu'" in out


def test_set_default_tensor_type_cuda_half():
    out, findings = port("""
        import torch
        torch.set_default_tensor_type(torch.cuda.HalfTensor)
        """)
    assert 'torch.set_default_device("tpu"); torch.set_default_dtype(torch.float16)' in out
    assert "cuda" not in out


def test_noise_rules_stay_quiet_where_nothing_is_to_be_done():
    _, findings = port("""
        import torch
        try:
            import deepspeed
        except ImportError:
            deepspeed = None
        for step in range(10):
            loss = model(x.to(device))
            if step % 100 == 0:
                print(loss.item())
            torch.save(model.cpu().state_dict(), "m.pt")
        arr = np.zeros(3, dtype=np.float64)
        config = dict(head_dim=64, hidden_size=768)
        h = dict(head_dim=96)
        """)
    assert "TPU601" not in codes(findings) and "TPU307" not in codes(findings)
    assert sum(f.code == "TPU603" for f in findings) == 1
    [ds] = [f for f in findings if f.code.startswith("TPU5")]
    assert ds.severity is Severity.INFO
    _, findings = port("for b in data:\n    total += b.sum().item()\n")
    assert not findings  # a CPU-only file


def test_tpu419_silent_once_the_tpu_branch_exists():
    _, findings = port("""
        import torch
        if torch.tpu.is_available():
            device = 'tpu'
        elif torch.backends.mps.is_available():
            device = 'mps'
        """)
    assert "TPU419" not in codes(findings)


def test_guarded_data_parallel_is_a_warning():
    _, findings = port("""
        import torch
        if torch.cuda.device_count() > 1:
            model = torch.nn.DataParallel(model)
        """)
    [f] = [f for f in findings if f.code == "TPU410"]
    assert f.severity is Severity.WARNING


def test_bare_int_device_is_informational():
    _, findings = port("x = x.to(0)\n")
    assert [(f.code, f.severity) for f in findings] == [("TPU110", Severity.INFO)]


def test_uses_of_an_optional_import_are_informational():
    _, findings = port("""
        try:
            from apex import amp
            has_apex = True
        except ImportError:
            amp = None
            has_apex = False
        def step(loss, opt):
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
        """)
    assert findings and all(f.severity is Severity.INFO for f in findings)
    # (each message says what it is: the library imported, the rule's own text; timm's cuda.py read
    # "optional import (TPU504's library)" and "None (through an optional import ...)")
    assert [f.message.split(":")[0] for f in findings] == ["optional import of apex.amp",
                                                           "Apex AMP; use native torch.autocast('tpu', dtype=torch.bfloat16) (through an optional import"], findings


def test_a_class_with_its_own_cuda_method_is_reported():
    _, findings = port("""
        import torch
        class Batch:
            def cuda(self):
                self.x = self.x.cuda()
                return self
        """)
    own = [f for f in findings if not f.fixed]
    assert [(f.code, f.line) for f in own] == [("TPU101", 4)] and "its own cuda()" in own[0].message


def test_a_device_type_list_extended_with_the_privateuse1_backend_is_not_reported():
    """A list of device types without 'tpu' is reported (TPU109), unless its function appends the PrivateUse1
    backend's name, which is 'tpu' under TorchTPU (timm's and torch.optim's capturable-device lists)."""
    _, findings = port("""
        import torch
        def capturable():
            devices = ["cuda", "xpu", "hpu"]
            devices.append(torch._C._get_privateuse1_backend_name())
            return devices
        def plain():
            return ["cuda", "xpu"]
        """)
    assert [(f.code, f.line) for f in findings] == [("TPU109", 8)], findings
