"""Every rule that names a backend capability agrees with the backend today: the torch.tpu names the catalogue
renames to or mentions exist, and the claims the rules' texts and fixes make (fused optimizer steps, Event
methods, the out-of-memory class, float16 autocast, Inductor on tpu, compile modes) hold on the tpu device."""

from __future__ import annotations

import re
import textwrap
import warnings

import pytest
import torch

from tputool.backend import op_plan
from tputool.codemods.python import port_python
from tputool.codemods.python.tables import REFS
from tputool.rules.catalogue import all_rules
from tputool.rules.model import RENAME, Settings
from tputool.rules.port import FUSED_ON_TPU

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _resolve(dotted: str):
    obj = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def test_every_rename_into_torch_tpu_names_something_that_exists(tpu_device):
    targets = sorted({r.target for r in REFS.values() if r.kind == RENAME and (r.target or "").startswith("torch.tpu.")})
    assert "torch.tpu.get_device_properties" in targets
    missing = []
    for name in targets:
        try:
            _resolve(name)
        except AttributeError:
            missing.append(name)
    assert not missing


def test_every_torch_tpu_name_a_rule_text_mentions_exists(tpu_device):
    names = set()
    for rule in all_rules().values():
        text = " ".join(filter(None, (rule.message, rule.doc, rule.after)))
        names |= set(re.findall(r"torch\.tpu(?:\.[A-Za-z_]\w*)+", text))
    assert "torch.tpu.optimizers.AdamW" in names
    missing = []
    for name in sorted(names):
        try:
            _resolve(name)
        except AttributeError:
            missing.append(name)
    assert not missing


def _steps(name: str, device: str, fused: bool) -> torch.Tensor:
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4, 3).to(device))
    opt = getattr(torch.optim, name)([p], lr=0.1, **({"fused": True} if fused else {}))
    for i in range(3):
        p.grad = torch.full_like(p, 0.5 + i)
        opt.step()
    return p.detach().cpu()


@pytest.mark.parametrize("name", FUSED_ON_TPU)
def test_fused_steps_that_tpu418_leaves_alone_run_on_tpu_as_on_cpu(tpu_device, name, monkeypatch):
    # TPU418 does not report fused=True on these: the tpu device must run their fused step itself (no CPU
    # fallback) and compute what the CPU's step computes.
    monkeypatch.setenv("TPUTOOL_FALLBACK", "error")
    torch.testing.assert_close(_steps(name, tpu_device, fused=True), _steps(name, "cpu", fused=False), **TOL)
    out, findings = port_python(f"import torch\nopt = torch.optim.{name}(ps, lr=1e-3, fused=True)\n", "m.py",
                                Settings(unsafe_fixes=True))
    assert "fused=True" in out and not [f for f in findings if f.code == "TPU418"]


def test_fused_adagrad_that_tpu418_reports_has_no_tpu_step(tpu_device):
    # The rule's claim: other fused kernels have no tpu lowering and run on the CPU.
    assert "Adagrad" not in FUSED_ON_TPU
    assert op_plan.plan(torch.ops.aten._fused_adagrad_.default).route is op_plan.Route.CPU
    for name in FUSED_ON_TPU:
        op = getattr(torch.ops.aten, f"_fused_{name.lower()}_").default
        assert op_plan.plan(op).route is not op_plan.Route.CPU
    _, findings = port_python("import torch\nopt = torch.optim.Adagrad(ps, lr=1e-3, fused=True)\n", "m.py", Settings())
    assert [f.code for f in findings] == ["TPU418"]


def test_event_methods_tpu205_promises(tpu_device):
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    torch.ones(64, 64, device=tpu_device).sum().item()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0 and end.query()


def test_out_of_memory_is_the_class_tpu212_renames_to(tpu_device):
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(1 << 46, dtype=torch.uint8, device=tpu_device)


def test_float16_autocast_is_off_on_tpu_as_tpu303_says(tpu_device):
    a = torch.ones(4, 4, device=tpu_device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast("tpu", dtype=torch.float16):
            f16 = a @ a
    with torch.autocast("tpu", dtype=torch.bfloat16):
        bf16 = a @ a
    assert f16.dtype is torch.float32 and bf16.dtype is torch.bfloat16


def test_inductor_and_compile_modes_on_tpu_as_tpu415_and_tpu416_say(tpu_device):
    model = torch.nn.Linear(4, 2).to(tpu_device)
    x = torch.ones(3, 4, device=tpu_device)
    expected = model(x).cpu()
    torch.testing.assert_close(torch.compile(model, backend="tpu", mode="max-autotune")(x).cpu(), expected, **TOL)
    torch.testing.assert_close(torch.compile(model)(x).cpu(), expected, **TOL)  # Inductor's graph, handed over
    with pytest.raises(Exception, match="Inductor does not generate code for the tpu device"):
        torch.compile(torch.nn.Linear(4, 2).to(tpu_device), options={"epilogue_fusion": False})(x)


def test_a_ported_fused_adamw_script_trains_on_tpu_as_the_original_on_cpu(tpu_device, tmp_path):
    # The rule's fix agrees too: the default port leaves fused=True on AdamW and the step runs on tpu.
    src = textwrap.dedent("""
        import torch
        torch.manual_seed(0)
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
        model = torch.nn.Linear(3, 2).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
        for _ in range(3):
            loss = model(torch.ones(4, 3, device=device)).pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        RESULT = [p.detach().cpu() for p in model.parameters()]
        """)
    out, _ = port_python(src, "train.py", Settings())
    assert "device = 'tpu' if torch.tpu.is_available() else 'cpu'" in out and "fused=True" in out
    original, ported = {}, {}
    exec(compile(src, "train.py", "exec"), original)  # noqa: S102 - our own snippet
    exec(compile(out, "train.py", "exec"), ported)  # noqa: S102
    for a, b in zip(original["RESULT"], ported["RESULT"], strict=True):
        torch.testing.assert_close(b, a, **TOL)
