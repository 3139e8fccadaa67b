"""CUDA-only code the port leaves as CUDA, and pairs it moves together (issue 31/29 patterns, our own snippets).

Each runnable snippet runs here, on a machine without CUDA, before and after the default port: the ported program
does what the original does (or fails where it fails), with the device moved where there is one to move.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from tputool.codemods.discover import classify
from tputool.codemods.python import port_python
from tputool.codemods.text_scan import scan_text
from tputool.rules.model import Settings


def port(src: str, unsafe: bool = False, path: str = "m.py"):
    return port_python(textwrap.dedent(src), path, Settings(unsafe_fixes=unsafe))


def run(src: str) -> dict:
    scope: dict = {"__name__": "snippet"}
    exec(compile(src, "snippet.py", "exec"), scope)  # noqa: S102 - our own snippets
    return scope


def codes(findings, fixed=None) -> list[str]:
    return [f.code for f in findings if fixed is None or f.fixed is fixed]


# ---- a CUDA hardware query is not a device move ----

CAPABILITY = """
    import torch

    def sm_info():
        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(torch.device("cuda"))
        return props.major * 10 + props.minor, props.multi_processor_count

    def sms():
        return torch.cuda.get_device_properties("cuda").multi_processor_count if torch.cuda.is_available() else 1

    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.ones(3, device=device)
    RESULT = (sm_info(), sms(), (x * 2).sum().item())
    DEVICE = x.device.type
    """


def test_a_capability_query_and_its_guard_stay_cuda_and_the_ported_program_takes_the_non_cuda_path():
    src = textwrap.dedent(CAPABILITY)
    out, findings = port(src)
    assert 'props = torch.cuda.get_device_properties(torch.device("cuda"))' in out  # never half-moved
    assert "if not torch.cuda.is_available():" in out
    assert 'torch.cuda.get_device_properties("cuda").multi_processor_count if torch.cuda.is_available() else 1' in out
    assert "device = \"tpu\" if torch.tpu.is_available() else \"cpu\"" in out  # the device itself moves
    assert sorted(codes(findings, fixed=False)) == ["TPU203", "TPU203", "TPU220", "TPU220"]
    original, ported = run(src), run(out)
    assert original["RESULT"] == ported["RESULT"] == (None, 1, 6.0)
    assert (original["DEVICE"], ported["DEVICE"]) == ("cpu", "tpu")


COMPUTE_DTYPE = """
    import torch

    def compute_dtype():
        if torch.cuda.is_available():
            if torch.cuda.get_device_capability() >= (8, 0):
                return torch.bfloat16
            return torch.float32
        return torch.float32

    def sm_count():
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).multi_processor_count
        return 0
    """


def test_a_kept_capability_check_that_picks_bfloat16_says_the_port_computes_in_another_precision():
    out, findings = port(COMPUTE_DTYPE)
    assert "if torch.cuda.is_available():" in out and "torch.tpu" not in out
    guards = sorted((f.line, f.message) for f in findings if f.code == "TPU220")
    assert len(guards) == 2
    assert "picks torch.bfloat16 on a GPU" in guards[0][1] and "not the original's" in guards[0][1]
    assert "picks" not in guards[1][1]  # the SM count's guard chooses no dtype


def test_portable_property_reads_move_whole_module_and_argument():
    src = textwrap.dedent("""
        import torch
        NAME = torch.cuda.get_device_properties("cuda").name
        MEMORY = torch.cuda.get_device_properties(0).total_memory
        """)
    out, findings = port(src)
    assert 'torch.tpu.get_device_properties("tpu").name' in out and "cuda" not in out
    assert set(codes(findings)) == {"TPU202"} and all(f.fixed for f in findings)
    ported = run(out)
    assert isinstance(ported["NAME"], str) and ported["MEMORY"] >= 0


def test_capability_and_library_version_queries_keep_their_arguments():
    out, findings = port("""
        import torch
        cap = torch.cuda.get_device_capability(torch.device("cuda:0"))
        v = torch.backends.cudnn.version() if torch.cuda.is_available() else None
        """)
    assert 'torch.cuda.get_device_capability(torch.device("cuda:0"))' in out
    assert "torch.cuda.is_available()" in out  # it guards a cuDNN version query
    assert "TPU106" not in codes(findings)


# ---- a guard of a CUDA-only library stays a guard ----

def test_an_assertion_protecting_apex_stays_a_cuda_check_and_fails_as_the_original_does():
    src = textwrap.dedent("""
        import torch
        assert torch.cuda.is_available(), "CUDA required for APEX optimizers"
        """)
    out, findings = port(src)
    assert out == src and codes(findings) == ["TPU220"] and "APEX" in findings[0].message
    for program in (src, out):
        with pytest.raises(AssertionError, match="APEX"):
            run(program)


def test_a_block_importing_bitsandbytes_stays_behind_the_cuda_check():
    src = textwrap.dedent("""
        import torch
        USE_8BIT = False
        if torch.cuda.is_available():
            import bitsandbytes as bnb
            USE_8BIT = True
        """)
    out, findings = port(src)
    assert "if torch.cuda.is_available():" in out
    assert sorted(codes(findings)) == ["TPU220", "TPU509"]
    assert run(src)["USE_8BIT"] is run(out)["USE_8BIT"] is False  # no ImportError on TPU either


def test_a_plain_availability_assertion_still_moves():
    # Conservative: only a named CUDA-only dependency keeps the check; a GPU requirement is a device requirement.
    src = textwrap.dedent("""
        import torch
        assert torch.cuda.is_available(), "this script needs a GPU"
        x = torch.ones(2).cuda()
        """)
    out, findings = port(src)
    assert 'assert torch.tpu.is_available(), "this script needs a GPU"' in out and "TPU220" not in codes(findings)
    assert run(out)["x"].device.type == "tpu"


# ---- set and restore move together ----

def test_a_cuda_default_tensor_type_and_its_cpu_restore_move_together():
    src = textwrap.dedent("""
        import torch
        torch.set_default_tensor_type(torch.cuda.BFloat16Tensor)
        x = torch.zeros(2)
        torch.set_default_tensor_type(torch.FloatTensor)
        y = torch.zeros(2)
        """)
    out, findings = port(src)
    assert 'torch.set_default_device("cpu"); torch.set_default_dtype(torch.float32)' in out
    assert codes(findings, fixed=True) == ["TPU213", "TPU213"]
    with pytest.raises(TypeError):  # the original needs CUDA: it fails here, at the first line
        run(src)
    try:
        ported = run(out)
    finally:
        torch.set_default_device(None)
        torch.set_default_dtype(torch.float32)
    # What the original does on CUDA: x on the accelerator in bf16, y back on the CPU in float32.
    assert (ported["x"].device.type, ported["x"].dtype) == ("tpu", torch.bfloat16)
    assert (ported["y"].device.type, ported["y"].dtype) == ("cpu", torch.float32)


def test_a_cpu_default_tensor_type_alone_is_not_touched():
    src = "import torch\ntorch.set_default_tensor_type(torch.DoubleTensor)\n"
    out, findings = port(src)
    assert out == src and not findings


# ---- a callable reference is rewritten like a call ----

def test_partial_of_cuda_autocast_becomes_tpu_autocast_and_runs_in_bf16():
    src = textwrap.dedent("""
        import torch
        from functools import partial
        ctx = partial(torch.cuda.amp.autocast, dtype=torch.bfloat16)
        a = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
        with ctx():
            out = a.cuda() @ a.cuda()
        """)
    out, findings = port(src)
    assert 'ctx = partial(torch.autocast, "tpu", dtype=torch.bfloat16)' in out
    assert "TPU301" in codes(findings, fixed=True)
    ported = run(out)
    assert ported["out"].dtype is torch.bfloat16  # autocast on, as on CUDA
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = ported["a"] @ ported["a"]
    torch.testing.assert_close(ported["out"].cpu(), reference, rtol=2e-2, atol=2e-2)


# ---- reported CUDA-only dependencies and kernels ----

def test_nccl_import_rapids_and_cuda_only_custom_ops_are_reported():
    _, findings = port("""
        import torch
        import torch.cuda.nccl as nccl
        from cuml.cluster import KMeans

        @torch.library.custom_op("demo::double", mutates_args=(), device_types="cuda")
        def double(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        torch.library.register_kernel("demo::triple", "cuda")(lambda x: x * 3)
        """)
    found = {(f.code, f.line) for f in findings}
    assert {("TPU408", 3), ("TPU513", 4), ("TPU502", 6), ("TPU502", 10)} <= found
    ops = [f.message for f in findings if f.code == "TPU502"]
    assert "demo::double" in ops[0] and "demo::triple" in ops[1]


def test_a_custom_op_registered_for_tpu_too_is_not_reported():
    _, findings = port("""
        import torch
        @torch.library.custom_op("demo::inc", mutates_args=(), device_types=("cuda", "tpu"))
        def inc(x: torch.Tensor) -> torch.Tensor:
            return x + 1
        """)
    assert "TPU502" not in codes(findings)


@pytest.mark.parametrize(("name", "text"), [
    ("requirements.txt", "numpy\ncuml-cu11==23.4.0\ncudf-cu12\n"),
    ("environment.yml", "name: demo\ndependencies:\n  - cuml=23.04\n  - pip:\n    - dask-cudf-cu12\n"),
])
def test_rapids_dependencies_are_reported(name, text):
    found = [f for f in scan_text(text, name, classify(name), Settings()) if f.code == "TPU929"]
    assert len(found) == 2


# ---- check does not cry wolf ----

def test_serialized_torchscript_code_is_neither_ported_nor_reported():
    src = textwrap.dedent("""\
        class Net(Module):
          __parameters__ = []
          __buffers__ = []
          training : bool
          fc : __torch__.torch.nn.modules.linear.Linear
          def forward(self: __torch__.Net,
            x: Tensor) -> Tensor:
            _0 = torch.eq(ops.prim.type(ops.prim.device(x)), "cuda")
            x0 = torch.to(x, dtype=6, layout=0, device=torch.device("cuda:0"))
            return torch.mul(x0, CONSTANTS.c0)
        """)
    out, findings = port(src, path="model/code/__torch__.py")
    assert out == src and not findings
    # the same comparison in a program is still a finding
    _, findings = port("import torch\nif x.device.type == 'cuda':\n    pass\n")
    assert "TPU109" in codes(findings)


def test_a_model_placed_on_the_host_on_purpose_is_not_reported():
    _, findings = port("""
        from transformers import AutoModel
        a = AutoModel.from_pretrained("m", device_map={"": "cpu"})
        b = AutoModel.from_pretrained("m", device_map="cpu")
        c = AutoModel.from_pretrained("m", device_map="auto")
        d = AutoModel.from_pretrained("m", device_map={"": 0})
        """)
    assert [(f.code, f.line) for f in findings if f.code == "TPU115"] == [("TPU115", 5), ("TPU115", 6)]


DIFFUSION = """
    import math
    import torch

    def cosine_betas(steps, s=0.008):
        t = torch.linspace(0, steps, steps + 1, dtype=torch.float64) / steps
        ac = torch.cos((t + s) / (1 + s) * math.pi * 0.5) ** 2
        return torch.clip(1 - ac[1:] / ac[:-1], 0, 0.999)

    class Schedule(torch.nn.Module):
        def __init__(self, steps=10):
            super().__init__()
            betas = torch.linspace(1e-4, 0.02, steps, dtype=torch.float64)
            alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
            self.register_buffer("betas", betas.float())
            self.register_buffer("sqrt_ac", alphas_cumprod.sqrt().to(dtype=torch.float32))
            self.register_buffer("cosine", cosine_betas(steps).float())

    device = "cuda" if torch.cuda.is_available() else "cpu"
    s = Schedule().to(device)
    """


def test_a_float64_schedule_computed_at_init_and_stored_as_float32_is_not_reported():
    out, findings = port(DIFFUSION)
    assert "TPU307" not in codes(findings)
    original, ported = run(textwrap.dedent(DIFFUSION)), run(out)
    assert ported["s"].betas.device.type == "tpu" and ported["s"].betas.dtype is torch.float32
    torch.testing.assert_close(ported["s"].sqrt_ac.cpu(), original["s"].sqrt_ac)
    torch.testing.assert_close(ported["s"].cosine.cpu(), original["s"].cosine)
    # float64 sent to the device is still a finding
    _, findings = port(DIFFUSION.replace('betas.float())', 'betas.to(device))').replace(
        '.to(dtype=torch.float32))', '.to(device, torch.float64))').replace("float32", "float64"))
    assert "TPU307" in codes(findings)


def test_double_of_a_tensor_moved_to_the_host_is_not_reported():
    _, findings = port("""
        import torch
        x = torch.ones(2, device="cuda")
        total = x.cpu().double().sum()
        exact = x.detach().to("cpu").sum().double()
        kept = x.double()
        back = x.cpu().to("cuda").double()
        """)
    assert [(f.code, f.line) for f in findings if f.code == "TPU307"] == [("TPU307", 6), ("TPU307", 7)]


def test_dtype_tables_are_not_reported_but_a_chosen_dtype_is():
    _, findings = port("""
        import torch
        NAMES = {torch.float16: "f16", torch.float32: "f32", torch.float64: "f64"}
        PARSE = {"half": torch.half, "float": torch.float, "double": torch.double}
        KINDS = [torch.float, torch.float16, torch.int64]
        x = torch.ones(2, device="cuda", dtype=torch.float16)
        y = torch.ones(2, device="cuda", dtype=torch.float64)
        """)
    assert [(f.code, f.line) for f in findings if f.code in ("TPU306", "TPU307")] == [("TPU306", 6), ("TPU307", 7)]


def test_own_cuda_method_not_reported_when_the_class_has_to_or_was_ported():
    _, findings = port("""
        import torch
        class Ported:
            def cuda(self):
                self.x = self.x.to("tpu")
                return self
        class WithTo:
            def cuda(self):
                return self.to("cuda")
            def to(self, device):
                self.x = self.x.to(device)
                return self
        class Plain:
            def cuda(self):
                self.x = self.x.cuda()
                return self
        """)
    own = [(f.code, f.line) for f in findings if "its own cuda()" in f.message]
    assert own == [("TPU101", 14)]


def test_a_cuda_only_and_check_is_kept_whole_and_still_false_on_tpu():
    # pytorch/examples' FSDP bf16 check: one operand moved would half-move the check (its value is the same).
    src = textwrap.dedent("""
        import torch
        import torch.distributed as dist
        import torch.cuda.nccl as nccl

        def bfloat_support():
            return bool(torch.version.cuda and torch.cuda.is_bf16_supported() and dist.is_nccl_available()
                        and nccl.version() >= (2, 10))

        NEW_CUDA = torch.cuda.is_available() and torch.version.cuda >= "11"
        BF16 = bfloat_support()
        OK = torch.cuda.is_bf16_supported() and len("ab") > 1
        """)
    out, findings = port(src)
    assert "torch.version.cuda and torch.cuda.is_bf16_supported() and dist.is_nccl_available()" in out
    assert 'NEW_CUDA = torch.cuda.is_available() and torch.version.cuda >= "11"' in out  # moved: TypeError on TPU
    assert 'OK = len("ab") > 1' in out  # no CUDA query beside it: bf16 is supported on TPU
    assert "TPU220" in codes(findings)
    # the kept operand is reported where it is (a multi-line check otherwise shows only its first CUDA query)
    kept = [(f.code, f.line) for f in findings if f.message.startswith("torch.cuda.is_bf16_supported() is one operand")]
    assert kept == [("TPU220", 7)]
    original, ported = run(src), run(out)
    assert (original["NEW_CUDA"], original["BF16"]) == (ported["NEW_CUDA"], ported["BF16"]) == (False, False)
    assert ported["OK"] is True


# ---- `x.is_cuda` guarding a local module that imports a CUDA-only library (Whisper's timing.py) ----

TIMING = """
    import torch

    def median(x):
        result = None
        if x.is_cuda:
            try:
                from .triton_ops import median_kernel
                result = median_kernel(x)
            except RuntimeError:
                pass
        if result is None:
            result = x.sort()[0]
        return result

    def dtw_fast(x):
        from .triton_ops import dtw_kernel
        return dtw_kernel(x)

    def other(y):
        return y + 1

    def dtw(x):
        if x.is_cuda:
            return dtw_fast(x)
        return x.cpu()

    def place(x):
        if x.is_cuda:
            return x * 2
        return x
"""


def test_is_cuda_guarding_a_local_triton_module_is_kept_and_a_plain_one_moves(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "triton_ops.py").write_text("try:\n    import triton\nexcept ImportError:\n    raise RuntimeError('no')\n")
    out, findings = port(TIMING, path=str(pkg / "timing.py"))
    kept = [f for f in findings if f.code == "TPU220"]
    assert [f.line for f in kept] == [6, 24]
    assert "triton (through .triton_ops)" in kept[0].message and "in dtw_fast()" in kept[1].message
    assert out.count("x.is_cuda") == 2 and 'x.device.type == "tpu"' in out  # place() moves
    (pkg / "triton_ops.py").write_text("import torch\n")  # a local module with no CUDA-only import
    from tputool.codemods.python import cuda_only

    cuda_only._local_modules.clear()
    out, findings = port(TIMING, path=str(pkg / "timing.py"))
    assert "x.is_cuda" not in out and "TPU220" not in codes(findings)
