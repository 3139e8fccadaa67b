"""The TPU9xx rules: findings in non-Python files (scripts, configs, dependency lists, CUDA sources).

Pure data: rule metadata (`TEXT_RULES`) and the line-oriented regexes that fire them (`TEXT_PATTERNS`).
The machinery that applies them lives in `text_scan.py`. These rules only report, they never rewrite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputool.rules.model import FixSafety, Rule, RuleClass, Severity

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO
REVIEW, BLOCKER = RuleClass.REVIEW, RuleClass.BLOCKER


def _rule(code: str, name: str, sev: Severity, cls: RuleClass, message: str, doc: str,
          patterns: tuple[int, ...] = ()) -> Rule:
    return Rule(code=code, name=name, message=message, severity=sev, fix=FixSafety.NONE, rule_class=cls,
                doc=doc.strip(), patterns=patterns)


_RULE_LIST = [
    _rule("TPU900", "unparsable-file", E, BLOCKER, "file could not be parsed or decoded; left untouched", """
The file is not valid Python for libcst (or its bytes do not decode with its declared encoding), so no rule
could look at it and `port --write` leaves it exactly as it is. Fix the syntax error (or the coding cookie)
and run again. `check` counts it as an error, so a CI gate never passes over code it could not read.
"""),
    _rule("TPU901", "cuda-visible-devices", W, REVIEW,
          "CUDA_VISIBLE_DEVICES selects GPUs and is ignored on TPU; use TPU_VISIBLE_CHIPS", """
Finds CUDA_VISIBLE_DEVICES (and NVIDIA_VISIBLE_DEVICES) in launch scripts, Dockerfiles, Makefiles and configs.
On a TPU VM these select nothing: every process would see every chip. Choose chips with TPU_VISIBLE_CHIPS
(with TPU_PROCESS_BOUNDS / TPU_CHIPS_PER_PROCESS_BOUNDS for several processes per host), or let
`torch.tpu.distributed.set_tpu_launch_env` set them.
Example: `export CUDA_VISIBLE_DEVICES=0,1`  ->  `export TPU_VISIBLE_CHIPS=0,1`
""", (52,)),
    _rule("TPU902", "nccl-env", INFO, REVIEW, "NCCL_* settings tune the NVIDIA collective library; no effect on TPU", """
Finds NCCL_* and TORCH_NCCL_* environment variables (NCCL_DEBUG, NCCL_P2P_DISABLE, NCCL_IB_*,
NCCL_SOCKET_IFNAME, ...). TPU collectives run over ICI/DCN through the `tpu` distributed backend, which
reads none of them. Remove them, or keep them only on the GPU code path of a script that supports both.
""", (53,)),
    _rule("TPU903", "cuda-launch-blocking", INFO, REVIEW,
          "CUDA_LAUNCH_BLOCKING has no effect on TPU; use the Debug eager mode instead", """
CUDA_LAUNCH_BLOCKING=1 makes CUDA kernels synchronous to get accurate error locations. The TPU
equivalent is the "Debug" eager mode (torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, set with
torch.tpu.set_eager_mode), where every op runs at once and the host waits for it.
""", (53,)),
    _rule("TPU904", "cuda-runtime-env", INFO, REVIEW, "CUDA runtime/build setting has no effect on TPU", """
Finds CUDA toolkit and caching-allocator settings: CUDA_DEVICE_MAX_CONNECTIONS, TORCH_CUDA_ARCH_LIST,
PYTORCH_CUDA_ALLOC_CONF, PYTORCH_NO_CUDA_MEMORY_CACHING, CUDA_MODULE_LOADING, CUBLAS_WORKSPACE_CONFIG,
CUDA_CACHE_PATH. None of them is read on TPU; remove them (determinism on TPU comes from
torch.use_deterministic_algorithms, memory is managed by XLA).
""", (29, 53)),
    _rule("TPU910", "cuda-device-config", W, REVIEW, "device set to CUDA/GPU in a config or command line", """
Finds `--device cuda`, `--device=cuda:0`, `device: cuda`, `"device": "cuda"`, `device = "cuda"`,
`accelerator: gpu`, Hydra overrides such as `trainer.accelerator=gpu`. The program will ask for a CUDA
device at run time. Use `tpu` (or `tpu:N`) once the code is ported, e.g. `--device tpu`.
""", (8,)),
    _rule("TPU911", "nccl-backend-config", W, REVIEW, "distributed backend set to nccl; use the tpu backend", """
