"""Every Python rewrite rule of `tputool port` as data: code, name, message, severity, fix safety, class, doc.

Code ranges: TPU1xx device placement, TPU2xx the torch.cuda API, TPU3xx amp and precision,
TPU4xx backends / distributed / compile, TPU5xx kernels, extensions and third-party CUDA libraries,
TPU6xx performance lints, TPU9xx non-Python files (tputool/rules/text.py, merged by catalogue.py).
Codes are stable: a published code never changes meaning. Rewriting machinery: tputool/codemods/python/.
"""

from __future__ import annotations

from tputool.rules.model import FixSafety, Rule, RuleClass, Severity

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO
SAFE, UNSAFE, NOFIX = FixSafety.SAFE, FixSafety.UNSAFE, FixSafety.NONE
AUTO, AUTO_N, REVIEW, BLOCKER = RuleClass.AUTO, RuleClass.AUTO_NOTE, RuleClass.REVIEW, RuleClass.BLOCKER


def _rule(code: str, name: str, sev: Severity, fix: FixSafety, cls: RuleClass, patterns: tuple[int, ...],
          message: str, what: str, before: str, after: str | None) -> Rule:
    """One Rule; the doc is `what` plus a before/after example (after is None for finding-only rules)."""
    example = f"Before:\n    {before}\n" + (f"After:\n    {after}\n" if after is not None else "")
    fix_line = {SAFE: "Fix: applied by `tputool port`.",
                UNSAFE: "Fix: applied only with --unsafe-fixes (review the result).",
                NOFIX: "Fix: none automatic; the finding says what to change."}[fix]
    doc = f"{what.strip()}\n{fix_line}\n{example}"
    return Rule(code=code, name=name, message=message, severity=sev, fix=fix, rule_class=cls, doc=doc,
                patterns=patterns, before=before, after=after)


