"""Data for the Python rules: qualified-name maps, call-name sets, argument names and patterns.

The per-rule tables (REFS, IMPORT_FINDINGS, STATEMENT_CALLS, WITH_UNWRAP, ASSIGN_TARGETS, the torch.cuda
catch-all) are derived from the rule catalogue's `Port` entries (registry.py); the rest is handler data.
`REFS` maps a qualified-name prefix to what a reference to it means. The reference pass looks up the
longest matching prefix of every outermost dotted name (`torch.cuda.Event` in
`torch.cuda.Event(enable_timing=True)`), so `torch.cuda.Event.elapsed_time` is covered by the
`torch.cuda.Event` entry and renamed by prefix substitution.
"""

from __future__ import annotations

import re

from tputool.codemods.python.registry import Ref, code_table, fallback, port_rules, refs
from tputool.rules.model import ASSIGN, FIND, OWNED, RENAME

# The per-rule name tables, derived from the catalogue's `Port` entries (tputool/rules/port.py).
_RULES = port_rules()
REFS: dict[str, Ref] = refs(_RULES)
# Any other name under this prefix (torch.cuda.*): its rule (TPU219).
CUDA_CATCH_ALL = fallback(_RULES)
# Import statements that are findings by themselves (module prefix -> code).
IMPORT_FINDINGS: dict[str, str] = code_table(_RULES, "imports")
# Statements removed (or rewritten) as a whole: an expression-statement call of these names.
STATEMENT_CALLS: dict[str, str] = code_table(_RULES, "statements")
# Context managers unwrapped from `with` statements.
WITH_UNWRAP: dict[str, str] = code_table(_RULES, "unwrap")
# Assignment targets (qualified-name prefix -> code) handled as whole statements.
ASSIGN_TARGETS: dict[str, str] = code_table(_RULES, "assigns")
__all__ = ["ASSIGN", "FIND", "OWNED", "RENAME", "Ref"]  # re-exported for the handlers

# torch.ops namespaces that are not custom extensions.
BUILTIN_OP_NAMESPACES = frozenset({"aten", "prims", "quantized", "higher_order", "_c10d_functional", "c10d",
                                   "_c10d_functional_autograd", "profiler", "tpu", "_quantized", "rngprims",
                                   "mkldnn", "_dtensor", "quantized_decomposed", "torchvision"})

AUTOCAST_CUDA = frozenset({"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"})
AUTOCAST_GENERIC = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})
# torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True): positional order.
CUDA_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")
GRAD_SCALERS = frozenset({"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler",
                          "torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"})
CUDA_GRAD_SCALERS = frozenset({"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"})
CUSTOM_FWD_BWD = {"torch.cuda.amp.custom_fwd": "custom_fwd", "torch.cuda.amp.custom_bwd": "custom_bwd"}
FP16_QNAMES = frozenset({"torch.float16", "torch.half"})

DDP_QNAMES = frozenset({"torch.nn.parallel.DistributedDataParallel",
                        "torch.nn.parallel.distributed.DistributedDataParallel"})
INIT_PROCESS_GROUP = frozenset({"torch.distributed.init_process_group",
                                "torch.distributed.distributed_c10d.init_process_group"})
COMPILE_INDUCTOR_KWARGS = ("options",)  # torch.compile's mode= stays: the tpu backend accepts it

# Modules whose `.cuda`, `.half()`, `.item()` ... are not torch tensor methods.
FOREIGN_MODULES = frozenset({"numba", "cupy", "pycuda", "cuda", "cudf", "nvidia", "tensorflow", "jax", "triton",
                             "numpy", "cv2"})

# Device-string literals: "cuda", "cuda:0".
CUDA_DEVICE_RE = re.compile(r"^cuda(:\d+)?$")
# Keyword arguments that carry a device (besides device= / device_type=).
DEVICE_KWARG_RE = re.compile(r"^(device|device_type|\w+_device)$")
NOT_DEVICE_KWARGS = frozenset({"pin_memory_device", "output_device", "map_location"})
# Variables that hold a device (a default of 'cuda' there is TPU108).
DEVICE_NAME_RE = re.compile(r"(^|_)(device|dev|device_type|device_name|accelerator)$", re.I)
# Arguments of .cuda(x) passed through as-is to .to(x): already a device, not an index.
DEVICE_VALUE_RE = re.compile(r"(^|_)(device|dev)$")
# Names that hold a rank/GPU index (TPU110).
RANK_NAME_RE = re.compile(r"^(local_rank|rank|gpu|gpu_id|gpu_idx|device_id|device_idx|cuda_device|local_gpu)$")

OPTIMIZER_NAMES = frozenset({"Adam", "AdamW", "SGD", "Adagrad", "Adamax", "NAdam", "RAdam", "RMSprop",
                             "Adadelta", "ASGD", "Rprop", "SparseAdam", "LBFGS"})
HOST_SYNC_METHODS = frozenset({"item", "cpu", "tolist", "numpy"})
DYNAMIC_SHAPE_FUNCS = frozenset({"nonzero", "unique", "unique_consecutive", "masked_select", "argwhere"})
INT64_SORTS = frozenset({"sort", "argsort", "topk", "msort"})
DIM_NAMES = frozenset({"head_dim", "hidden_size", "d_model", "n_embd", "embed_dim", "hidden_dim",
                       "intermediate_size", "dim_head", "head_size", "ffn_dim", "d_ff", "kv_channels",
                       "d_head", "d_kv"})
FP16_STRINGS = {"float16": "bfloat16", "fp16": "bf16", "half": "bfloat16", "torch.float16": "torch.bfloat16"}
FP64_STRINGS = frozenset({"float64", "double", "torch.float64", "f8"})
NUMPY_FP64 = frozenset({"numpy.float64", "numpy.double"})
FP16_KWARGS = {"fp16": "bf16", "half_precision_backend": None}
FP16_STRING_KWARGS = frozenset({"dtype", "torch_dtype", "mixed_precision", "precision", "amp_dtype",
                                "compute_dtype", "param_dtype"})
CUDA_VISIBLE = frozenset({"CUDA_VISIBLE_DEVICES"})
CUDA_ENV_EXACT = frozenset({"CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_CUDA_ARCH_LIST",
                            "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING", "CUDA_MODULE_LOADING",
                            "CUBLAS_WORKSPACE_CONFIG"})
CUDA_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")
GPU_MODEL_RE = re.compile(r"\b(A100|H100|H200|B200|V100|A10G?|A6000|L4|L40S?|T4|RTX\s?\d+)\b")

# Packages whose names rules rewrite: only shadowing one of these needs scope analysis to stay exact (a
# mis-resolved name of another package could at worst misplace a finding, never a rewrite).
RELEVANT_ROOTS = frozenset({"torch", "apex"})