Finds `--dist-backend nccl`, `--ddp_backend=nccl`, `backend: nccl`, `"dist_backend": "nccl"`.
torch.distributed on TPU registers the backends "tpu" and "tpu_dist" (the default for the tpu device).
Example: `--dist-backend nccl`  ->  `--dist-backend tpu`
""", (45,)),
    _rule("TPU912", "fp16-config", W, REVIEW, "fp16 mixed precision configured; TPUs train in bf16", """
Finds fp16 switches in configs and command lines: `fp16: true`, `--fp16`, DeepSpeed
`"fp16": {"enabled": true}`, `mixed_precision: fp16`, `torch_dtype: float16`, Lightning `precision: 16`.
TPU matrix units are built for bfloat16; float16 runs slowly or not at all and needs loss scaling that bf16
does not. Switch to bf16: `bf16: true`, `"bf16": {"enabled": true}`, `mixed_precision: bf16`,
`precision: bf16-mixed`, and drop loss-scaling options.
""", (36, 72)),
    _rule("TPU913", "gpu-launch-flag", W, REVIEW, "launcher or scheduler asks for GPUs", """
Finds launcher and scheduler options that request or count GPUs: `torchrun --nproc_per_node=gpu`,
`docker run --gpus all`, `--runtime=nvidia`, Slurm `--gres=gpu:8` / `--gpus-per-node`, Kubernetes
`nvidia.com/gpu` resources. On a TPU VM, set the process count explicitly (one process per host, or per
chip with TPU_PROCESS_BOUNDS) and request TPU resources (e.g. `google.com/tpu`) instead.
""", (56,)),
    _rule("TPU914", "nvidia-smi", W, REVIEW, "nvidia-smi is not available on a TPU VM", """
Scripts call nvidia-smi to count GPUs, pick free ones or log utilisation. It does not exist on a TPU VM, so
the call fails (and a count derived from it is empty). Use `python -c "import torch; print(torch.tpu.device_count())"`
or the TPU runtime metrics instead.
""", (56,)),
    _rule("TPU915", "cuda-base-image", W, REVIEW, "container image is built on a CUDA base image", """
Finds `FROM nvidia/cuda:...`, `FROM pytorch/pytorch:...-cuda...`, `FROM nvcr.io/nvidia/...` in Dockerfiles.
These images carry the CUDA toolkit and a CUDA build of torch (gigabytes that do nothing on TPU). Start
from a plain Python image and install the CPU wheel of torch plus the TPU runtime.
"""),
    _rule("TPU920", "bitsandbytes-dependency", E, BLOCKER, "bitsandbytes is CUDA-only (8-bit/4-bit kernels)", """
The project depends on bitsandbytes, whose quantised matmuls and 8-bit optimizers are CUDA kernels.
There is no automatic TPU path: load bf16 weights (drop load_in_8bit/load_in_4bit, BitsAndBytesConfig),
use torch.optim.AdamW or torch.tpu.optimizers.AdamW, or adopt a TPU-native quantisation scheme.
""", (69,)),
    _rule("TPU921", "flash-attn-dependency", E, REVIEW, "flash-attn is a CUDA-only package; use SDPA", """
flash-attn builds CUDA kernels at install time and fails to install without nvcc. Replace flash_attn_func
and friends with torch.nn.functional.scaled_dot_product_attention (and HF attn_implementation="sdpa"),
then drop the dependency.
""", (67,)),
    _rule("TPU922", "xformers-dependency", W, REVIEW, "xformers attention kernels are CUDA-only; use SDPA", """
xformers.ops.memory_efficient_attention has no TPU implementation. Use
torch.nn.functional.scaled_dot_product_attention with an attention mask, then drop the dependency.
""", (68,)),
    _rule("TPU923", "apex-dependency", W, REVIEW, "NVIDIA apex is CUDA-only; use native torch equivalents", """
apex (AMP, FusedAdam/FusedLAMB, FusedLayerNorm/FusedRMSNorm, apex DDP, SyncBatchNorm) is built from
CUDA sources. Use torch.autocast("tpu", dtype=torch.bfloat16), torch.optim.AdamW, nn.LayerNorm/nn.RMSNorm,
torch DDP and nn.SyncBatchNorm, then drop the dependency.
""", (64, 65)),
    _rule("TPU924", "deepspeed-dependency", W, REVIEW, "DeepSpeed needs a TPU accelerator plugin", """
