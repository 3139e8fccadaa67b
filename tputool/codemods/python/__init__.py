"""The Python rewriter of `tputool port`: `port_python(source, path, settings)` and its pre-filter bytes."""

from __future__ import annotations

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import MetadataWrapper

from tputool.codemods.model import Finding, Settings
from tputool.codemods.python.imports_prune import prune_imports

# At least one of these byte strings appears in any file where a Python rule can fire; the engine skips
# files holding none of them (tests/codemods/test_rules_fixtures.py checks every fixture input has one).
PYTHON_TRIGGERS: tuple[bytes, ...] = (
    b"cuda", b"Cuda", b"CUDA", b"nccl", b"NCCL", b"half", b"float16", b"float64", b"double", b"triton",
    b"apex", b"bitsandbytes", b"flash_attn", b"flash_attention", b"xformers", b"deepspeed", b"cudnn",
    b"GradScaler", b"compile", b"nvtx", b"nvml", b"GPUtil", b"nvidia", b"fp16", b"sdp", b"fused",
    b"device_map", b"max_memory", b"load_in_", b"accelerate", b"Accelerator", b"DataParallel",
    b"FullyShardedDataParallel", b"device_ids", b"cpp_extension", b"torch.ops", b"_mm", b"channels_last",
    b"jit", b"mps", b"xpu", b"_inductor", b"ProfilerActivity", b"item", b"cpu", b"tolist", b"numpy",
    b"nonzero", b"unique", b"masked_select", b"argwhere", b"where", b"head_dim", b"hidden_size", b"d_model",
    b"n_embd", b"embed_dim", b"hidden_dim", b"intermediate_size", b"dim_head", b"head_size", b"ffn_dim",
    b"d_ff", b"kv_channels", b"d_head", b"d_kv", b"flop", b"FLOP", b"A100", b"H100", b"H200", b"B200",
    b"V100", b"A10", b"A6000", b"L4", b"T4", b"RTX", b"gpustat", b"set_default_tensor_type", b"peft",
    b"BitsAndBytes", b"sort", b"topk", b"device", b"map_location", b".to(", b"autocast", b"custom_fwd",
    b"custom_bwd", b"set_float32", b"backend", b"OutOfMemory",
)


def port_python(source: str, path: str, settings: Settings) -> tuple[str, list[Finding]]:
    """Rewrite one Python file for TPU; returns (new source, findings sorted by position).

    The source comes back identical when nothing changes. Raises libcst.ParserSyntaxError on input
    libcst cannot parse; never raises on valid Python.
    """
    from tputool.codemods.python.names import build_index
    from tputool.codemods.python.tables import RELEVANT_ROOTS
    from tputool.codemods.python.transformer import PortTransformer, ScopedPortTransformer

    module = cst.parse_module(source)
    index = build_index(source, RELEVANT_ROOTS)
    context = CodemodContext(filename=path)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    cls = PortTransformer if index.exact else ScopedPortTransformer
    transformer = cls(context, source, path, settings, wrapper, index)
    new_module = wrapper.visit(transformer)
    transformer.finish()
    findings = sorted(transformer.findings, key=lambda f: (f.line, f.col, f.code))
    if not any(f.fixed for f in findings):
        return source, findings
    if context.scratch.get(AddImportsVisitor.CONTEXT_KEY):
        new_module = AddImportsVisitor(context).transform_module(new_module)
    new_module = prune_imports(new_module, transformer.prune)
    return new_module.code, findings


__all__ = ["PYTHON_TRIGGERS", "port_python"]
