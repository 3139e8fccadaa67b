"""Data for the Python rules: qualified-name maps, call-name sets, argument names and patterns.

`REFS` maps a qualified-name prefix to what a reference to it means. The reference pass looks up the
longest matching prefix of every outermost dotted name (`torch.cuda.Event` in
`torch.cuda.Event(enable_timing=True)`), so `torch.cuda.Event.elapsed_time` is covered by the
`torch.cuda.Event` entry and renamed by prefix substitution.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RENAME, FIND, OWNED, ASSIGN = "rename", "find", "owned", "assign"


@dataclass(frozen=True)
class Ref:
    """What a reference means: a rename (target set), a finding, or owned by a call/statement handler."""

    code: str
    kind: str = FIND
    target: str | None = None  # qualified replacement for the matched prefix (RENAME)
    message: str | None = None
    note: str | None = None


def _many(names: str, code: str, kind: str = FIND, prefix: str = "torch.cuda.", target: str | None = None,
          message: str | None = None, note: str | None = None) -> dict[str, Ref]:
    """Entries for space-separated names under `prefix`; a RENAME maps each onto `target` + name."""
    out = {}
    for n in names.split():
        out[prefix + n] = Ref(code, kind, (target + n) if target else None, message, note)
    return out


_N_STREAM = "XLA orders TPU work itself; side streams rarely overlap anything, check the stream logic"

REFS: dict[str, Ref] = {
    # TPU201: same-meaning runtime calls
    **_many("is_available device_count current_device set_device synchronize manual_seed manual_seed_all "
            "initial_seed is_initialized", "TPU201", RENAME, target="torch.tpu."),
    **_many("get_device_name get_device_properties", "TPU202", RENAME, target="torch.tpu.",
            note="the properties object has TPU fields; CUDA-only ones (major/minor/multi_processor_count) are absent"),
    "torch.cuda.get_device_capability": Ref("TPU203"),
    "torch.cuda.is_bf16_supported": Ref("TPU204", OWNED),
    "torch.cuda.Event": Ref("TPU205", RENAME, "torch.tpu.Event",
                            note="torch.tpu.Event is assumed to offer record/elapsed_time/synchronize"),
    **_many("Stream stream current_stream default_stream set_stream", "TPU206", RENAME, target="torch.tpu.",
            note=_N_STREAM),
    **_many("device device_of", "TPU207", RENAME, target="torch.tpu.",
            note="prefer explicit devices: .to(torch.device('tpu', i))"),
    **_many("get_rng_state set_rng_state default_generators", "TPU208", RENAME, target="torch.tpu.",
            note="RNG streams differ between CUDA and TPU; saved CUDA states do not transfer"),
    **_many("get_rng_state_all set_rng_state_all", "TPU208",
            message="torch.cuda.*_rng_state_all has no torch.tpu equivalent; save one state per device"),
    **_many("memory_allocated max_memory_allocated memory_reserved max_memory_reserved reset_peak_memory_stats "
            "reset_max_memory_allocated memory_stats mem_get_info", "TPU209", RENAME, target="torch.tpu.",
            note="torch.tpu reads JAX's device memory statistics (live buffers where the platform reports none)"),
    **_many("reset_max_memory_cached reset_accumulated_memory_stats memory_stats_as_nested_dict memory_summary "
            "memory_snapshot memory_cached max_memory_cached list_gpu_processes memory", "TPU209",
            message="this CUDA memory statistic has no torch.tpu equivalent; use torch.tpu.memory_stats()"),
    "torch.cuda.empty_cache": Ref("TPU210", OWNED),
    "torch.cuda.memory.empty_cache": Ref("TPU210", OWNED),
    "torch.cuda.set_per_process_memory_fraction": Ref("TPU211", OWNED),
    "torch.cuda.memory.set_per_process_memory_fraction": Ref("TPU211", OWNED),
    "torch.cuda.memory._record_memory_history": Ref("TPU211", OWNED),
    "torch.cuda.memory._dump_snapshot": Ref("TPU211", OWNED),
    "torch.cuda.OutOfMemoryError": Ref("TPU212", RENAME, "torch.OutOfMemoryError"),
    **_many("FloatTensor DoubleTensor HalfTensor BFloat16Tensor LongTensor IntTensor ShortTensor CharTensor "
            "ByteTensor BoolTensor", "TPU213"),
    "torch.set_default_tensor_type": Ref("TPU213"),
    "torch.cuda.comm": Ref("TPU214"),
    "torch.cuda.ipc_collect": Ref("TPU215"),
    **_many("set_sync_debug_mode get_sync_debug_mode init _lazy_init", "TPU216"),
    **_many("CUDAGraph graph graphs make_graphed_callables is_current_stream_capturing graph_pool_handle",
            "TPU217"),
    "torch.cuda.nvtx.range": Ref("TPU218", RENAME, "torch.profiler.record_function",
                                 note="the marker now shows up in torch.profiler traces"),
    **_many("range_push range_pop mark", "TPU218", OWNED, prefix="torch.cuda.nvtx."),
    **_many("start stop", "TPU218", OWNED, prefix="torch.cuda.profiler."),
    "torch.autograd.profiler.emit_nvtx": Ref("TPU218", OWNED),
    "torch.cuda.utilization": Ref("TPU512"),
    "torch.cuda.temperature": Ref("TPU512"),
    "torch.cuda.power_draw": Ref("TPU512"),
    "torch.cuda.clock_rate": Ref("TPU512"),
    # amp
    "torch.cuda.amp.autocast": Ref("TPU301", OWNED),
    "torch.cuda.amp.autocast_mode.autocast": Ref("TPU301", OWNED),
    "torch.cuda.amp.GradScaler": Ref("TPU304", OWNED),
    "torch.cuda.amp.grad_scaler.GradScaler": Ref("TPU304", OWNED),
    "torch.amp.GradScaler": Ref("TPU304", OWNED),
    "torch.amp.grad_scaler.GradScaler": Ref("TPU304", OWNED),
    "torch.GradScaler": Ref("TPU304", OWNED),
    "torch.cuda.amp.custom_fwd": Ref("TPU305", OWNED),
    "torch.cuda.amp.custom_bwd": Ref("TPU305", OWNED),
    "torch.float16": Ref("TPU306", RENAME, "torch.bfloat16"),
    "torch.half": Ref("TPU306", RENAME, "torch.bfloat16"),
    "torch.float64": Ref("TPU307"),
    "torch.double": Ref("TPU307"),
    "torch.channels_last": Ref("TPU310"),
    "torch.channels_last_3d": Ref("TPU310"),
    # backends
    "torch.backends.cudnn.benchmark": Ref("TPU401", ASSIGN),
    "torch.backends.cudnn.deterministic": Ref("TPU402", ASSIGN),
    "torch.backends.cudnn.allow_tf32": Ref("TPU403", ASSIGN),
    "torch.backends.cudnn.enabled": Ref("TPU403", ASSIGN),
    "torch.backends.cudnn.benchmark_limit": Ref("TPU403", ASSIGN),
    "torch.backends.cudnn.flags": Ref("TPU403", message="torch.backends.cudnn.flags() has no effect on TPU; remove it"),
    "torch.backends.cuda.matmul": Ref("TPU309", ASSIGN),
    "torch.backends.cuda.sdp_kernel": Ref("TPU404", OWNED),
    "torch.nn.attention.sdpa_kernel": Ref("TPU404", OWNED),
    **_many("enable_flash_sdp enable_mem_efficient_sdp enable_math_sdp enable_cudnn_sdp", "TPU404", OWNED,
            prefix="torch.backends.cuda."),
    "torch.backends.cuda.preferred_linalg_library": Ref("TPU405", OWNED),
    "torch.backends.cuda.cufft_plan_cache": Ref("TPU405", ASSIGN),
    "torch.cuda.nccl": Ref("TPU408"),
    "torch.version.cuda": Ref("TPU408"),
    "torch.backends.cudnn.version": Ref("TPU408"),
    "torch.backends.cudnn.is_available": Ref("TPU408"),
    "torch.distributed.is_nccl_available": Ref("TPU408"),
    "torch.nn.parallel.DistributedDataParallel": Ref("TPU409", OWNED),
    "torch.nn.parallel.distributed.DistributedDataParallel": Ref("TPU409", OWNED),
    "torch.nn.DataParallel": Ref("TPU410"),
    "torch.nn.parallel.DataParallel": Ref("TPU410"),
    "torch.nn.parallel.data_parallel": Ref("TPU410"),
    "torch.distributed.fsdp.FullyShardedDataParallel": Ref("TPU411"),
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel": Ref("TPU411"),
    "apex.parallel.DistributedDataParallel": Ref("TPU411"),
    "torch.profiler.ProfilerActivity.CUDA": Ref("TPU414"),
    "torch.autograd.ProfilerActivity.CUDA": Ref("TPU414"),
    "torch.compile": Ref("TPU415", OWNED),
    "torch._inductor.config": Ref("TPU416", ASSIGN),
    "torch.jit.script": Ref("TPU417"),
    "torch.jit.script_method": Ref("TPU417"),
    "torch.backends.mps.is_available": Ref("TPU419"),
    "torch.xpu.is_available": Ref("TPU419"),
    # kernels / extensions / third party
    **_many("jit autotune heuristics", "TPU501", prefix="triton."),
    "torch.library.triton_op": Ref("TPU501"),
    "torch.library.wrap_triton": Ref("TPU501"),
    "torch.utils._triton.has_triton": Ref("TPU501"),
    **_many("load load_inline CUDAExtension CUDA_HOME", "TPU502", prefix="torch.utils.cpp_extension."),
    **_many("_scaled_mm _int_mm _grouped_mm _weight_int4pack_mm _weight_int8pack_mm", "TPU503", prefix="torch."),
    **_many("_scaled_mm _int_mm _grouped_mm _weight_int4pack_mm _weight_int8pack_mm", "TPU503",
            prefix="torch.ops.aten."),
    "apex.amp": Ref("TPU504"),
    "apex.normalization.FusedLayerNorm": Ref("TPU505", RENAME, "torch.nn.LayerNorm"),
    "apex.normalization.fused_layer_norm.FusedLayerNorm": Ref("TPU505", RENAME, "torch.nn.LayerNorm"),
    "apex.normalization.FusedRMSNorm": Ref("TPU505", RENAME, "torch.nn.RMSNorm"),
    "apex.normalization.fused_layer_norm.FusedRMSNorm": Ref("TPU505", RENAME, "torch.nn.RMSNorm"),
    "apex.parallel.SyncBatchNorm": Ref("TPU505", RENAME, "torch.nn.SyncBatchNorm"),
    "apex.parallel.convert_syncbn_model": Ref("TPU505", RENAME, "torch.nn.SyncBatchNorm.convert_sync_batchnorm"),
    "apex.optimizers": Ref("TPU506"),
    "flash_attn": Ref("TPU507"),
    "xformers": Ref("TPU508"),
    "bitsandbytes": Ref("TPU509"),
    "transformers.BitsAndBytesConfig": Ref("TPU509"),
    "peft.prepare_model_for_int8_training": Ref("TPU509"),
    "peft.prepare_model_for_kbit_training": Ref("TPU509"),
    "accelerate.Accelerator": Ref("TPU510"),
    **_many("initialize init_distributed ops accelerator zero", "TPU511", prefix="deepspeed."),
}
# Any other torch.cuda.* name: TPU219. Sub-namespaces here are handled above or by this catch-all.
CUDA_CATCH_ALL = ("torch.cuda", "TPU219")

# torch.ops namespaces that are not custom extensions.
BUILTIN_OP_NAMESPACES = frozenset({"aten", "prims", "quantized", "higher_order", "_c10d_functional", "c10d",
                                   "_c10d_functional_autograd", "profiler", "tpu", "_quantized", "rngprims",
                                   "mkldnn", "_dtensor", "quantized_decomposed", "torchvision"})

# Import statements that are findings by themselves (module prefix -> code).
IMPORT_FINDINGS: dict[str, str] = {
    "triton": "TPU501", "bitsandbytes": "TPU509", "flash_attn": "TPU507", "xformers": "TPU508",
    "deepspeed": "TPU511", "pynvml": "TPU512", "GPUtil": "TPU512", "py3nvml": "TPU512", "nvidia_smi": "TPU512",
    "apex.amp": "TPU504", "accelerate": "TPU510",
}

AUTOCAST_CUDA = frozenset({"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"})
AUTOCAST_GENERIC = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})
# torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True): positional order.
CUDA_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")
GRAD_SCALERS = frozenset({"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler",
                          "torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"})
CUDA_GRAD_SCALERS = frozenset({"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"})
CUSTOM_FWD_BWD = {"torch.cuda.amp.custom_fwd": "custom_fwd", "torch.cuda.amp.custom_bwd": "custom_bwd"}
FP16_QNAMES = frozenset({"torch.float16", "torch.half"})

# Statements removed (or rewritten) as a whole: an expression-statement call of these names.
STATEMENT_CALLS: dict[str, str] = {
    "torch.cuda.empty_cache": "TPU210", "torch.cuda.memory.empty_cache": "TPU210",
    "torch.cuda.set_per_process_memory_fraction": "TPU211",
    "torch.cuda.memory.set_per_process_memory_fraction": "TPU211",
    "torch.cuda.memory._record_memory_history": "TPU211", "torch.cuda.memory._dump_snapshot": "TPU211",
    "torch.cuda.nvtx.range_push": "TPU218", "torch.cuda.nvtx.range_pop": "TPU218",
    "torch.cuda.nvtx.mark": "TPU218", "torch.cuda.profiler.start": "TPU218", "torch.cuda.profiler.stop": "TPU218",
    "torch.backends.cuda.enable_flash_sdp": "TPU404", "torch.backends.cuda.enable_mem_efficient_sdp": "TPU404",
    "torch.backends.cuda.enable_math_sdp": "TPU404", "torch.backends.cuda.enable_cudnn_sdp": "TPU404",
    "torch.backends.cuda.preferred_linalg_library": "TPU405",
}
# Context managers unwrapped from `with` statements.
WITH_UNWRAP: dict[str, str] = {
    "torch.backends.cuda.sdp_kernel": "TPU404", "torch.nn.attention.sdpa_kernel": "TPU404",
    "torch.autograd.profiler.emit_nvtx": "TPU218",
}
# Assignment targets (qualified-name prefix -> code) handled as whole statements.
ASSIGN_TARGETS: dict[str, str] = {
    "torch.backends.cudnn.benchmark": "TPU401", "torch.backends.cudnn.deterministic": "TPU402",
    "torch.backends.cudnn.allow_tf32": "TPU403", "torch.backends.cudnn.enabled": "TPU403",
    "torch.backends.cudnn.benchmark_limit": "TPU403",
    "torch.backends.cuda.matmul.allow_tf32": "TPU309",
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": "TPU309",
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": "TPU309",
    "torch.backends.cuda.cufft_plan_cache": "TPU405",
    "torch._inductor.config": "TPU416",
}

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
