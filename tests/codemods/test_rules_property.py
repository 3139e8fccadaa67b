"""Property test: programs built from CUDA snippets always port to parsable code, and porting is idempotent."""

from __future__ import annotations

import libcst as cst
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tputool.codemods.python import port_python
from tputool.rules.model import Settings

IMPORTS = [
    "import torch", "import torch as th", "from torch import cuda", "import torch.cuda as tc",
    "from torch.backends import cudnn", "from torch.cuda.amp import autocast, GradScaler",
    "from torch.cuda import amp", "import torch.distributed as dist", "import os",
    "from torch.nn.attention import sdpa_kernel, SDPBackend", "from apex.normalization import FusedLayerNorm",
]
# Statements (one line each; `{x}` is replaced by a variable name).
SNIPPETS = [
    "{x} = {x}.cuda()", "{x} = {x}.cuda(0, non_blocking=True)", "{x} = {x}.to('cuda:0')",
    "{x} = torch.zeros(3, device='cuda')", "device = 'cuda' if torch.cuda.is_available() else 'cpu'",
    "torch.backends.cudnn.benchmark = True", "cudnn.allow_tf32 = True", "torch.cuda.empty_cache()",
    "torch.cuda.synchronize()", "th.cuda.manual_seed_all(0)", "n = cuda.device_count()", "tc.synchronize()",
    "scaler = GradScaler()", "scaler = torch.cuda.amp.GradScaler(enabled=True)",
    "dist.init_process_group('nccl')", "model = torch.compile(model)", "{x} = f'cuda:{{rank}}'",
    "if {x}.is_cuda: {x} = {x}.cpu()", "torch.cuda.nvtx.range_push('a')", "torch.cuda.nvtx.range_pop()",
    "os.environ['CUDA_VISIBLE_DEVICES'] = '0'", "{x} = {x}.half()", "{x} = {x}.double()",
    "loss = {x}.item()", "torch.backends.cuda.matmul.allow_tf32 = True", "torch.backends.cudnn.deterministic = True",
    "ln = FusedLayerNorm(8)", "ok = torch.cuda.is_bf16_supported()", "torch.set_default_device('cuda')",
    "state = torch.load(p, map_location='cuda')", "{x} = {x}.to(local_rank)", "model = DDP(model, device_ids=[r])",
    "pass", "torch.cuda.set_device('cuda:1')", "e = torch.cuda.Event(enable_timing=True)",
    "opt = torch.optim.AdamW(ps, fused=True)", "torch.backends.cuda.enable_flash_sdp(True)",
    "{x} = torch.device('cuda', 1)", "{x} = 'cuda:%d' % i", "assert backend in ['gloo', 'nccl']",
    "torch.backends.cudnn.benchmark = True; torch.cuda.empty_cache()", "{x} = ({x}.cuda())",
    "{x} = [a.cuda() for a in {x}]", "if {x}.is_cuda and y.is_cuda: pass", "v = not {x}.is_cuda",
    "torch.cuda.nvtx.range_push('a'); torch.cuda.nvtx.range_pop()  # trailing comment",
    "with torch.backends.cuda.sdp_kernel(enable_math=False) as k: pass",
    "with sdpa_kernel(SDPBackend.MATH), torch.no_grad(): {x} = f({x})",
    "device = 'cuda' if 'cuda' in {x} else 'cpu'", "{x} = torch.zeros(\n    3,\n    device='cuda',\n)",
    "{x} = {x}.cuda()  # tputool: ignore[TPU101]", "torch.cuda.empty_cache()  # tputool: ignore",
]
# Block headers that wrap the following statements.
BLOCKS = ["with torch.autograd.profiler.emit_nvtx():", "if flag:", "for {x} in loader:", "def fn({x}, device='cuda'):", "with autocast():",
          "with torch.cuda.amp.autocast(dtype=torch.float16):", "while {x}:", "try:",
          "with sdpa_kernel(SDPBackend.MATH):", "with torch.autocast('cuda'):", "class C:"]
NAMES = ["x", "t", "model", "batch"]


@st.composite
def programs(draw) -> str:
    lines = draw(st.lists(st.sampled_from(IMPORTS), max_size=5, unique=True))
    for _ in range(draw(st.integers(1, 6))):
        x = draw(st.sampled_from(NAMES))
        if draw(st.booleans()):
            header = draw(st.sampled_from(BLOCKS)).format(x=x)
            lines.append(header)
            body = draw(st.lists(st.sampled_from(SNIPPETS), min_size=1, max_size=3))
            lines += ["    " + s.format(x=x) for s in body]
            if header == "try:":
                lines += ["except Exception:", "    " + draw(st.sampled_from(SNIPPETS)).format(x=x)]
        else:
            lines.append(draw(st.sampled_from(SNIPPETS)).format(x=x))
    return "\n".join(lines) + "\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=programs(), unsafe=st.booleans())
def test_port_output_parses_and_is_idempotent(src: str, unsafe: bool) -> None:
    cst.parse_module(src)  # the generator only builds valid programs
    opts = Settings(unsafe_fixes=unsafe)
    once, findings = port_python(src, "gen.py", opts)
    cst.parse_module(once)
    twice, findings2 = port_python(once, "gen.py", opts)
    assert twice == once
    assert not [f for f in findings2 if f.fixed]
    if once == src:
        assert not [f for f in findings if f.fixed]