DeepSpeed selects its accelerator at import time and ships CUDA ops (FusedAdam, CPUAdam, ZeRO kernels).
Without a TorchTPU DeepSpeedAccelerator it will not use TPUs. Consider FSDP2 (fully_shard) or DDP, which
TorchTPU supports, and switch any ds_config fp16 block to bf16.
""", (72,)),
    _rule("TPU925", "triton-dependency", E, BLOCKER, "Triton kernels do not run on TPU", """
Triton compiles GPU kernels; there is no TPU target. Every @triton.jit kernel needs a Pallas/JAX kernel
(called through torch.tpu.pallas.jax_op) or a pure-torch fallback before the dependency can go.
""", (61,)),
    _rule("TPU926", "cupy-dependency", E, BLOCKER, "CuPy is CUDA-only", """
CuPy arrays live in GPU memory and its kernels are CUDA. Replace CuPy code with torch ops on the tpu
device (or NumPy on the host) and drop the dependency.
"""),
    _rule("TPU927", "gpu-monitoring-dependency", W, REVIEW, "GPU monitoring package (NVML) does nothing on TPU", """
pynvml / nvidia-ml-py, gpustat, GPUtil and nvitop talk to the NVIDIA driver. On a TPU VM they fail to
initialise. Remove the monitoring code path or use TPU runtime metrics.
""", (56,)),
    _rule("TPU928", "cuda-wheel", W, REVIEW, "dependency pins a CUDA build (CUDA wheel or CUDA package index)", """
Finds CUDA builds in dependency lists and install commands: `torch==2.3.0+cu121`, the
download.pytorch.org/whl/cuXXX index, nvidia-*-cu12 runtime wheels, `jax[cuda12]`. On TPU install the
CPU wheel of torch (plus the TPU runtime) or `jax[tpu]`; the CUDA wheels are gigabytes of unused code.
"""),
    _rule("TPU929", "rapids-dependency", E, BLOCKER, "RAPIDS (cuML, cuDF, ...) is CUDA-only", """
RAPIDS packages (cuml, cudf, cugraph, cuspatial, cucim, cuvs, pylibraft, dask-cudf, rmm, and their -cu11/-cu12
wheels) hold their data in GPU memory and run CUDA kernels. Use the CPU counterparts (scikit-learn, pandas, ...)
on the host or torch ops on the tpu device, then drop the dependency.
"""),
    _rule("TPU930", "cuda-source-file", E, BLOCKER, "CUDA C++ source: no TPU path", """
A .cu/.cuh file holds CUDA kernels, which cannot run on TPU. Re-express the op with torch ops (often
fast enough once torch.compile fuses them) or write a Pallas kernel called through
torch.tpu.pallas.jax_op, then remove the file from the build.
""", (62,)),
    _rule("TPU931", "cuda-extension-build", E, BLOCKER, "build compiles a CUDA extension", """
Finds CUDA builds in CMake: enable_language(CUDA), LANGUAGES ... CUDA, find_package(CUDAToolkit) or
CUDA_ARCHITECTURES (CUDAExtension in setup.py is a Python rule, TPU502). The extension needs nvcc and
produces GPU code only; port its ops (see TPU930) and build a CPU-only extension or none.
""", (62,)),
    _rule("TPU940", "file-too-large", INFO, REVIEW, "file larger than max-file-size; skipped, not read", """