_RULE_LIST: list[Rule] = [
    # ---- TPU1xx device placement ----
    _rule("TPU101", "cuda-method-no-args", W, SAFE, AUTO_N, (1,),
          '`.cuda()` moves to a CUDA device; use `.to("tpu")`',
          """`x.cuda()` / `module.cuda()` with no argument. On TPU the device is `tpu`; `.to("tpu")` returns the
moved tensor (or the module itself, in place) exactly like `.cuda()`. Note: the call site is rewritten;
`.cuda()` is never redefined at run time.""",
          "model = Net().cuda()", 'model = Net().to("tpu")'),
    _rule("TPU102", "cuda-method-device", W, SAFE, AUTO_N, (2,),
          '`.cuda(i)` selects a CUDA device index; use `.to(torch.device("tpu", i))`',
          """`x.cuda(i)`, `x.cuda(args.gpu)`, `x.cuda(device=i)`. An int index becomes `torch.device("tpu", i)`;
a `'cuda:N'` literal becomes `'tpu:N'`; a variable named like a device (`device`, `dev`) is passed
as it is. Note: check that the index means a local TPU chip.""",
          "x = x.cuda(args.gpu)", 'x = x.to(torch.device("tpu", args.gpu))'),
    _rule("TPU103", "cuda-method-non-blocking", W, SAFE, AUTO, (3, 75),
          '`.cuda(non_blocking=True)`; use `.to("tpu", non_blocking=True)`',
          """`x.cuda(non_blocking=True)` keeps its `non_blocking` flag (host-to-device copies may be asynchronous
on TPU too, so the flag is kept as it is).""",
          "x = x.cuda(non_blocking=True)", 'x = x.to("tpu", non_blocking=True)'),
    _rule("TPU104", "to-cuda-string", W, SAFE, AUTO, (4,),
          '`.to("cuda")` names a CUDA device; use "tpu"',
          """`.to("cuda")`, `.to("cuda:0")`, `.to(device="cuda")`: the device string becomes `"tpu"` /
`"tpu:0"`.""",
          'batch = batch.to("cuda:0")', 'batch = batch.to("tpu:0")'),
    _rule("TPU105", "device-kwarg-cuda", W, SAFE, AUTO, (5,),
          '`device="cuda"` argument; use "tpu"',
          """A `device=` (or `device_type=`, `*_device=`) keyword set to a CUDA device string, on factories
(`zeros/ones/empty/full/rand/randn/randint/randperm/arange/linspace/logspace/eye/tensor/as_tensor/
normal/*_like/new_*`), generators, `torch.amp.custom_fwd` and any other call.""",
          'mask = torch.ones(n, n, device="cuda")', 'mask = torch.ones(n, n, device="tpu")'),
    _rule("TPU106", "torch-device-cuda", W, SAFE, AUTO, (6, 13),
          '`torch.device("cuda")`; use torch.device("tpu")',
          """`torch.device("cuda")`, `torch.device("cuda", i)`, `torch.device("cuda:0")`, also as a context
manager (`with torch.device("cuda"):`) and with a conditional argument
(`torch.device("cuda" if use_cuda else "cpu")`).""",
          'dev = torch.device("cuda", local_rank)', 'dev = torch.device("tpu", local_rank)'),
    _rule("TPU107", "dynamic-device-string", W, SAFE, AUTO_N, (7,),
          "device string built as 'cuda:<n>'; build 'tpu:<n>'",
          """Device strings built at run time: `f"cuda:{rank}"`, `"cuda:{}".format(gpu)`, `"cuda:%d" % i`,
`"cuda:" + str(i)`. Note: check the index is a local TPU chip index.""",
          'device = f"cuda:{rank}"', 'device = f"tpu:{rank}"'),
    _rule("TPU108", "device-default-cuda", W, SAFE, AUTO_N, (8,),
          "CUDA device as a default/config value; use 'tpu'",
          """A device default: `device = 'cuda'` (a variable or attribute named like a device), a parameter default
`def f(device='cuda')`, a config dict `{"device": "cuda"}`, an argparse `default='cuda'` or
`choices=["cpu", "cuda"]`. Note: update any help text that still says cuda.""",
          "parser.add_argument('--device', default='cuda', choices=['cpu', 'cuda'])",
          "parser.add_argument('--device', default='tpu', choices=['cpu', 'tpu'])"),
    _rule("TPU109", "device-string-check", W, UNSAFE, REVIEW, (9,),
          "code compares a device to 'cuda'; after porting the device is 'tpu'",
          """String and type checks such as `device == 'cuda'`, `'cuda' in device`, `device.type == 'cuda'`,
`device_type != 'cuda'`, `str(d).startswith('cuda')`, and maps keyed by device type (`{"cuda": "nccl", "cpu": "gloo"}`).
After the port the device is `tpu`, so the branch flips. The port moves a device as a whole concept: where the
compared value is a device (a name like `device`/`device_type`/`args.device`, `x.device.type`, `str(device)`, or a
name assigned from one), the fix compares to 'tpu' and is applied by default (safe here); elsewhere
(`kind == 'cuda'`) the same fix needs --unsafe-fixes and the finding says so.""",
          "if device.type == 'cuda': torch.cuda.synchronize()",
          "if device.type == 'tpu': torch.tpu.synchronize()"),
    _rule("TPU110", "bare-int-device", INFO, UNSAFE, REVIEW, (10,),
          "a bare integer is used as a device; torch.device('tpu', i) says which device explicitly",
          """`.to(0)`, `.to(local_rank)`, `torch.device(0)`, `rank % torch.cuda.device_count()`: PyTorch reads a bare
int as an index of the current accelerator, so on a TPU host it already means `tpu:<i>`; the finding is
informational. The unsafe fix wraps literal ints and rank-like names in `torch.device("tpu", i)`.""",
          "model.to(local_rank)", 'model.to(torch.device("tpu", local_rank))'),
    _rule("TPU111", "is-cuda-attribute", W, SAFE, AUTO, (11,),
          '`.is_cuda` is False for TPU tensors; use `.device.type == "tpu"`',
          """`tensor.is_cuda` (and `param.is_cuda`) checks for a CUDA tensor; on TPU it is always False.""",
          "if x.is_cuda: y = y.to(x.device)", 'if x.device.type == "tpu": y = y.to(x.device)'),
    _rule("TPU112", "map-location-cuda", W, SAFE, AUTO_N, (12,),
          "`map_location` loads onto CUDA; use 'tpu' (or 'cpu' then .to())",
          """`torch.load(..., map_location="cuda")` becomes "tpu". A callable or dict `map_location` is only
reported: load on "cpu" and move with `.to("tpu")`. Note: tensors saved on GPU load onto the TPU.""",
          'state = torch.load(path, map_location="cuda:0")', 'state = torch.load(path, map_location="tpu:0")'),
    _rule("TPU113", "default-device-cuda", W, SAFE, AUTO, (13,),
          '`torch.set_default_device("cuda")`; use "tpu"',
          """The default device for factories set to CUDA.""",
          'torch.set_default_device("cuda")', 'torch.set_default_device("tpu")'),
    _rule("TPU114", "cuda-if-available", W, SAFE, AUTO, (16,),
          "'cuda' if torch.cuda.is_available() else 'cpu'; choose 'tpu'",
          """The usual device ladder picks CUDA when it is available; it becomes the same ladder for TPU.""",
          "device = 'cuda' if torch.cuda.is_available() else 'cpu'",
          "device = 'tpu' if torch.tpu.is_available() else 'cpu'"),
    _rule("TPU115", "hf-device-map", W, SAFE, REVIEW, (70,),
          "device_map/max_memory place a model across GPUs; use device_map='tpu'",
          """Hugging Face big-model placement (`device_map="auto"`, `device_map={"": local_rank}`,
`max_memory={0: "20GiB"}`) targets CUDA indices. `device_map="cuda"` / `"cuda:N"` becomes `"tpu"` / `"tpu:N"` (the fix);
the others are reported: use `device_map="tpu"` (or `{"": "tpu:N"}`), or load on CPU and move with `.to("tpu")`.
`device_map` needs the `accelerate` package: `pip install 'tputool[hf]'`.""",
          'AutoModel.from_pretrained(name, device_map="cuda")', 'AutoModel.from_pretrained(name, device_map="tpu")'),
    _rule("TPU116", "pin-memory-device", INFO, UNSAFE, REVIEW, (74,),
          '`pin_memory_device="cuda"` pins for a CUDA device; drop it',
          """`DataLoader(pin_memory=True)` and `tensor.pin_memory()` can stay; a `pin_memory_device="cuda"`
value names a CUDA device. The unsafe fix drops the argument.""",
          'DataLoader(ds, pin_memory=True, pin_memory_device="cuda")', "DataLoader(ds, pin_memory=True)"),
    # ---- TPU2xx torch.cuda API ----
    _rule("TPU201", "cuda-runtime-api", W, SAFE, AUTO, (15, 17, 18, 19, 20, 21, 83, 84),
          "torch.cuda runtime call; use the same call on torch.tpu",
          """`torch.cuda.is_available/device_count/current_device/set_device/synchronize/manual_seed/
manual_seed_all/initial_seed/is_initialized` have the same meaning on `torch.tpu`. Aliases resolve
(`import torch as th`, `from torch import cuda`, `import torch.cuda as tc`); a `'cuda:N'` argument of
set_device is rewritten too.""",
          "torch.cuda.manual_seed_all(seed)", "torch.tpu.manual_seed_all(seed)"),
    _rule("TPU202", "cuda-device-info", W, SAFE, AUTO_N, (22,),
          "torch.cuda device name/properties; use torch.tpu",
          """`torch.cuda.get_device_name()`, `get_device_properties(i)` exist on torch.tpu. Note: the properties
object has TPU fields; CUDA-only fields (`major`, `minor`, `multi_processor_count`) are absent.""",
          "name = torch.cuda.get_device_name(0)", "name = torch.tpu.get_device_name(0)"),
    _rule("TPU203", "cuda-capability-check", W, NOFIX, REVIEW, (23,),
          "CUDA compute-capability check has no TPU meaning",
          """`torch.cuda.get_device_capability()` and checks like `>= (8, 0)` gate features on GPU generations.
On TPU remove the check (bf16 and fast matmuls are always available) or test `torch.tpu.is_available()`.""",
          "if torch.cuda.get_device_capability() >= (8, 0): use_bf16 = True", None),
    _rule("TPU204", "bf16-supported", W, SAFE, AUTO_N, (24,),
          "`torch.cuda.is_bf16_supported()` is True on TPU",
          """TPUs compute natively in bfloat16, so the check is replaced by `True`.""",
          "dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16",
          "dtype = torch.bfloat16 if True else torch.float16"),
    _rule("TPU205", "cuda-event", W, SAFE, AUTO_N, (25,),
          "torch.cuda.Event; use torch.tpu.Event",
          """`torch.cuda.Event(enable_timing=True)` with `.record()`, `.elapsed_time()`, `.synchronize()`.
Note: torch.tpu.Event is assumed to offer the same methods; check timings against a profile.""",
          "start = torch.cuda.Event(enable_timing=True)", "start = torch.tpu.Event(enable_timing=True)"),
    _rule("TPU206", "cuda-stream", W, SAFE, AUTO_N, (26,),
          "CUDA stream API; use torch.tpu streams",
          """`torch.cuda.Stream`, `torch.cuda.stream(s)`, `current_stream()`, `default_stream()`, `set_stream()`
are all in torch.tpu. Note: XLA orders device work itself; side streams rarely overlap anything on TPU,
and `t.record_stream(s)` / `s.wait_stream()` calls may be dropped.""",
          "with torch.cuda.stream(side):", "with torch.tpu.stream(side):"),
    _rule("TPU207", "cuda-device-context", W, SAFE, AUTO_N, (81,),
          "torch.cuda.device()/device_of(); use torch.tpu.device()/device_of()",
          """The `torch.cuda.device(i)` context manager and `torch.cuda.device_of(t)` exist on torch.tpu.
Note: prefer explicit devices (`.to(torch.device("tpu", i))`).""",
          "with torch.cuda.device(rank):", "with torch.tpu.device(rank):"),
    _rule("TPU208", "cuda-rng-state", W, SAFE, AUTO_N, (73,),
          "CUDA RNG state API; use torch.tpu's",
          """`torch.cuda.get_rng_state/set_rng_state/default_generators` become torch.tpu's. The `*_all`
variants have no torch.tpu equivalent and are only reported (save one state per device instead).""",
          "state = torch.cuda.get_rng_state()", "state = torch.tpu.get_rng_state()"),
    _rule("TPU209", "cuda-memory-stats", W, SAFE, AUTO_N, (27,),
          "CUDA memory statistics; use the same call on torch.tpu",
          """`memory_allocated`, `max_memory_allocated`, `memory_reserved`, `max_memory_reserved`,
`reset_peak_memory_stats`, `reset_max_memory_allocated`, `memory_stats` and `mem_get_info` move to `torch.tpu`, which
reads JAX's device memory statistics (a count of live buffers where the platform reports none), so memory logging
keeps working. `memory_summary`, `memory_snapshot`, `list_gpu_processes` and the `*_cached` names have no
equivalent and are reported.""",
          "peak = torch.cuda.max_memory_allocated() / 2**30", "peak = torch.tpu.max_memory_allocated() / 2**30"),
    _rule("TPU210", "empty-cache", W, SAFE, AUTO_N, (28,),
          "`torch.cuda.empty_cache()` removed (XLA manages TPU memory)",
          """The CUDA caching allocator has no TPU counterpart; the statement is removed (an emptied block gets
`pass`). Note: if memory must be released, drop references to tensors instead.""",
          "torch.cuda.empty_cache()", "(statement removed)"),
    _rule("TPU211", "cuda-memory-config", W, UNSAFE, REVIEW, (29,),
          "CUDA allocator configuration has no effect on TPU",
          """`torch.cuda.set_per_process_memory_fraction`, `torch.cuda.memory._record_memory_history`,
`_dump_snapshot`. The unsafe fix removes the statement.""",
          "torch.cuda.set_per_process_memory_fraction(0.9)", "(statement removed)"),
    _rule("TPU212", "cuda-oom-error", W, UNSAFE, REVIEW, (30,),
          "`torch.cuda.OutOfMemoryError` only catches CUDA OOMs",
          """`except torch.cuda.OutOfMemoryError` will not catch a TPU out-of-memory. The unsafe fix uses the
device-generic `torch.OutOfMemoryError`; check what the TPU backend raises (often a RuntimeError).""",
          "except torch.cuda.OutOfMemoryError:", "except torch.OutOfMemoryError:"),
    _rule("TPU213", "legacy-tensor-type", W, SAFE, REVIEW, (14,),
          "legacy CUDA tensor type; use torch.tensor(..., dtype=..., device='tpu')",
          """`torch.cuda.FloatTensor(...)`, `torch.cuda.LongTensor`: construct with `torch.tensor(data, dtype=...,
device="tpu")` or `torch.empty(size, ...)` (reported). `torch.set_default_tensor_type(torch.cuda.HalfTensor)` (Llama's
reference code) is fixed: `torch.set_default_device("tpu"); torch.set_default_dtype(torch.float16)`.""",
          "torch.set_default_tensor_type(torch.cuda.HalfTensor)",
          'torch.set_default_device("tpu"); torch.set_default_dtype(torch.float16)'),
    _rule("TPU214", "cuda-comm", W, NOFIX, REVIEW, (51,),
          "torch.cuda.comm collectives are CUDA-only; use torch.distributed",
          """`torch.cuda.comm.broadcast/scatter/gather/reduce_add` copy between GPUs of one process. Use
`torch.distributed` collectives (`dist.broadcast`, `all_gather`, `reduce_scatter`) on the tpu backend.""",
          "outs = torch.cuda.comm.broadcast(t, devices=[0, 1])", None),
    _rule("TPU215", "cuda-ipc", W, NOFIX, REVIEW, (82,),
          "CUDA IPC has no TPU equivalent",
          """`torch.cuda.ipc_collect()` and CUDA IPC tensor sharing through torch.multiprocessing. Remove, or
share CPU tensors between processes.""",
          "torch.cuda.ipc_collect()", None),
    _rule("TPU216", "cuda-debug-api", W, NOFIX, REVIEW, (83,),
          "CUDA initialisation/sync-debug API has no torch.tpu equivalent",
          """`torch.cuda.set_sync_debug_mode`, `get_sync_debug_mode`, `torch.cuda.init()`, `_lazy_init`.
Remove them; the Debug eager mode (torch.tpu.set_eager_mode) helps find host syncs on TPU.""",
          'torch.cuda.set_sync_debug_mode("warn")', None),
    _rule("TPU217", "cuda-graphs", E, NOFIX, BLOCKER, (57,),
          "CUDA graphs are unsupported on TPU; rely on torch.compile(backend='tpu')",
          """`torch.cuda.CUDAGraph`, `torch.cuda.graph(g)`, `make_graphed_callables`,
`is_current_stream_capturing`, `graph_pool_handle`. XLA compiles whole graphs already: remove the capture
and replay code and compile the step with `torch.compile(..., backend="tpu")`.""",
          "g = torch.cuda.CUDAGraph()", None),
    _rule("TPU218", "nvtx-profiler", INFO, SAFE, AUTO_N, (54,),
          "NVTX/CUDA profiler markers; use torch.profiler.record_function or remove",
          """`torch.cuda.nvtx.range(msg)` becomes `torch.profiler.record_function(msg)`; `range_push/range_pop/
mark` and `torch.cuda.profiler.start/stop` statements are removed; a `with emit_nvtx():` wrapper is
unwrapped. Note: use `tputool profile` or torch.profiler for TPU traces.""",
          'with torch.cuda.nvtx.range("fwd"):', 'with torch.profiler.record_function("fwd"):'),
    _rule("TPU219", "cuda-api-unknown", W, NOFIX, REVIEW, (),
          "torch.cuda API with no known TPU equivalent",
          """Any other `torch.cuda.*` use that no other rule covers. Look for the torch.tpu name or remove it.""",
          "torch.cuda.jiterator._create_jit_fn(code)", None),
    # ---- TPU3xx amp / precision ----
    _rule("TPU301", "cuda-amp-autocast", W, SAFE, AUTO_N, (31, 35),
          'torch.cuda.amp.autocast; use torch.autocast("tpu", dtype=torch.bfloat16)',
          """`torch.cuda.amp.autocast(...)` as a context manager or decorator, also through
`from torch.cuda.amp import autocast`, `from torch.cuda import amp`, `import torch.cuda.amp as amp`.
Positional arguments become keywords; imports left unused are removed. Note: the CUDA default dtype was
float16; TPU autocast uses bfloat16 (no loss scaling needed).""",
          "with torch.cuda.amp.autocast():", 'with torch.autocast("tpu", dtype=torch.bfloat16):'),
    _rule("TPU302", "autocast-device-cuda", W, SAFE, AUTO, (32,),
          'autocast for device "cuda"; use "tpu"',
          """`torch.autocast(device_type="cuda")`, `torch.autocast("cuda")`, `torch.amp.autocast("cuda")`: the
device becomes "tpu"; when no dtype is given, `dtype=torch.bfloat16` is added (CUDA's default was
float16).""",
          'with torch.autocast(device_type="cuda"):',
          'with torch.autocast(device_type="tpu", dtype=torch.bfloat16):'),
    _rule("TPU303", "autocast-fp16", W, UNSAFE, REVIEW, (32,),
          "autocast with dtype=float16; TPUs compute in bfloat16",
          """An explicit `dtype=torch.float16` in autocast. float16 autocast may be unsupported or slow on TPU
and needs loss scaling; bfloat16 does not. The unsafe fix switches to bfloat16.""",
          'with torch.autocast("tpu", dtype=torch.float16):', 'with torch.autocast("tpu", dtype=torch.bfloat16):'),
    _rule("TPU304", "grad-scaler", W, SAFE, AUTO_N, (33, 35),
          "CUDA GradScaler; moved to tpu (with bfloat16 no loss scaling is needed)",
          """`torch.cuda.amp.GradScaler()`, `torch.amp.GradScaler("cuda")`, `torch.GradScaler("cuda")`. The fix moves the
scaler to tpu and keeps its arguments, `enabled=` included, so a script that scales only for float16
(`enabled=(dtype == 'float16')`) still does. With bf16 autocast no loss scaling is needed: with --unsafe-fixes
the scaler is also disabled in place (`enabled=False`), so `scaler.scale(loss).backward()`, `scaler.step(opt)`
and `scaler.update()` keep working and do plain backward/step; remove those calls when convenient.""",
          "scaler = torch.cuda.amp.GradScaler(enabled=use_fp16)",
          'scaler = torch.amp.GradScaler("tpu", enabled=use_fp16)'),
    _rule("TPU305", "amp-custom-fwd-bwd", W, SAFE, AUTO, (34,),
          'torch.cuda.amp.custom_fwd/custom_bwd; use torch.amp.custom_fwd(device_type="tpu")',
          """The deprecated CUDA-only decorators for custom autograd Functions, bare or called
(`@custom_fwd(cast_inputs=torch.float32)`).""",
          "@torch.cuda.amp.custom_fwd", '@torch.amp.custom_fwd(device_type="tpu")'),
    _rule("TPU306", "fp16-dtype", W, UNSAFE, REVIEW, (36,),
          "float16 on TPU is slow and needs loss scaling; use bfloat16",
          """`torch.float16`/`torch.half`, `.half()`, `dtype="float16"`, HF `fp16=True`,
`torch_dtype=torch.float16`, `mixed_precision="fp16"`. The unsafe fix switches to bfloat16
(`torch.bfloat16`, `.bfloat16()`, `bf16=True`, `"bf16"`). Check checkpoints saved in fp16.""",
          "model = model.half()", "model = model.bfloat16()"),
    _rule("TPU307", "fp64-dtype", W, NOFIX, REVIEW, (37,),
          "float64 on TPU is emulated and slow; keep it on CPU or downcast deliberately",
          """`torch.float64`/`torch.double`, `.double()`, `dtype="float64"`, `dtype=np.float64`. TPUs have no native
float64. Never downcast silently: keep the computation on CPU or choose float32 explicitly.""",
          "x = torch.from_numpy(arr).double().to(device)", None),
    _rule("TPU308", "int64-sort", INFO, NOFIX, REVIEW, (38,),
          "sort/topk on int64 values; works on TPU but watch performance",
          """`x.long().sort()`, `.topk()`, `.argsort()` on int64 tensors. Correct on TPU, but 64-bit integer
work is emulated; prefer int32 keys where the range allows.""",
          "order = lengths.long().argsort()", None),
    _rule("TPU309", "cuda-matmul-tf32", W, SAFE, AUTO, (42,),
          "torch.backends.cuda.matmul precision flag; use torch.set_float32_matmul_precision",
          """`torch.backends.cuda.matmul.allow_tf32 = True` (and the reduced-precision-reduction flags) set CUDA
matmul precision. `allow_tf32 = True/False` becomes the device-generic `torch.set_float32_matmul_precision("high")`
(`"highest"` for False): PyTorch defines the two as the same setting, so the user's choice moves with the
device. The reduced-precision-reduction flags are only reported.""",
          "torch.backends.cuda.matmul.allow_tf32 = True", 'torch.set_float32_matmul_precision("high")'),
    _rule("TPU310", "channels-last", INFO, NOFIX, REVIEW, (79,),
          "channels_last memory format is a GPU layout optimisation; verify on TPU",
          """`memory_format=torch.channels_last` helps cuDNN; XLA chooses layouts itself. Keep it only if measured
faster; it is usually neutral.""",
          "model = model.to(memory_format=torch.channels_last)", None),
    # ---- TPU4xx backends / distributed / compile ----
    _rule("TPU401", "cudnn-benchmark", W, SAFE, AUTO, (39,),
          "`torch.backends.cudnn.benchmark` removed (no cuDNN on TPU)",
          """Setting cuDNN autotuning has no effect on TPU; the assignment is removed (an emptied block gets
`pass`). Also through `from torch.backends import cudnn`.""",
          "torch.backends.cudnn.benchmark = True", "(statement removed)"),
    _rule("TPU402", "cudnn-deterministic", W, UNSAFE, REVIEW, (40,),
          "`cudnn.deterministic` does nothing on TPU; use torch.use_deterministic_algorithms",
          """The unsafe fix replaces the assignment with `torch.use_deterministic_algorithms(<value>)` (check the
TPU backend supports it for the ops used).""",
          "torch.backends.cudnn.deterministic = True", "torch.use_deterministic_algorithms(True)"),
    _rule("TPU403", "cudnn-flags", W, SAFE, AUTO, (41,),
          "cuDNN flag assignment removed (no cuDNN on TPU)",
          """`torch.backends.cudnn.allow_tf32`, `.enabled`, `.benchmark_limit` assignments are removed;
`with torch.backends.cudnn.flags(...)` is reported.""",
          "torch.backends.cudnn.allow_tf32 = True", "(statement removed)"),
    _rule("TPU404", "sdp-kernel-selection", W, SAFE, AUTO_N, (43,),
          "CUDA SDPA kernel selection removed; F.scaled_dot_product_attention stays",
          """`with torch.backends.cuda.sdp_kernel(...)`, `with torch.nn.attention.sdpa_kernel(...)` are unwrapped;
`torch.backends.cuda.enable_flash_sdp/enable_mem_efficient_sdp/enable_math_sdp/enable_cudnn_sdp(...)`
statements are removed. Note: the TPU backend picks its own attention kernel.""",
          "with sdpa_kernel(SDPBackend.FLASH_ATTENTION):\n        out = F.scaled_dot_product_attention(q, k, v)",
          "out = F.scaled_dot_product_attention(q, k, v)"),
    _rule("TPU405", "cuda-linalg-fft", W, UNSAFE, REVIEW, (44,),
          "cuSOLVER/cuFFT configuration has no effect on TPU",
          """`torch.backends.cuda.preferred_linalg_library(...)`, `torch.backends.cuda.cufft_plan_cache...`.
The unsafe fix removes the statement.""",
          'torch.backends.cuda.preferred_linalg_library("cusolver")', "(statement removed)"),
    _rule("TPU406", "nccl-backend", W, SAFE, AUTO, (45,),
          'distributed backend "nccl"; use "tpu"',
          """`init_process_group("nccl")`, `backend="nccl"` on any call, an argparse `--dist-backend` default of
nccl. The TorchTPU distributed backend is registered as "tpu".""",
          'dist.init_process_group(backend="nccl")', 'dist.init_process_group(backend="tpu")'),
    _rule("TPU407", "nccl-backend-logic", W, UNSAFE, REVIEW, (46,),
          "code branches on the 'nccl' backend name",
          """`if backend == 'nccl'`, `assert backend in ['gloo', 'nccl']`, `backend = "nccl" if cuda else "gloo"`.
The unsafe fix puts 'tpu' in place of the literal; check the logic still holds.""",
          "assert args.backend in ['gloo', 'nccl']", "assert args.backend in ['gloo', 'tpu']"),
    _rule("TPU408", "cuda-version-check", W, NOFIX, REVIEW, (47,),
          "NCCL/CUDA/cuDNN version or availability check",
          """`dist.is_nccl_available()`, `torch.cuda.nccl.version()`, `torch.version.cuda`,
`torch.backends.cudnn.version()`, `torch.backends.cudnn.is_available()` are False/None on TPU. Remove or
guard them.""",
          "print(torch.version.cuda, torch.backends.cudnn.version())", None),
    _rule("TPU409", "ddp-device-ids", INFO, UNSAFE, REVIEW, (48,),
          "DDP device_ids/output_device: on tpu they index tpu devices; keep them equal to the process's device",
          """`DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)` works on tpu (the indices
name `tpu:<i>`, so they must match the device the module was moved to). The unsafe fix omits both arguments,
since the module is already on its device.""",
          "model = DDP(model, device_ids=[local_rank], output_device=local_rank)", "model = DDP(model)"),
    _rule("TPU410", "data-parallel", E, NOFIX, BLOCKER, (49,),
          "nn.DataParallel is single-process multi-GPU; use DDP on TPU",
          """`torch.nn.DataParallel` replicates over CUDA devices of one process. Use
`DistributedDataParallel` (one process per chip, backend "tpu") or FSDP2 `fully_shard`.""",
          "model = torch.nn.DataParallel(model).cuda()", None),
    _rule("TPU411", "fsdp-apex-ddp", W, NOFIX, REVIEW, (50,),
          "FSDP1 / apex DDP; use FSDP2 fully_shard or torch DDP on TPU",
          """`FullyShardedDataParallel(..., device_id=torch.cuda.current_device())` and
`apex.parallel.DistributedDataParallel`. TorchTPU supports DDP, FSDP2 (`fully_shard`) and DTensor.""",
          "model = FSDP(model, device_id=torch.cuda.current_device())", None),
    _rule("TPU412", "cuda-visible-devices", W, NOFIX, REVIEW, (52,),
          "CUDA_VISIBLE_DEVICES selects GPUs; on TPU use TPU_VISIBLE_CHIPS",
          """Reads and writes of `CUDA_VISIBLE_DEVICES` in Python. On a TPU VM use `TPU_VISIBLE_CHIPS` (with
`TPU_PROCESS_BOUNDS`, ...) or `torch.tpu.distributed.set_tpu_launch_env`.""",
          'os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"', None),
    _rule("TPU413", "cuda-env-vars", INFO, NOFIX, REVIEW, (29, 53),
          "NCCL/CUDA environment setting has no effect on TPU",
          """`NCCL_*`, `TORCH_NCCL_*`, `CUDA_LAUNCH_BLOCKING`, `CUDA_DEVICE_MAX_CONNECTIONS`, `TORCH_CUDA_ARCH_LIST`,
`PYTORCH_CUDA_ALLOC_CONF` in Python code. Remove them; the Debug eager mode replaces launch blocking.""",
          'os.environ["NCCL_DEBUG"] = "INFO"', None),
    _rule("TPU414", "profiler-cuda-activity", W, NOFIX, REVIEW, (55,),
          "profiler CUDA activity records nothing on TPU",
          """`torch.profiler.ProfilerActivity.CUDA` and `use_cuda=True` profile CUDA kernels. Profile CPU plus the
accelerator activity (PrivateUse1), or use `tputool profile`.""",
          "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]", None),
    _rule("TPU415", "compile-backend", W, SAFE, AUTO, (58,),
          'torch.compile uses Inductor by default; use backend="tpu"',
          """`torch.compile(model)` and `@torch.compile` get `backend="tpu"`; an explicit `backend="inductor"`
becomes "tpu" (Inductor on TPU is refused).""",
          "model = torch.compile(model)", 'model = torch.compile(model, backend="tpu")'),
    _rule("TPU416", "compile-mode-inductor", INFO, SAFE, AUTO, (59,),
          "Inductor-only compile options or torch._inductor.config: no effect on TPU, removed",
          """`options={...}` of `torch.compile` and `torch._inductor.config.* = ...` tune Inductor, which does not run on
TPU; the fix drops the `options` argument and the config assignments (the program computes the same).
`mode="reduce-overhead"` / `"max-autotune"` stay: the tpu backend accepts torch.compile's modes (each
compiles one XLA program per call).""",
          'torch.compile(model, backend="tpu", options={"epilogue_fusion": False})',
          'torch.compile(model, backend="tpu")'),
    _rule("TPU417", "jit-script", INFO, NOFIX, REVIEW, (60,),
          "TorchScript on TPU: verify, or prefer torch.compile",
          """`torch.jit.script` / `script_method` keep working as Python-level code, but TorchScript graphs are
not what the TPU compiler lowers; prefer `torch.compile(backend="tpu")` for speed.""",
          "scripted = torch.jit.script(model)", None),
    _rule("TPU418", "fused-optimizer", W, UNSAFE, REVIEW, (66,),
          "fused=True optimizer kernels are CUDA-only",
          """`torch.optim.AdamW(..., fused=True)` (or `fused=use_fused`). The fused implementation is for CUDA; on
TPU drop it (XLA fuses the update) or use `torch.tpu.optimizers.AdamW`. The unsafe fix drops a literal
`fused=True`.""",
          "opt = torch.optim.AdamW(params, lr=lr, fused=True)", "opt = torch.optim.AdamW(params, lr=lr)"),
    _rule("TPU419", "multi-backend-ladder", INFO, NOFIX, REVIEW, (85,),
          "device-selection ladder without a TPU branch",
          """`torch.backends.mps.is_available()` / XPU ladders, `use_cuda` flags and `--no-cuda` options. Add a `tpu`
branch, or collapse the ladder onto `torch.accelerator.current_accelerator()`.""",
          'parser.add_argument("--no-cuda", action="store_true")', None),
    # ---- TPU5xx kernels / extensions / third-party CUDA libraries ----
    _rule("TPU501", "triton-kernel", E, NOFIX, BLOCKER, (61,),
          "Triton kernels run only on GPUs; rewrite as Pallas/JAX or pure torch",
          """`import triton`, `@triton.jit`, `@triton.autotune`, `torch.library.triton_op`, `wrap_triton`,
`torch.utils._triton.has_triton()`. Write the kernel in Pallas and call it through
`torch.tpu.pallas.jax_op`, or fall back to plain torch ops.""",
          "@triton.jit\n    def add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr): ...", None),
    _rule("TPU502", "cuda-extension", E, NOFIX, BLOCKER, (62,),
          "custom CUDA extension/op cannot run on TPU",
          """`torch.utils.cpp_extension.load(...)`, `load_inline(cuda_sources=...)`, `CUDAExtension`, `CUDA_HOME`,
and calls of custom ops `torch.ops.<ns>.<op>`. Re-express the op with torch ops or a Pallas kernel.""",
          'ext = load(name="fused", sources=["fused.cpp", "fused_kernel.cu"])', None),
    _rule("TPU503", "cuda-only-aten-op", W, NOFIX, REVIEW, (63,),
          "CUDA-only aten op (int4/int8/fp8 matmul)",
          """`torch._scaled_mm` (fp8), `torch._int_mm`, `torch._grouped_mm`, `torch.ops.aten._weight_int4pack_mm`.
Use a TPU-supported equivalent or a dequantised matmul.""",
          "out = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb)", None),
    _rule("TPU504", "apex-amp", W, NOFIX, REVIEW, (64,),
          "Apex AMP; use native torch.autocast('tpu', dtype=torch.bfloat16)",
          """`from apex import amp`, `amp.initialize(..., opt_level=...)`, `with amp.scale_loss(loss, opt)`.
Replace with `torch.autocast("tpu", dtype=torch.bfloat16)` and a plain `loss.backward()`.""",
          'model, opt = amp.initialize(model, opt, opt_level="O1")', None),
    _rule("TPU505", "apex-fused-norm", W, SAFE, AUTO_N, (65,),
          "Apex fused norm/SyncBN; use the torch.nn module",
          """`apex.normalization.FusedLayerNorm` -> `torch.nn.LayerNorm`, `FusedRMSNorm` -> `torch.nn.RMSNorm`,
`apex.parallel.SyncBatchNorm` -> `torch.nn.SyncBatchNorm`, `convert_syncbn_model` ->
`torch.nn.SyncBatchNorm.convert_sync_batchnorm`. Note: the constructor arguments match for the common
cases; apex-only ones (`memory_efficient`, `channel_last`, `fuse_relu`) must be removed by hand.""",
          "self.ln = FusedLayerNorm(dim)", "self.ln = torch.nn.LayerNorm(dim)"),
    _rule("TPU506", "apex-fused-optimizer", W, NOFIX, REVIEW, (65,),
          "Apex fused optimizer is CUDA-only; use torch.optim or torch.tpu.optimizers",
          """`apex.optimizers.FusedAdam` (AdamW semantics by default) -> `torch.optim.AdamW`, `FusedLAMB`,
`FusedSGD` -> torch.optim equivalents. Check hyper-parameter names.""",
          "opt = FusedAdam(model.parameters(), lr=1e-3)", None),
    _rule("TPU507", "flash-attn", W, UNSAFE, REVIEW, (67,),
          "flash_attn kernels are CUDA-only; use F.scaled_dot_product_attention",
          """`flash_attn_func`, `flash_attn_varlen_func`, `flash_attn_qkvpacked_func` and HF
`attn_implementation="flash_attention_2"`. Use SDPA (layouts differ: flash_attn takes (B, S, H, D),
SDPA (B, H, S, D)). The unsafe fix changes `attn_implementation` to "sdpa".""",
          'model = AutoModel.from_pretrained(name, attn_implementation="flash_attention_2")',
          'model = AutoModel.from_pretrained(name, attn_implementation="sdpa")'),
    _rule("TPU508", "xformers", W, NOFIX, REVIEW, (68,),
          "xformers is CUDA-only; use F.scaled_dot_product_attention",
          """`xformers.ops.memory_efficient_attention` and other xformers imports. Use SDPA with an attention mask
(`attn_bias` becomes `attn_mask`).""",
          "out = xops.memory_efficient_attention(q, k, v)", None),
    _rule("TPU509", "bitsandbytes", E, NOFIX, BLOCKER, (69,),
          "bitsandbytes quantisation is CUDA-only",
          """`import bitsandbytes`, `bnb.optim.Adam8bit`, `BitsAndBytesConfig`, `load_in_8bit/4bit=True`,
`prepare_model_for_int8_training/kbit_training`. Use bf16 weights or a TPU-native quantisation path.""",
          "model = AutoModel.from_pretrained(name, load_in_8bit=True)", None),
    _rule("TPU510", "hf-accelerate", INFO, NOFIX, REVIEW, (71,),
          "HF accelerate needs TorchTPU support inside accelerate",
          """`Accelerator()` user code needs no change, but accelerate itself must know the tpu device; choose
`mixed_precision="bf16"`.""",
          'accelerator = Accelerator(mixed_precision="fp16")', None),
    _rule("TPU511", "deepspeed", E, NOFIX, BLOCKER, (72,),
          "DeepSpeed needs a TorchTPU accelerator; not available",
          """`deepspeed.initialize`, `deepspeed.ops.*` (FusedAdam, CPUAdam), `get_accelerator()`, a ds_config
`"fp16": {"enabled": True}`. Use torch DDP/FSDP2 with bf16 on TPU.""",
          "engine, opt, _, _ = deepspeed.initialize(model=model, config=ds_config)", None),
    _rule("TPU512", "gpu-monitoring", W, NOFIX, REVIEW, (56,),
          "NVIDIA GPU monitoring does not see TPUs",
          """`pynvml`, `GPUtil`, `nvidia-smi` subprocesses, `torch.cuda.utilization()/temperature()/power_draw()`.
Remove, or read TPU runtime metrics.""",
          'out = subprocess.check_output(["nvidia-smi", "--query-gpu=memory.used"])', None),
    # ---- TPU6xx performance lints ----
    _rule("TPU601", "host-sync-in-loop", INFO, NOFIX, REVIEW, (76,),
          "host sync inside a loop stalls the TPU pipeline",
          """`.item()`, `.cpu()`, `.tolist()`, `.numpy()` inside a `for`/`while` body or a comprehension force the
host to wait for the device every iteration. Accumulate on device and read once, or log every N steps.""",
          "for batch in loader:\n        total += loss(batch).item()", None),
    _rule("TPU602", "dynamic-shape-op", INFO, NOFIX, REVIEW, (77,),
          "op with a data-dependent output shape forces recompiles on TPU",
          """`nonzero`, `unique`, `masked_select`, `argwhere`, one-argument `torch.where`. Pad to fixed sizes
or use masks (`torch.where(cond, a, b)`) so shapes stay static.""",
          "idx = torch.nonzero(mask)", None),
    _rule("TPU603", "non-128-dim", INFO, NOFIX, REVIEW, (78,),
          "model dimension not a multiple of 128 under-fills the TPU MXU",
          """`head_dim=64`, `hidden_size=...` and similar sizes that are not multiples of 128 pad the 128x128 matrix
units. Prefer 128/256 multiples where the model allows.""",
          "config = dict(head_dim=64)", None),
    _rule("TPU604", "gpu-peak-flops", INFO, NOFIX, REVIEW, (80,),
          "hard-coded GPU peak FLOPs; MFU will be wrong on TPU",
          """A FLOPs constant (`flops_promised = 312e12  # A100`) used for MFU. Use the TPU generation's peak
(see `tputool tune`'s spec table).""",
          "flops_promised = 312e12  # A100 bf16 peak", None),
]

RULES: dict[str, Rule] = {r.code: r for r in _RULE_LIST}

# ---- non-Python file rules (engine) ----
# TPU9xx rules live in tputool/rules/text.py, diagnose's TPU8xx in tputool/rules/runtime.py; tputool/rules/catalogue.py merges them.