The file is bigger than the size cap (1 MB by default; `--max-file-size` or `max-file-size` in
[tool.tputool]), so it was neither read nor rewritten: files that big are almost always generated code or
data. Port the generator instead, or raise the cap if the file really is hand-written source.
"""),
]

TEXT_RULES: dict[str, Rule] = {r.code: r for r in _RULE_LIST}


@dataclass(frozen=True)
class TextPattern:
    """One regex that fires rule `code` on a line of a file of one of `kinds`.

    `follow`, when set, must also match in the rest of the line or the indented block below it (a
    multi-line `"fp16": {"enabled": true}`). `once` reports only the first hit per file; `always` reports
    the file even with no hit (at line 1). `message` may use {match} and named groups; {count} counts hits.
    """

    code: str
    kinds: frozenset[str]
    regex: re.Pattern[str]
    follow: re.Pattern[str] | None = None
    message: str | None = None
    once: bool = False
    always: bool = False


ENV_KINDS = frozenset({"shell", "docker", "make", "config"})
SHELL_KINDS = frozenset({"shell", "docker", "make"})
DEPS = frozenset({"deps"})


def _p(code: str, kinds: frozenset[str], regex: str, follow: str | None = None, message: str | None = None,
       once: bool = False, always: bool = False, flags: int = re.IGNORECASE) -> TextPattern:
    return TextPattern(code, kinds, re.compile(regex, flags), re.compile(follow, flags) if follow else None,
                       message, once, always)


# A key, optionally quoted, then ':' or '='; not part of a longer key.
_KEY = r"(?<![\w-])[\"']?(?:{keys})[\"']?\s*[:=]\s*[\"']?"
# A command-line option, then a space or '='.
_OPT = r"(?<![\w-])--(?:{opts})(?:\s+|=)[\"']?"

# Dependency packages: code -> package-name regex (PEP 503 names: -, _ and . are interchangeable).
DEPENDENCIES: dict[str, str] = {
    "TPU920": r"bitsandbytes",
    "TPU921": r"flash[-_.]attn",
    "TPU922": r"xformers",
    "TPU923": r"apex|nvidia[-_.]apex",
    "TPU924": r"deepspeed",
    "TPU925": r"triton",
    "TPU926": r"cupy(?:[-_.]cuda\w*)?",
    "TPU927": r"pynvml|nvidia[-_.]ml[-_.]py3?|gpustat|gputil|nvitop",
    "TPU929": r"(?:cuml|cudf|cugraph|cuspatial|cucim|cuvs|pylibraft|dask[-_.]cudf|rmm|rapids)(?:[-_.]cu\d+)?",
}
# A requirement naming the package: at line start (requirements.txt, setup.cfg, conda `- pkg`,
# Poetry `pkg = ...`) or right after a quote (setup.py, pyproject.toml lists).
_REQ = r"(?:^\s*(?:-\s*)?|[\"'])(?P<pkg>{name})(?=\s*(?:[<>=!~;\[@\"',#]|$))"
_PIP = r"\b(?:pip3?|uv\s+pip|conda|mamba)\s+install\b[^#\n]*?(?<![\w./-])(?P<pkg>{name})(?=[<>=!~\[\s\"']|$)"

TEXT_PATTERNS: tuple[TextPattern, ...] = (
    # environment variables
    _p("TPU901", ENV_KINDS, r"\b(?:CUDA|NVIDIA)_VISIBLE_DEVICES\b", message="{match} has no effect on TPU; use TPU_VISIBLE_CHIPS",
       flags=0),
    _p("TPU902", ENV_KINDS, r"\b(?:TORCH_)?NCCL_[A-Z0-9_]+\b", message="{match} tunes NCCL; no effect on TPU", flags=0),
    _p("TPU903", ENV_KINDS, r"\bCUDA_LAUNCH_BLOCKING\b", flags=0),
    _p("TPU904", ENV_KINDS, r"\b(?:CUDA_DEVICE_MAX_CONNECTIONS|TORCH_CUDA_ARCH_LIST|PYTORCH_CUDA_ALLOC_CONF|"
       r"PYTORCH_NO_CUDA_MEMORY_CACHING|CUDA_MODULE_LOADING|CUBLAS_WORKSPACE_CONFIG|CUDA_CACHE_PATH)\b",
       message="{match} has no effect on TPU", flags=0),
    # device / backend / precision settings
    _p("TPU910", ENV_KINDS, _OPT.format(opts=r"device(?:[-_]type)?|accelerator") + r"(?:cuda(?::\d+)?|gpu)\b"),
    _p("TPU910", ENV_KINDS, _KEY.format(keys=r"device|device_type|accelerator") + r"(?:cuda(?::\d+)?|gpu)\b"),
    _p("TPU911", ENV_KINDS, _OPT.format(opts=r"(?:dist|ddp|distributed)[-_]backend|backend") + r"nccl\b"),
    _p("TPU911", ENV_KINDS, _KEY.format(keys=r"backend|dist_backend|ddp_backend|distributed_backend") + r"nccl\b"),
    _p("TPU912", ENV_KINDS, _KEY.format(keys=r"fp16|half|use_fp16") + r"(?:true|yes|on|1)\b"),
    _p("TPU912", ENV_KINDS, r"(?<![\w.-])[\"']?fp16[\"']?\s*:\s*(?:\{.*)?$",
       follow=r"[\"']?enabled[\"']?\s*:\s*[\"']?(?:true|auto)\b",
       message="DeepSpeed-style fp16 block enabled; TPUs train in bf16 (\"bf16\": {{\"enabled\": true}})"),
    _p("TPU912", ENV_KINDS, r"(?<![\w.-])(?:--)?[\"']?mixed[-_]precision[\"']?(?:\s*[:=]\s*|\s+)[\"']?fp16\b"),
    _p("TPU912", ENV_KINDS, r"(?<![\w-])--fp16(?![\w-])(?!(?:\s+|=)[\"']?(?:false|0|no)\b)"),
    _p("TPU912", ENV_KINDS, _KEY.format(keys=r"torch_dtype|dtype") + r"(?:torch\.)?(?:float16|fp16|half)\b"),
    _p("TPU912", ENV_KINDS, _OPT.format(opts=r"(?:torch[-_])?dtype") + r"(?:float16|fp16|half)\b"),
    _p("TPU912", ENV_KINDS, _KEY.format(keys=r"precision") + r"16(?:-mixed|-true)?\b"),
    _p("TPU912", ENV_KINDS, _OPT.format(opts=r"precision") + r"16(?:-mixed|-true)?\b"),
    # launchers, schedulers, containers
    _p("TPU913", ENV_KINDS, _OPT.format(opts=r"nproc[-_]per[-_]node") + r"gpu\b",
       message="--nproc_per_node=gpu counts CUDA devices; set the process count explicitly on TPU"),
    _p("TPU913", SHELL_KINDS, r"(?<![\w-])--gpus(?:-per-(?:node|task))?(?:\s+|=)\S+"),
    _p("TPU913", SHELL_KINDS, r"(?<![\w-])--gres(?:\s+|=)\S*gpu"),
    _p("TPU913", SHELL_KINDS, r"(?<![\w-])--runtime(?:\s+|=)nvidia\b"),
    _p("TPU913", ENV_KINDS, r"\bnvidia\.com/gpu\b"),
    _p("TPU914", SHELL_KINDS, r"\bnvidia-smi\b"),
    _p("TPU915", frozenset({"docker"}), r"^\s*FROM\s+(?:--\S+\s+)*(?P<image>\S*(?:cuda|nvcr\.io/nvidia)\S*)",
       message="base image {image} is a CUDA image"),
    # dependencies (dependency files and install commands)
    *(_p(code, DEPS, _REQ.format(name=name), message=f"{{pkg}}: {TEXT_RULES[code].message}")
      for code, name in DEPENDENCIES.items()),
    *(_p(code, SHELL_KINDS, _PIP.format(name=name), message=f"installs {{pkg}}: {TEXT_RULES[code].message}")
      for code, name in DEPENDENCIES.items()),
    _p("TPU923", DEPS | SHELL_KINDS, r"github\.com/NVIDIA/apex", message="installs NVIDIA apex from source: "
       + TEXT_RULES["TPU923"].message),
    _p("TPU928", DEPS | SHELL_KINDS, r"(?<![\w.-])(?P<pkg>nvidia[-_.][\w.-]*?[-_.]cu\d+)(?![\w.-])",
       message="{pkg} is a CUDA runtime wheel"),
    _p("TPU928", DEPS | SHELL_KINDS, r"\b(?P<pkg>torch\w*|jaxlib)\s*==\s*[\w.]+\+cu\d+",
       message="{match}: CUDA build pinned"),
    _p("TPU928", DEPS | SHELL_KINDS, r"download\.pytorch\.org/whl/cu\d+", message="{match}: CUDA package index"),
    _p("TPU928", DEPS | SHELL_KINDS, r"\bjax\[cuda\w*\]", message="{match}: CUDA build of jax; use jax[tpu]"),
    # CUDA sources and builds
    _p("TPU930", frozenset({"cuda"}), r"__global__", once=True, always=True,
       message="CUDA C++ source ({count} __global__ kernel(s)): no TPU path; port to torch ops or Pallas",
       flags=0),
    _p("TPU931", frozenset({"cmake"}), r"\benable_language\s*\(\s*CUDA\b|\bLANGUAGES\b.*\bCUDA\b|"
       r"\bfind_package\s*\(\s*(?:CUDA|CUDAToolkit)\b|\bCUDA_ARCHITECTURES\b", flags=0),
)
