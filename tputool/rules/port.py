"""Every Python rewrite rule of `tputool port` as data: code, name, message, severity, fix safety, class, doc,
and how port finds it (`Port`: triggers, matched names, handlers), so a new rule is registered here alone.

Code ranges: TPU1xx device placement, TPU2xx the torch.cuda API, TPU3xx amp and precision,
TPU4xx backends / distributed / compile, TPU5xx kernels, extensions and third-party CUDA libraries,
TPU6xx performance lints, TPU9xx non-Python files (tputool/rules/text.py, merged by catalogue.py).
Codes are stable: a published code never changes meaning. Rewriting machinery: tputool/codemods/python/.
"""

from __future__ import annotations

from tputool.rules.model import (
    ASSIGN,
    FIND,
    OWNED,
    RENAME,
    FixSafety,
    Hook,
    NameRef,
    Port,
    Rule,
    RuleClass,
    Severity,
)

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO
SAFE, UNSAFE, NOFIX = FixSafety.SAFE, FixSafety.UNSAFE, FixSafety.NONE
AUTO, AUTO_N, REVIEW, BLOCKER = RuleClass.AUTO, RuleClass.AUTO_NOTE, RuleClass.REVIEW, RuleClass.BLOCKER

# ---- the handlers of tputool/codemods/python/ the rules below name (shared ones once, here) ----
# Call handlers run in this order on every call (each may return a new node for the next); before them the
# transformer reports statement/with-owned calls used elsewhere, and reference names by the `refs` below.
FORMAT_CALL = Hook("Call", "device.format_call", 10)
CUDA_METHOD = Hook("Call", "device.cuda_method", 20)
TO_CALL = Hook("Call", "device.to_call", 30)
TORCH_DEVICE = Hook("Call", "device.torch_device", 40)
SET_DEVICE_ARG = Hook("Call", "device.set_device_arg", 50)
DEVICE_KWARGS = Hook("Call", "device.device_kwargs", 60)
LOOKUP_DEFAULT = Hook("Call", "device.lookup_default", 70)
ARGPARSE = Hook("Call", "device.argparse_call", 80)
STARTSWITH = Hook("Call", "device.startswith_check", 90)
CUDA_AUTOCAST = Hook("Call", "amp.cuda_autocast", 100)
GENERIC_AUTOCAST = Hook("Call", "amp.generic_autocast", 110)
GRAD_SCALER = Hook("Call", "amp.grad_scaler", 120)
CUSTOM_FWD_CALL = Hook("Call", "amp.custom_fwd_call", 130)
PRECISION_METHODS = Hook("Call", "amp.precision_methods", 140)
DTYPE_KWARGS = Hook("Call", "amp.dtype_kwargs", 150)
BACKEND_ARGS = Hook("Call", "dist.backend_args", 160)
DDP = Hook("Call", "dist.ddp", 170)
COMPILE_CALL = Hook("Call", "dist.compile_call", 180)
FUSED_OPTIMIZER = Hook("Call", "dist.fused_optimizer", 190)
HF_KWARGS = Hook("Call", "dist.hf_kwargs", 200)
CALL_LINTS = Hook("Call", "perf.call_lints", 210)
KERNEL_REGISTRATION = Hook("Call", "api.cuda_kernel_registration", 220)
BF16_SUPPORTED = Hook("Call", "api.bf16_supported", 900)  # last: it may replace the call by `True`
# Other node kinds (the reference machinery runs after an Attribute's handlers).
IS_CUDA_ATTR = Hook("Attribute", "device.is_cuda_attr")
OWN_CUDA_METHOD = Hook("FunctionDef", "device.own_cuda_method")
DECORATOR = Hook("Decorator", "amp.decorator")
STRING_LITERAL = Hook("SimpleString", "api.string_literal")
FSTRING = Hook("FormattedString", "device.dynamic_string")
MODULO_DEVICE_COUNT = Hook("BinaryOperation", "device.modulo_device_count", 0)
BINOP_STRING = Hook("BinaryOperation", "device.dynamic_string", 10)
AND_TRUE = Hook("BooleanOperation", "api.and_true")
IFEXP = Hook("IfExp", "device.ifexp")
COMPARISON = Hook("Comparison", "device.comparison")
ASSIGN_LINTS = (Hook("Assign", "perf.assign_lints", 0), Hook("AnnAssign", "perf.assign_lints", 0))
ASSIGN_DEFAULT = (Hook("Assign", "device.assign_default", 10), Hook("AnnAssign", "device.assign_default", 10))
BACKEND_ASSIGN = Hook("Assign", "dist.backend_assign", 20)
PARAM_DEFAULT = Hook("Param", "device.param_default")
SEQUENCE_DEVICES = tuple(Hook(kind, "device.sequence_devices") for kind in ("Tuple", "List", "Set"))
DS_CONFIG = Hook("Dict", "dist.ds_config", 0)
DICT_LINTS = Hook("Dict", "perf.dict_lints", 10)
DICT_DEFAULT = Hook("Dict", "device.dict_default", 20)


def _many(names: str, kind: str = FIND, prefix: str = "torch.cuda.", target: str | None = None,
          message: str | None = None, note: str | None = None) -> tuple[tuple[str, NameRef], ...]:
    """`refs` entries for space-separated names under `prefix`; a RENAME maps each onto `target` + name."""
    return tuple((prefix + n, NameRef(kind, (target + n) if target else None, message, note)) for n in names.split())


_N_STREAM = "XLA orders TPU work itself; side streams rarely overlap anything, check the stream logic"
_MEMORY_CONFIG = ("torch.cuda.set_per_process_memory_fraction", "torch.cuda.memory.set_per_process_memory_fraction",
                  "torch.cuda.memory._record_memory_history", "torch.cuda.memory._dump_snapshot")
_SDP_SWITCHES = ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_math_sdp", "enable_cudnn_sdp")
# Fields of CUDA's device properties that torch.tpu's have not: reading one makes get_device_properties() a CUDA
# hardware query (TPU203); they are its trigger words, so the statements reading them are never masked.
CUDA_PROPERTY_FIELDS = ("major", "minor", "multi_processor_count", "gcnArchName", "L2_cache_size", "warp_size",
                        "max_threads_per_multi_processor", "regs_per_multiprocessor", "shared_memory_per_block",
                        "shared_memory_per_block_optin", "shared_memory_per_multiprocessor", "is_integrated",
                        "is_multi_gpu_board", "uuid", "pci_bus_id", "pci_device_id", "pci_domain_id")
# torch.optim classes whose fused=True step the tpu device runs as one computation (backend/lowerings/optim.py;
# tests/backend/test_rule_capabilities.py holds this against the backend): fused=True on others is TPU418.
FUSED_ON_TPU = ("Adam", "AdamW", "SGD")
_LOW_PRECISION_MM = "_scaled_mm _int_mm _grouped_mm _weight_int4pack_mm _weight_int8pack_mm"


def _rule(code: str, name: str, sev: Severity, fix: FixSafety, cls: RuleClass, patterns: tuple[int, ...],
          message: str, what: str, before: str, after: str | None, port: Port | None = None) -> Rule:
    """One Rule; the doc is `what` plus a before/after example (after is None for finding-only rules)."""
    example = f"Before:\n    {before}\n" + (f"After:\n    {after}\n" if after is not None else "")
    fix_line = {SAFE: "Fix: applied by `tputool port`.",
                UNSAFE: "Fix: applied only with --unsafe-fixes (review the result).",
                NOFIX: "Fix: none automatic; the finding says what to change."}[fix]
    doc = f"{what.strip()}\n{fix_line}\n{example}"
    return Rule(code=code, name=name, message=message, severity=sev, fix=fix, rule_class=cls, doc=doc,
                patterns=patterns, before=before, after=after, port=port)


_RULE_LIST: list[Rule] = [
    # ---- TPU1xx device placement ----
    _rule("TPU101", "cuda-method-no-args", W, SAFE, AUTO_N, (1,),
          '`.cuda()` moves to a CUDA device; use `.to("tpu")`',
          """`x.cuda()` / `module.cuda()` with no argument. On TPU the device is `tpu`; `.to("tpu")` returns the
moved tensor (or the module itself, in place) exactly like `.cuda()`. Note: the call site is rewritten;
`.cuda()` is never redefined at run time.""",
          "model = Net().cuda()", 'model = Net().to("tpu")',
          port=Port(triggers=("cuda",), hooks=(CUDA_METHOD, OWN_CUDA_METHOD))),
    _rule("TPU102", "cuda-method-device", W, SAFE, AUTO_N, (2,),
          '`.cuda(i)` selects a CUDA device index; use `.to(torch.device("tpu", i))`',
          """`x.cuda(i)`, `x.cuda(args.gpu)`, `x.cuda(device=i)`. An int index becomes `torch.device("tpu", i)`;
a `'cuda:N'` literal becomes `'tpu:N'`; a variable named like a device (`device`, `dev`) is passed
as it is. Note: check that the index means a local TPU chip.""",
          "x = x.cuda(args.gpu)", 'x = x.to(torch.device("tpu", args.gpu))',
          port=Port(triggers=("cuda",), hooks=(CUDA_METHOD,))),
    _rule("TPU103", "cuda-method-non-blocking", W, SAFE, AUTO, (3, 75),
          '`.cuda(non_blocking=True)`; use `.to("tpu", non_blocking=True)`',
          """`x.cuda(non_blocking=True)` keeps its `non_blocking` flag (host-to-device copies may be asynchronous
on TPU too, so the flag is kept as it is).""",
          "x = x.cuda(non_blocking=True)", 'x = x.to("tpu", non_blocking=True)',
          port=Port(triggers=("cuda",), hooks=(CUDA_METHOD,))),
    _rule("TPU104", "to-cuda-string", W, SAFE, AUTO, (4,),
          '`.to("cuda")` names a CUDA device; use "tpu"',
          """`.to("cuda")`, `.to("cuda:0")`, `.to(device="cuda")`: the device string becomes `"tpu"` /
`"tpu:0"`.""",
          'batch = batch.to("cuda:0")', 'batch = batch.to("tpu:0")',
          port=Port(triggers=("cuda", ".to("), hooks=(TO_CALL,))),
    _rule("TPU105", "device-kwarg-cuda", W, SAFE, AUTO, (5,),
          '`device="cuda"` argument; use "tpu"',
          """A `device=` (or `device_type=`, `*_device=`) keyword set to a CUDA device string, on factories
(`zeros/ones/empty/full/rand/randn/randint/randperm/arange/linspace/logspace/eye/tensor/as_tensor/
normal/*_like/new_*`), generators, `torch.amp.custom_fwd` and any other call.""",
          'mask = torch.ones(n, n, device="cuda")', 'mask = torch.ones(n, n, device="tpu")',
          port=Port(triggers=("cuda", "device"), hooks=(DEVICE_KWARGS,))),
    _rule("TPU106", "torch-device-cuda", W, SAFE, AUTO, (6, 13),
          '`torch.device("cuda")`; use torch.device("tpu")',
          """`torch.device("cuda")`, `torch.device("cuda", i)`, `torch.device("cuda:0")`, also as a context
manager (`with torch.device("cuda"):`) and with a conditional argument
(`torch.device("cuda" if use_cuda else "cpu")`).""",
          'dev = torch.device("cuda", local_rank)', 'dev = torch.device("tpu", local_rank)',
          port=Port(triggers=("cuda",), hooks=(TORCH_DEVICE,))),
    _rule("TPU107", "dynamic-device-string", W, SAFE, AUTO_N, (7,),
          "device string built as 'cuda:<n>'; build 'tpu:<n>'",
          """Device strings built at run time: `f"cuda:{rank}"`, `"cuda:{}".format(gpu)`, `"cuda:%d" % i`,
`"cuda:" + str(i)`. Note: check the index is a local TPU chip index.""",
          'device = f"cuda:{rank}"', 'device = f"tpu:{rank}"',
          port=Port(triggers=("cuda",), hooks=(FORMAT_CALL, FSTRING, BINOP_STRING))),
    _rule("TPU108", "device-default-cuda", W, SAFE, AUTO_N, (8,),
          "CUDA device as a default/config value; use 'tpu'",
          """A device default: `device = 'cuda'` (a variable or attribute named like a device), a parameter default
`def f(device='cuda')`, a config dict `{"device": "cuda"}`, an argparse `default='cuda'` or
`choices=["cpu", "cuda"]`. Note: update any help text that still says cuda.""",
          "parser.add_argument('--device', default='cuda', choices=['cpu', 'cuda'])",
          "parser.add_argument('--device', default='tpu', choices=['cpu', 'tpu'])",
          port=Port(triggers=("cuda", "device"), hooks=(LOOKUP_DEFAULT, ARGPARSE, *ASSIGN_DEFAULT, PARAM_DEFAULT, *SEQUENCE_DEVICES, DICT_DEFAULT))),
    _rule("TPU109", "device-string-check", W, UNSAFE, REVIEW, (9,),
          "code compares a device to 'cuda'; after porting the device is 'tpu'",
          """String and type checks such as `device == 'cuda'`, `'cuda' in device`, `device.type == 'cuda'`,
`device_type != 'cuda'`, `str(d).startswith('cuda')`, and maps keyed by device type (`{"cuda": "nccl", "cpu": "gloo"}`).
After the port the device is `tpu`, so the branch flips. The port moves a device as a whole concept: where the
compared value is a device (a name like `device`/`device_type`/`args.device`, `x.device.type`, `str(device)`, or a
name assigned from one), the fix compares to 'tpu' and is applied by default (safe here); elsewhere
(`kind == 'cuda'`) the same fix needs --unsafe-fixes and the finding says so.""",
          "if device.type == 'cuda': torch.cuda.synchronize()",
          "if device.type == 'tpu': torch.tpu.synchronize()",
          port=Port(triggers=("cuda",), hooks=(STARTSWITH, COMPARISON, *SEQUENCE_DEVICES, DICT_DEFAULT))),
    _rule("TPU110", "bare-int-device", INFO, UNSAFE, REVIEW, (10,),
          "a bare integer is used as a device; torch.device('tpu', i) says which device explicitly",
          """`.to(0)`, `.to(local_rank)`, `torch.device(0)`, `rank % torch.cuda.device_count()`: PyTorch reads a bare
int as an index of the current accelerator, so on a TPU host it already means `tpu:<i>`; the finding is
informational. The unsafe fix wraps literal ints and rank-like names in `torch.device("tpu", i)`.""",
          "model.to(local_rank)", 'model.to(torch.device("tpu", local_rank))',
          port=Port(triggers=("cuda", "device", ".to("), hooks=(TO_CALL, TORCH_DEVICE, MODULO_DEVICE_COUNT))),
    _rule("TPU111", "is-cuda-attribute", W, SAFE, AUTO, (11,),
          '`.is_cuda` is False for TPU tensors; use `.device.type == "tpu"`',
          """`tensor.is_cuda` (and `param.is_cuda`) checks for a CUDA tensor; on TPU it is always False.""",
          "if x.is_cuda: y = y.to(x.device)", 'if x.device.type == "tpu": y = y.to(x.device)',
          port=Port(triggers=("cuda",), hooks=(IS_CUDA_ATTR,))),
    _rule("TPU112", "map-location-cuda", W, SAFE, AUTO_N, (12,),
          "`map_location` loads onto CUDA; use 'tpu' (or 'cpu' then .to())",
          """`torch.load(..., map_location="cuda")` becomes "tpu". A callable or dict `map_location` is only
reported: load on "cpu" and move with `.to("tpu")`. Note: tensors saved on GPU load onto the TPU.""",
          'state = torch.load(path, map_location="cuda:0")', 'state = torch.load(path, map_location="tpu:0")',
          port=Port(triggers=("cuda", "map_location"), hooks=(DEVICE_KWARGS,))),
    _rule("TPU113", "default-device-cuda", W, SAFE, AUTO, (13,),
          '`torch.set_default_device("cuda")`; use "tpu"',
          """The default device for factories set to CUDA.""",
          'torch.set_default_device("cuda")', 'torch.set_default_device("tpu")',
          port=Port(triggers=("cuda",), hooks=(TORCH_DEVICE,))),
    _rule("TPU114", "cuda-if-available", W, SAFE, AUTO, (16,),
          "'cuda' if torch.cuda.is_available() else 'cpu'; choose 'tpu'",
          """The usual device ladder picks CUDA when it is available; it becomes the same ladder for TPU.""",
          "device = 'cuda' if torch.cuda.is_available() else 'cpu'",
          "device = 'tpu' if torch.tpu.is_available() else 'cpu'",
          port=Port(triggers=("cuda",), hooks=(IFEXP,))),
    _rule("TPU115", "hf-device-map", W, SAFE, REVIEW, (70,),
          "device_map/max_memory place a model across GPUs; use device_map='tpu'",
          """Hugging Face big-model placement (`device_map="auto"`, `device_map={"": local_rank}`,
`max_memory={0: "20GiB"}`) targets CUDA indices. `device_map="cuda"` / `"cuda:N"` becomes `"tpu"` / `"tpu:N"` (the fix);
the others are reported: use `device_map="tpu"` (or `{"": "tpu:N"}`), or load on CPU and move with `.to("tpu")`.
`device_map` needs the `accelerate` package: `pip install 'tputool[hf]'`.""",
          'AutoModel.from_pretrained(name, device_map="cuda")', 'AutoModel.from_pretrained(name, device_map="tpu")',
          port=Port(triggers=("cuda", "device_map", "max_memory"), hooks=(HF_KWARGS,))),
    _rule("TPU116", "pin-memory-device", INFO, UNSAFE, REVIEW, (74,),
          '`pin_memory_device="cuda"` pins for a CUDA device; drop it',
          """`DataLoader(pin_memory=True)` and `tensor.pin_memory()` can stay; a `pin_memory_device="cuda"`
value names a CUDA device. The unsafe fix drops the argument.""",
          'DataLoader(ds, pin_memory=True, pin_memory_device="cuda")', "DataLoader(ds, pin_memory=True)",
          port=Port(triggers=("cuda",), hooks=(DEVICE_KWARGS,))),
    # ---- TPU2xx torch.cuda API ----
    _rule("TPU201", "cuda-runtime-api", W, SAFE, AUTO, (15, 17, 18, 19, 20, 21, 83, 84),
          "torch.cuda runtime call; use the same call on torch.tpu",
          """`torch.cuda.is_available/device_count/current_device/set_device/synchronize/manual_seed/
manual_seed_all/initial_seed/is_initialized` have the same meaning on `torch.tpu`. Aliases resolve
(`import torch as th`, `from torch import cuda`, `import torch.cuda as tc`); a `'cuda:N'` argument of
set_device is rewritten too.""",
          "torch.cuda.manual_seed_all(seed)", "torch.tpu.manual_seed_all(seed)",
          port=Port(triggers=("cuda", "Cuda", "CUDA"), hooks=(SET_DEVICE_ARG, BACKEND_ASSIGN),
               refs=_many("is_available device_count current_device set_device synchronize manual_seed "
                          "manual_seed_all initial_seed is_initialized", RENAME, target="torch.tpu."))),
    _rule("TPU202", "cuda-device-info", W, SAFE, AUTO_N, (22,),
          "torch.cuda device name/properties; use torch.tpu",
          """`torch.cuda.get_device_name()`, `get_device_properties(i)` exist on torch.tpu (a "cuda" device argument
becomes "tpu"). Note: the properties object has TPU fields (`name`, `total_memory`, ...); where the code reads a
CUDA-only field (`major`, `minor`, `multi_processor_count`) the call is a hardware query, kept as CUDA (TPU203).""",
          "name = torch.cuda.get_device_name(0)", "name = torch.tpu.get_device_name(0)",
          port=Port(triggers=("cuda",), refs=_many(
              "get_device_name get_device_properties", RENAME, target="torch.tpu.",
              note="the properties object has TPU fields; CUDA-only ones (major/minor/multi_processor_count) are absent"))),
    _rule("TPU203", "cuda-capability-check", W, NOFIX, REVIEW, (23,),
          "CUDA compute-capability check has no TPU meaning",
          """`torch.cuda.get_device_capability()`, `torch.cuda.get_device_properties(d).major/.minor/
.multi_processor_count` and checks like `>= (8, 0)` gate features on GPU generations. Port leaves such a query as
it is, arguments included (on a machine without CUDA the original takes its non-CUDA path, and so does the port;
an availability check guarding it stays too, TPU220). On TPU remove the check (bf16 and fast matmuls are always
available) or test `torch.tpu.is_available()`.""",
          "if torch.cuda.get_device_capability() >= (8, 0): use_bf16 = True", None,
          port=Port(triggers=("cuda",), words=CUDA_PROPERTY_FIELDS,
                    refs=(("torch.cuda.get_device_capability", NameRef()),))),
    _rule("TPU204", "bf16-supported", W, SAFE, AUTO_N, (24,),
          "`torch.cuda.is_bf16_supported()` is True on TPU",
          """TPUs compute natively in bfloat16, so the check is replaced by `True`.""",
          "dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16",
          "dtype = torch.bfloat16 if True else torch.float16",
          port=Port(triggers=("cuda",), hooks=(BF16_SUPPORTED, AND_TRUE),
               refs=(("torch.cuda.is_bf16_supported", NameRef(OWNED)),))),
    _rule("TPU205", "cuda-event", W, SAFE, AUTO_N, (25,),
          "torch.cuda.Event; use torch.tpu.Event",
          """`torch.cuda.Event(enable_timing=True)` with `.record()`, `.elapsed_time()`, `.synchronize()`.
Note: torch.tpu.Event has the same methods (record, elapsed_time, synchronize, query, wait); it times the
host's view of device work, so check timings against a profile.""",
          "start = torch.cuda.Event(enable_timing=True)", "start = torch.tpu.Event(enable_timing=True)",
          port=Port(triggers=("cuda",), refs=(("torch.cuda.Event", NameRef(
              RENAME, "torch.tpu.Event", note="torch.tpu.Event times the host's view of device work; check against a profile")),))),
    _rule("TPU206", "cuda-stream", W, SAFE, AUTO_N, (26,),
          "CUDA stream API; use torch.tpu streams",
          """`torch.cuda.Stream`, `torch.cuda.stream(s)`, `current_stream()`, `default_stream()`, `set_stream()`
are all in torch.tpu. Note: XLA orders device work itself; side streams rarely overlap anything on TPU,
and `t.record_stream(s)` / `s.wait_stream()` calls may be dropped.""",
          "with torch.cuda.stream(side):", "with torch.tpu.stream(side):",
          port=Port(triggers=("cuda",), refs=_many("Stream stream current_stream default_stream set_stream", RENAME,
                                              target="torch.tpu.", note=_N_STREAM))),
    _rule("TPU207", "cuda-device-context", W, SAFE, AUTO_N, (81,),
          "torch.cuda.device()/device_of(); use torch.tpu.device()/device_of()",
          """The `torch.cuda.device(i)` context manager and `torch.cuda.device_of(t)` exist on torch.tpu.
Note: prefer explicit devices (`.to(torch.device("tpu", i))`).""",
          "with torch.cuda.device(rank):", "with torch.tpu.device(rank):",
          port=Port(triggers=("cuda",), refs=_many("device device_of", RENAME, target="torch.tpu.",
                                              note="prefer explicit devices: .to(torch.device('tpu', i))"))),
    _rule("TPU208", "cuda-rng-state", W, SAFE, AUTO_N, (73,),
          "CUDA RNG state API; use torch.tpu's",
          """`torch.cuda.get_rng_state/set_rng_state/default_generators` become torch.tpu's. The `*_all`
variants have no torch.tpu equivalent and are only reported (save one state per device instead).""",
          "state = torch.cuda.get_rng_state()", "state = torch.tpu.get_rng_state()",
          port=Port(triggers=("cuda",), refs=(
              *_many("get_rng_state set_rng_state default_generators", RENAME, target="torch.tpu.",
                     note="RNG streams differ between CUDA and TPU; saved CUDA states do not transfer"),
              *_many("get_rng_state_all set_rng_state_all",
                     message="torch.cuda.*_rng_state_all has no torch.tpu equivalent; save one state per device")))),
    _rule("TPU209", "cuda-memory-stats", W, SAFE, AUTO_N, (27,),
          "CUDA memory statistics; use the same call on torch.tpu",
          """`memory_allocated`, `max_memory_allocated`, `memory_reserved`, `max_memory_reserved`,
`reset_peak_memory_stats`, `reset_max_memory_allocated`, `memory_stats` and `mem_get_info` move to `torch.tpu`, which
reads JAX's device memory statistics (a count of live buffers where the platform reports none), so memory logging
keeps working. `memory_summary`, `memory_snapshot`, `list_gpu_processes` and the `*_cached` names have no
equivalent and are reported.""",
          "peak = torch.cuda.max_memory_allocated() / 2**30", "peak = torch.tpu.max_memory_allocated() / 2**30",
          port=Port(triggers=("cuda",), refs=(
              *_many("memory_allocated max_memory_allocated memory_reserved max_memory_reserved "
                     "reset_peak_memory_stats reset_max_memory_allocated memory_stats mem_get_info", RENAME,
                     target="torch.tpu.",
                     note="torch.tpu reads JAX's device memory statistics (live buffers where the platform reports none)"),
              *_many("reset_max_memory_cached reset_accumulated_memory_stats memory_stats_as_nested_dict "
                     "memory_summary memory_snapshot memory_cached max_memory_cached list_gpu_processes memory",
                     message="this CUDA memory statistic has no torch.tpu equivalent; use torch.tpu.memory_stats()")))),
    _rule("TPU210", "empty-cache", W, SAFE, AUTO_N, (28,),
          "`torch.cuda.empty_cache()` removed (XLA manages TPU memory)",
          """The CUDA caching allocator has no TPU counterpart; the statement is removed (an emptied block gets
`pass`). Note: if memory must be released, drop references to tensors instead.""",
          "torch.cuda.empty_cache()", "(statement removed)",
          port=Port(triggers=("cuda",), refs=_many("torch.cuda.empty_cache torch.cuda.memory.empty_cache", OWNED, prefix=""),
               statements=("torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"),
               fix_note="XLA manages TPU memory; drop references to free it")),
    _rule("TPU211", "cuda-memory-config", W, UNSAFE, REVIEW, (29,),
          "CUDA allocator configuration has no effect on TPU",
          """`torch.cuda.set_per_process_memory_fraction`, `torch.cuda.memory._record_memory_history`,
`_dump_snapshot`. The unsafe fix removes the statement.""",
          "torch.cuda.set_per_process_memory_fraction(0.9)", "(statement removed)",
          port=Port(triggers=("cuda",), refs=_many(" ".join(_MEMORY_CONFIG), OWNED, prefix=""), statements=_MEMORY_CONFIG)),
    _rule("TPU212", "cuda-oom-error", W, UNSAFE, REVIEW, (30,),
          "`torch.cuda.OutOfMemoryError` only catches CUDA OOMs",
          """`except torch.cuda.OutOfMemoryError` will not catch a TPU out-of-memory. The unsafe fix uses the
device-generic `torch.OutOfMemoryError`, which the tpu device raises when its memory is exhausted (in recent PyTorch
`torch.cuda.OutOfMemoryError` is that same class, so the rename changes nothing on CUDA).""",
          "except torch.cuda.OutOfMemoryError:", "except torch.OutOfMemoryError:",
          port=Port(triggers=("cuda", "OutOfMemory"),
               refs=(("torch.cuda.OutOfMemoryError", NameRef(RENAME, "torch.OutOfMemoryError")),))),
    _rule("TPU213", "legacy-tensor-type", W, SAFE, REVIEW, (14,),
          "legacy CUDA tensor type; use torch.tensor(..., dtype=..., device='tpu')",
          """`torch.cuda.FloatTensor(...)`, `torch.cuda.LongTensor`: construct with `torch.tensor(data, dtype=...,
device="tpu")` or `torch.empty(size, ...)` (reported). `torch.set_default_tensor_type(torch.cuda.HalfTensor)` (Llama's
reference code) is fixed: `torch.set_default_device("tpu"); torch.set_default_dtype(torch.float16)`.""",
          "torch.set_default_tensor_type(torch.cuda.HalfTensor)",
          'torch.set_default_device("tpu"); torch.set_default_dtype(torch.float16)',
          port=Port(triggers=("cuda", "set_default_tensor_type"), refs=(
              *_many("FloatTensor DoubleTensor HalfTensor BFloat16Tensor LongTensor IntTensor ShortTensor CharTensor "
                     "ByteTensor BoolTensor"),
              ("torch.set_default_tensor_type", NameRef())))),
    _rule("TPU214", "cuda-comm", W, NOFIX, REVIEW, (51,),
          "torch.cuda.comm collectives are CUDA-only; use torch.distributed",
          """`torch.cuda.comm.broadcast/scatter/gather/reduce_add` copy between GPUs of one process. Use
`torch.distributed` collectives (`dist.broadcast`, `all_gather`, `reduce_scatter`) on the tpu backend.""",
          "outs = torch.cuda.comm.broadcast(t, devices=[0, 1])", None,
          port=Port(triggers=("cuda",), refs=(("torch.cuda.comm", NameRef()),))),
    _rule("TPU215", "cuda-ipc", W, NOFIX, REVIEW, (82,),
          "CUDA IPC has no TPU equivalent",
          """`torch.cuda.ipc_collect()` and CUDA IPC tensor sharing through torch.multiprocessing. Remove, or
share CPU tensors between processes.""",
          "torch.cuda.ipc_collect()", None,
          port=Port(triggers=("cuda",), refs=(("torch.cuda.ipc_collect", NameRef()),))),
    _rule("TPU216", "cuda-debug-api", W, NOFIX, REVIEW, (83,),
          "CUDA initialisation/sync-debug API has no torch.tpu equivalent",
          """`torch.cuda.set_sync_debug_mode`, `get_sync_debug_mode`, `torch.cuda.init()`, `_lazy_init`.
Remove them; the Debug eager mode (torch.tpu.set_eager_mode) helps find host syncs on TPU.""",
          'torch.cuda.set_sync_debug_mode("warn")', None,
          port=Port(triggers=("cuda",), refs=_many("set_sync_debug_mode get_sync_debug_mode init _lazy_init"))),
    _rule("TPU217", "cuda-graphs", E, NOFIX, BLOCKER, (57,),
          "CUDA graphs are unsupported on TPU; rely on torch.compile(backend='tpu')",
          """`torch.cuda.CUDAGraph`, `torch.cuda.graph(g)`, `make_graphed_callables`,
`is_current_stream_capturing`, `graph_pool_handle`. XLA compiles whole graphs already: remove the capture
and replay code and compile the step with `torch.compile(..., backend="tpu")`.""",
          "g = torch.cuda.CUDAGraph()", None,
          port=Port(triggers=("cuda", "CUDA"), refs=_many(
              "CUDAGraph graph graphs make_graphed_callables is_current_stream_capturing graph_pool_handle"))),
    _rule("TPU218", "nvtx-profiler", INFO, SAFE, AUTO_N, (54,),
          "NVTX/CUDA profiler markers; use torch.profiler.record_function or remove",
          """`torch.cuda.nvtx.range(msg)` becomes `torch.profiler.record_function(msg)`; `range_push/range_pop/
mark` and `torch.cuda.profiler.start/stop` statements are removed; a `with emit_nvtx():` wrapper is
unwrapped. Note: use `tputool profile` or torch.profiler for TPU traces.""",
          'with torch.cuda.nvtx.range("fwd"):', 'with torch.profiler.record_function("fwd"):',
          port=Port(triggers=("cuda", "nvtx"), refs=(
              ("torch.cuda.nvtx.range", NameRef(RENAME, "torch.profiler.record_function",
                                                note="the marker now shows up in torch.profiler traces")),
              *_many("range_push range_pop mark", OWNED, prefix="torch.cuda.nvtx."),
              *_many("start stop", OWNED, prefix="torch.cuda.profiler."),
              ("torch.autograd.profiler.emit_nvtx", NameRef(OWNED))),
               statements=("torch.cuda.nvtx.range_push", "torch.cuda.nvtx.range_pop", "torch.cuda.nvtx.mark",
                           "torch.cuda.profiler.start", "torch.cuda.profiler.stop"),
               unwrap=("torch.autograd.profiler.emit_nvtx",),
               fix_note="use torch.profiler.record_function for TPU trace markers")),
    _rule("TPU220", "cuda-only-guard", W, NOFIX, REVIEW, (16,),
          "availability check guarding CUDA-only code; kept as a CUDA check",
          """`assert torch.cuda.is_available(), "... APEX ..."`, `if torch.cuda.is_available(): import
bitsandbytes`, `if not torch.cuda.is_available(): return` before a CUDA hardware query (TPU203). Where what the
check protects is CUDA-only (the guarded code imports or uses apex, bitsandbytes, flash_attn, xformers, triton,
RAPIDS, CuPy, ..., or queries CUDA hardware, or the check's message names such a library), moving the check to
torch.tpu would let the CUDA-only code run (and fail later); it stays a CUDA check, so on TPU that code is skipped,
or the assertion fails, as on any machine without CUDA. Other checks move with the device (TPU201). A `torch.cuda`
operand of an `and` check that also queries CUDA versions (`torch.version.cuda and torch.cuda.is_bf16_supported()
and nccl.version() >= (2, 10)`) is kept and reported too: the check stays whole, False on TPU. A tensor's
`x.is_cuda` test guarding such code is kept the same way (TPU111 moves the others). The guarded code counts as
CUDA-only through a local module it imports that imports such a library (`from .triton_ops import kernel`) and
through a function of the same file it calls. Replace the dependency (see its own finding), then drop or move
the check. Where the guarded code picks `torch.bfloat16`/`torch.float16` (a compute dtype chosen by compute
capability), the finding says so: on TPU the port takes the other path, another precision than the original's.""",
          'assert torch.cuda.is_available(), "CUDA required for APEX optimizers"', None,
          port=Port(triggers=("cuda", "cupy", "pycuda", "transformer_engine", "numba"))),
    _rule("TPU219", "cuda-api-unknown", W, NOFIX, REVIEW, (),
          "torch.cuda API with no known TPU equivalent",
          """Any other `torch.cuda.*` use that no other rule covers. Look for the torch.tpu name or remove it.""",
          "torch.cuda.jiterator._create_jit_fn(code)", None,
          port=Port(triggers=("cuda",), fallback="torch.cuda")),
    # ---- TPU3xx amp / precision ----
    _rule("TPU301", "cuda-amp-autocast", W, SAFE, AUTO_N, (31, 35),
          'torch.cuda.amp.autocast; use torch.autocast("tpu", dtype=torch.bfloat16)',
          """`torch.cuda.amp.autocast(...)` as a context manager or decorator, also through
`from torch.cuda.amp import autocast`, `from torch.cuda import amp`, `import torch.cuda.amp as amp`.
Positional arguments become keywords; imports left unused are removed. Note: the CUDA default dtype was
float16; TPU autocast uses bfloat16 (no loss scaling needed).""",
          "with torch.cuda.amp.autocast():", 'with torch.autocast("tpu", dtype=torch.bfloat16):',
          port=Port(triggers=("cuda",), hooks=(CUDA_AUTOCAST,),
               refs=_many("autocast autocast_mode.autocast", OWNED, prefix="torch.cuda.amp."))),
    _rule("TPU302", "autocast-device-cuda", W, SAFE, AUTO, (32,),
          'autocast for device "cuda"; use "tpu"',
          """`torch.autocast(device_type="cuda")`, `torch.autocast("cuda")`, `torch.amp.autocast("cuda")`: the
device becomes "tpu"; when no dtype is given, `dtype=torch.bfloat16` is added (CUDA's default was
float16).""",
          'with torch.autocast(device_type="cuda"):',
          'with torch.autocast(device_type="tpu", dtype=torch.bfloat16):',
          port=Port(triggers=("cuda", "autocast"), hooks=(GENERIC_AUTOCAST,))),
    _rule("TPU303", "autocast-fp16", W, UNSAFE, REVIEW, (32,),
          "autocast with dtype=float16; TPUs compute in bfloat16",
          """An explicit `dtype=torch.float16` in autocast. tpu autocast supports bfloat16 (and float32) only: with
float16 it warns and disables itself, so the region runs in float32; bfloat16 also needs no loss scaling. The unsafe fix switches to bfloat16.""",
          'with torch.autocast("tpu", dtype=torch.float16):', 'with torch.autocast("tpu", dtype=torch.bfloat16):',
          port=Port(triggers=("float16", "half", "autocast"), hooks=(CUDA_AUTOCAST, GENERIC_AUTOCAST))),
    _rule("TPU304", "grad-scaler", W, SAFE, AUTO_N, (33, 35),
          "CUDA GradScaler; moved to tpu (with bfloat16 no loss scaling is needed)",
          """`torch.cuda.amp.GradScaler()`, `torch.amp.GradScaler("cuda")`, `torch.GradScaler("cuda")`. The fix moves the
scaler to tpu and keeps its arguments, `enabled=` included, so a script that scales only for float16
(`enabled=(dtype == 'float16')`) still does. With bf16 autocast no loss scaling is needed: with --unsafe-fixes
the scaler is also disabled in place (`enabled=False`), so `scaler.scale(loss).backward()`, `scaler.step(opt)`
and `scaler.update()` keep working and do plain backward/step; remove those calls when convenient.""",
          "scaler = torch.cuda.amp.GradScaler(enabled=use_fp16)",
          'scaler = torch.amp.GradScaler("tpu", enabled=use_fp16)',
          port=Port(triggers=("cuda", "GradScaler"), hooks=(GRAD_SCALER,), refs=_many(
              "torch.cuda.amp.GradScaler torch.cuda.amp.grad_scaler.GradScaler torch.amp.GradScaler "
              "torch.amp.grad_scaler.GradScaler torch.GradScaler", OWNED, prefix=""))),
    _rule("TPU305", "amp-custom-fwd-bwd", W, SAFE, AUTO, (34,),
          'torch.cuda.amp.custom_fwd/custom_bwd; use torch.amp.custom_fwd(device_type="tpu")',
          """The deprecated CUDA-only decorators for custom autograd Functions, bare or called
(`@custom_fwd(cast_inputs=torch.float32)`).""",
          "@torch.cuda.amp.custom_fwd", '@torch.amp.custom_fwd(device_type="tpu")',
          port=Port(triggers=("cuda", "custom_fwd", "custom_bwd"), hooks=(CUSTOM_FWD_CALL, DECORATOR),
               refs=_many("custom_fwd custom_bwd", OWNED, prefix="torch.cuda.amp."))),
    _rule("TPU306", "fp16-dtype", W, UNSAFE, REVIEW, (36,),
          "float16 on TPU is slow and needs loss scaling; use bfloat16",
          """`torch.float16`/`torch.half`, `.half()`, `dtype="float16"`, HF `fp16=True`,
`torch_dtype=torch.float16`, `mixed_precision="fp16"`. The unsafe fix switches to bfloat16
(`torch.bfloat16`, `.bfloat16()`, `bf16=True`, `"bf16"`). Check checkpoints saved in fp16.""",
          "model = model.half()", "model = model.bfloat16()",
          port=Port(triggers=("half", "float16", "fp16"), hooks=(PRECISION_METHODS, DTYPE_KWARGS), refs=(
              ("torch.float16", NameRef(RENAME, "torch.bfloat16")), ("torch.half", NameRef(RENAME, "torch.bfloat16"))))),
    _rule("TPU307", "fp64-dtype", W, NOFIX, REVIEW, (37,),
          "float64 on TPU is emulated and slow; keep it on CPU or downcast deliberately",
          """`torch.float64`/`torch.double`, `.double()`, `dtype="float64"`, `dtype=np.float64`. TPUs have no native
float64. Never downcast silently: keep the computation on CPU or choose float32 explicitly.""",
          "x = torch.from_numpy(arr).double().to(device)", None,
          port=Port(triggers=("float64", "double"), words=("register_buffer",), hooks=(PRECISION_METHODS, DTYPE_KWARGS),
               refs=_many("float64 double", prefix="torch."))),
    _rule("TPU308", "int64-sort", INFO, NOFIX, REVIEW, (38,),
          "sort/topk on int64 values; works on TPU but watch performance",
          """`x.long().sort()`, `.topk()`, `.argsort()` on int64 tensors. Correct on TPU, but 64-bit integer
work is emulated; prefer int32 keys where the range allows.""",
          "order = lengths.long().argsort()", None,
          port=Port(words=("sort", "argsort", "topk", "msort"), hooks=(PRECISION_METHODS,))),
    _rule("TPU309", "cuda-matmul-tf32", W, SAFE, AUTO, (42,),
          "torch.backends.cuda.matmul precision flag; use torch.set_float32_matmul_precision",
          """`torch.backends.cuda.matmul.allow_tf32 = True` (and the reduced-precision-reduction flags) set CUDA
matmul precision. `allow_tf32 = True/False` becomes the device-generic `torch.set_float32_matmul_precision("high")`
(`"highest"` for False): PyTorch defines the two as the same setting, so the user's choice moves with the
device. The reduced-precision-reduction flags are only reported.""",
          "torch.backends.cuda.matmul.allow_tf32 = True", 'torch.set_float32_matmul_precision("high")',
          port=Port(triggers=("cuda", "set_float32"), refs=(("torch.backends.cuda.matmul", NameRef(ASSIGN)),),
               assigns=("torch.backends.cuda.matmul.allow_tf32",
                        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
                        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"))),
    _rule("TPU310", "channels-last", INFO, NOFIX, REVIEW, (79,),
          "channels_last memory format is a GPU layout optimisation; verify on TPU",
          """`memory_format=torch.channels_last` helps cuDNN; XLA chooses layouts itself. Keep it only if measured
faster; it is usually neutral.""",
          "model = model.to(memory_format=torch.channels_last)", None,
          port=Port(triggers=("channels_last",), refs=_many("channels_last channels_last_3d", prefix="torch."))),
    # ---- TPU4xx backends / distributed / compile ----
    _rule("TPU401", "cudnn-benchmark", W, SAFE, AUTO, (39,),
          "`torch.backends.cudnn.benchmark` removed (no cuDNN on TPU)",
          """Setting cuDNN autotuning has no effect on TPU; the assignment is removed (an emptied block gets
`pass`). Also through `from torch.backends import cudnn`.""",
          "torch.backends.cudnn.benchmark = True", "(statement removed)",
          port=Port(triggers=("cudnn",), refs=(("torch.backends.cudnn.benchmark", NameRef(ASSIGN)),),
               assigns=("torch.backends.cudnn.benchmark",))),
    _rule("TPU402", "cudnn-deterministic", W, UNSAFE, REVIEW, (40,),
          "`cudnn.deterministic` does nothing on TPU; use torch.use_deterministic_algorithms",
          """The unsafe fix replaces the assignment with `torch.use_deterministic_algorithms(<value>)` (check the
TPU backend supports it for the ops used).""",
          "torch.backends.cudnn.deterministic = True", "torch.use_deterministic_algorithms(True)",
          port=Port(triggers=("cudnn",), refs=(("torch.backends.cudnn.deterministic", NameRef(ASSIGN)),),
               assigns=("torch.backends.cudnn.deterministic",))),
    _rule("TPU403", "cudnn-flags", W, SAFE, AUTO, (41,),
          "cuDNN flag assignment removed (no cuDNN on TPU)",
          """`torch.backends.cudnn.allow_tf32`, `.enabled`, `.benchmark_limit` assignments are removed;
`with torch.backends.cudnn.flags(...)` is reported.""",
          "torch.backends.cudnn.allow_tf32 = True", "(statement removed)",
          port=Port(triggers=("cudnn",), refs=(
              *_many("allow_tf32 enabled benchmark_limit", ASSIGN, prefix="torch.backends.cudnn."),
              ("torch.backends.cudnn.flags",
               NameRef(message="torch.backends.cudnn.flags() has no effect on TPU; remove it"))),
               assigns=("torch.backends.cudnn.allow_tf32", "torch.backends.cudnn.enabled",
                        "torch.backends.cudnn.benchmark_limit"))),
    _rule("TPU404", "sdp-kernel-selection", W, SAFE, AUTO_N, (43,),
          "CUDA SDPA kernel selection removed; F.scaled_dot_product_attention stays",
          """`with torch.backends.cuda.sdp_kernel(...)`, `with torch.nn.attention.sdpa_kernel(...)` are unwrapped;
`torch.backends.cuda.enable_flash_sdp/enable_mem_efficient_sdp/enable_math_sdp/enable_cudnn_sdp(...)`
statements are removed. Note: the TPU backend picks its own attention kernel.""",
          "with sdpa_kernel(SDPBackend.FLASH_ATTENTION):\n        out = F.scaled_dot_product_attention(q, k, v)",
          "out = F.scaled_dot_product_attention(q, k, v)",
          port=Port(triggers=("cuda", "sdp"), refs=(
              *_many("torch.backends.cuda.sdp_kernel torch.nn.attention.sdpa_kernel", OWNED, prefix=""),
              *_many(" ".join(_SDP_SWITCHES), OWNED, prefix="torch.backends.cuda.")),
               statements=tuple("torch.backends.cuda." + n for n in _SDP_SWITCHES),
               unwrap=("torch.backends.cuda.sdp_kernel", "torch.nn.attention.sdpa_kernel"),
               fix_note="F.scaled_dot_product_attention stays; the TPU backend picks its kernel")),
    _rule("TPU405", "cuda-linalg-fft", W, UNSAFE, REVIEW, (44,),
          "cuSOLVER/cuFFT configuration has no effect on TPU",
          """`torch.backends.cuda.preferred_linalg_library(...)`, `torch.backends.cuda.cufft_plan_cache...`.
The unsafe fix removes the statement.""",
          'torch.backends.cuda.preferred_linalg_library("cusolver")', "(statement removed)",
          port=Port(triggers=("cuda",), refs=(
              ("torch.backends.cuda.preferred_linalg_library", NameRef(OWNED)),
              ("torch.backends.cuda.cufft_plan_cache", NameRef(ASSIGN))),
               statements=("torch.backends.cuda.preferred_linalg_library",),
               assigns=("torch.backends.cuda.cufft_plan_cache",))),
    _rule("TPU406", "nccl-backend", W, SAFE, AUTO, (45,),
          'distributed backend "nccl"; use "tpu"',
          """`init_process_group("nccl")`, `backend="nccl"` on any call, an argparse `--dist-backend` default of
nccl. The TorchTPU distributed backend is registered as "tpu".""",
          'dist.init_process_group(backend="nccl")', 'dist.init_process_group(backend="tpu")',
          port=Port(triggers=("nccl", "NCCL", "backend"), hooks=(ARGPARSE, BACKEND_ARGS, BACKEND_ASSIGN))),
    _rule("TPU407", "nccl-backend-logic", W, UNSAFE, REVIEW, (46,),
          "code branches on the 'nccl' backend name",
          """`if backend == 'nccl'`, `assert backend in ['gloo', 'nccl']`, `backend = "nccl" if cuda else "gloo"`.
The unsafe fix puts 'tpu' in place of the literal; check the logic still holds.""",
          "assert args.backend in ['gloo', 'nccl']", "assert args.backend in ['gloo', 'tpu']",
          port=Port(triggers=("nccl",), hooks=(COMPARISON, BACKEND_ASSIGN))),
    _rule("TPU408", "cuda-version-check", W, NOFIX, REVIEW, (47,),
          "NCCL/CUDA/cuDNN version or availability check",
          """`import torch.cuda.nccl`, `dist.is_nccl_available()`, `torch.cuda.nccl.version()`, `torch.version.cuda`,
`torch.backends.cudnn.version()`, `torch.backends.cudnn.is_available()` are False/None on TPU. Remove or
guard them.""",
          "print(torch.version.cuda, torch.backends.cudnn.version())", None,
          port=Port(triggers=("cuda", "cudnn", "nccl"), refs=_many(
              "torch.cuda.nccl torch.version.cuda torch.backends.cudnn.version torch.backends.cudnn.is_available "
              "torch.distributed.is_nccl_available", prefix=""), imports=("torch.cuda.nccl",))),
    _rule("TPU409", "ddp-device-ids", INFO, UNSAFE, REVIEW, (48,),
          "DDP device_ids/output_device: on tpu they index tpu devices; keep them equal to the process's device",
          """`DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)` works on tpu (the indices
name `tpu:<i>`, so they must match the device the module was moved to). The unsafe fix omits both arguments,
since the module is already on its device.""",
          "model = DDP(model, device_ids=[local_rank], output_device=local_rank)", "model = DDP(model)",
          port=Port(triggers=("DataParallel", "device_ids"), hooks=(DDP,), refs=_many(
              "DistributedDataParallel distributed.DistributedDataParallel", OWNED, prefix="torch.nn.parallel."))),
    _rule("TPU410", "data-parallel", E, NOFIX, BLOCKER, (49,),
          "nn.DataParallel is single-process multi-GPU; use DDP on TPU",
          """`torch.nn.DataParallel` replicates over CUDA devices of one process. Use
`DistributedDataParallel` (one process per chip, backend "tpu") or FSDP2 `fully_shard`. On tpu, DataParallel over
one device runs (it is the module itself, as on one GPU); over several, as on a multi-chip TPU host where it takes
every chip, it raises an error naming DDP at its first call.""",
          "model = torch.nn.DataParallel(model).cuda()", None,
          port=Port(triggers=("DataParallel",), refs=_many(
              "torch.nn.DataParallel torch.nn.parallel.DataParallel torch.nn.parallel.data_parallel", prefix=""))),
    _rule("TPU411", "fsdp-apex-ddp", W, NOFIX, REVIEW, (50,),
          "FSDP1 / apex DDP; use FSDP2 fully_shard or torch DDP on TPU",
          """`FullyShardedDataParallel(..., device_id=torch.cuda.current_device())` and
`apex.parallel.DistributedDataParallel`. TorchTPU supports DDP, FSDP2 (`fully_shard`) and DTensor.""",
          "model = FSDP(model, device_id=torch.cuda.current_device())", None,
          port=Port(triggers=("FullyShardedDataParallel", "apex", "cuda"), refs=_many(
              "torch.distributed.fsdp.FullyShardedDataParallel "
              "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel "
              "apex.parallel.DistributedDataParallel", prefix=""))),
    _rule("TPU412", "cuda-visible-devices", W, NOFIX, REVIEW, (52,),
          "CUDA_VISIBLE_DEVICES selects GPUs; on TPU use TPU_VISIBLE_CHIPS",
          """Reads and writes of `CUDA_VISIBLE_DEVICES` in Python. On a TPU VM use `TPU_VISIBLE_CHIPS` (with
`TPU_PROCESS_BOUNDS`, ...) or `torch.tpu.distributed.set_tpu_launch_env`.""",
          'os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"', None,
          port=Port(triggers=("CUDA",), hooks=(STRING_LITERAL,))),
    _rule("TPU413", "cuda-env-vars", INFO, NOFIX, REVIEW, (29, 53),
          "NCCL/CUDA environment setting has no effect on TPU",
          """`NCCL_*`, `TORCH_NCCL_*`, `CUDA_LAUNCH_BLOCKING`, `CUDA_DEVICE_MAX_CONNECTIONS`, `TORCH_CUDA_ARCH_LIST`,
`PYTORCH_CUDA_ALLOC_CONF`, `CUBLAS_WORKSPACE_CONFIG` in Python code. Remove them; the Debug eager mode replaces launch blocking.""",
          'os.environ["NCCL_DEBUG"] = "INFO"', None,
          port=Port(triggers=("CUDA", "NCCL", "CUBLAS"), hooks=(STRING_LITERAL,))),
    _rule("TPU414", "profiler-cuda-activity", W, NOFIX, REVIEW, (55,),
          "profiler CUDA activity records nothing on TPU",
          """`torch.profiler.ProfilerActivity.CUDA` and `use_cuda=True` profile CUDA kernels. Profile CPU plus the
accelerator activity (PrivateUse1), or use `tputool profile`.""",
          "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]", None,
          port=Port(triggers=("CUDA", "cuda", "ProfilerActivity"), hooks=(HF_KWARGS,), refs=_many(
              "torch.profiler.ProfilerActivity.CUDA torch.autograd.ProfilerActivity.CUDA", prefix=""))),
    _rule("TPU415", "compile-backend", W, SAFE, AUTO, (58,),
          'torch.compile uses Inductor by default; use backend="tpu"',
          """`torch.compile(model)` and `@torch.compile` get `backend="tpu"`; an explicit `backend="inductor"`
becomes "tpu". (On tpu tensors, Inductor's graphs are handed to the tpu backend when no mode/options are set and
refused otherwise; the fix names the backend that runs.)""",
          "model = torch.compile(model)", 'model = torch.compile(model, backend="tpu")',
          port=Port(words=("compile",), triggers=("backend",), hooks=(ARGPARSE, COMPILE_CALL, DECORATOR),
               refs=(("torch.compile", NameRef(OWNED)),))),
    _rule("TPU416", "compile-mode-inductor", INFO, SAFE, AUTO, (59,),
          "Inductor-only compile options or torch._inductor.config: no effect on TPU, removed",
          """`options={...}` of `torch.compile` and `torch._inductor.config.* = ...` tune Inductor, which does not run on
TPU; the fix drops the `options` argument and the config assignments (the program computes the same).
`mode="reduce-overhead"` / `"max-autotune"` stay: the tpu backend accepts torch.compile's modes (each
compiles one XLA program per call).""",
          'torch.compile(model, backend="tpu", options={"epilogue_fusion": False})',
          'torch.compile(model, backend="tpu")',
          port=Port(triggers=("_inductor",), words=("compile",), hooks=(COMPILE_CALL,),
               refs=(("torch._inductor.config", NameRef(ASSIGN)),), assigns=("torch._inductor.config",))),
    _rule("TPU417", "jit-script", INFO, NOFIX, REVIEW, (60,),
          "TorchScript on TPU: verify, or prefer torch.compile",
          """`torch.jit.script` / `script_method` keep working as Python-level code, but TorchScript graphs are
not what the TPU compiler lowers; prefer `torch.compile(backend="tpu")` for speed.""",
          "scripted = torch.jit.script(model)", None,
          port=Port(triggers=("jit",), refs=_many("script script_method", prefix="torch.jit."))),
    _rule("TPU418", "fused-optimizer", W, UNSAFE, REVIEW, (66,),
          "fused=True on an optimizer the tpu device has no fused step for: its step runs on the CPU",
          f"""`torch.optim.Adagrad(..., fused=True)` (or `fused=use_fused`) and other optimizers outside
{", ".join(FUSED_ON_TPU)}. The tpu device runs the fused {"/".join(FUSED_ON_TPU)} steps as one computation (so
`fused=True` on those is left as it is and not reported); other fused kernels have no tpu lowering and run on the
CPU, copying every parameter, gradient and state to the host and back each step. Drop `fused=True` there (the
for-each implementation runs on tpu) or use `torch.tpu.optimizers`. The unsafe fix drops a literal `fused=True`.""",
          "opt = torch.optim.Adagrad(params, lr=lr, fused=True)", "opt = torch.optim.Adagrad(params, lr=lr)",
          port=Port(triggers=("fused",), hooks=(FUSED_OPTIMIZER,))),
    _rule("TPU419", "multi-backend-ladder", INFO, NOFIX, REVIEW, (85,),
          "device-selection ladder without a TPU branch",
          """`torch.backends.mps.is_available()` / XPU ladders, `use_cuda` flags and `--no-cuda` options. Add a `tpu`
branch, or collapse the ladder onto `torch.accelerator.current_accelerator()`.""",
          'parser.add_argument("--no-cuda", action="store_true")', None,
          port=Port(triggers=("cuda", "mps", "xpu"), hooks=(ARGPARSE,),
               refs=_many("torch.backends.mps.is_available torch.xpu.is_available", prefix=""))),
    # ---- TPU5xx kernels / extensions / third-party CUDA libraries ----
    _rule("TPU501", "triton-kernel", E, NOFIX, BLOCKER, (61,),
          "Triton kernels run only on GPUs; rewrite as Pallas/JAX or pure torch",
          """`import triton`, `@triton.jit`, `@triton.autotune`, `torch.library.triton_op`, `wrap_triton`,
`torch.utils._triton.has_triton()`. Write the kernel in Pallas and call it through
`torch.tpu.pallas.jax_op`, or fall back to plain torch ops.""",
          "@triton.jit\n    def add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr): ...", None,
          port=Port(triggers=("triton",), refs=(
              *_many("jit autotune heuristics", prefix="triton."),
              *_many("torch.library.triton_op torch.library.wrap_triton torch.utils._triton.has_triton", prefix="")),
               imports=("triton",))),
    _rule("TPU502", "cuda-extension", E, NOFIX, BLOCKER, (62,),
          "custom CUDA extension/op cannot run on TPU",
          """`torch.utils.cpp_extension.load(...)`, `load_inline(cuda_sources=...)`, `CUDAExtension`, `CUDA_HOME`,
calls of custom ops `torch.ops.<ns>.<op>`, and custom-op kernels registered for CUDA only
(`torch.library.custom_op(..., device_types="cuda")`, `torch.library.impl(op, "cuda")`, `register_kernel(op,
"cuda")`, `Library.impl(op, fn, "CUDA")`): the tpu device never dispatches to such a kernel (the finding names the
op). Re-express the op with torch ops or a Pallas kernel and register it for tpu.""",
          'ext = load(name="fused", sources=["fused.cpp", "fused_kernel.cu"])', None,
          port=Port(triggers=("cpp_extension", "CUDA", "torch.ops", "cuda"), hooks=(KERNEL_REGISTRATION,),
               refs=_many("load load_inline CUDAExtension CUDA_HOME", prefix="torch.utils.cpp_extension."))),
    _rule("TPU503", "cuda-only-aten-op", W, NOFIX, REVIEW, (63,),
          "CUDA-only aten op (int4/int8/fp8 matmul)",
          """`torch._scaled_mm` (fp8), `torch._int_mm`, `torch._grouped_mm`, `torch.ops.aten._weight_int4pack_mm`.
Use a TPU-supported equivalent or a dequantised matmul.""",
          "out = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb)", None,
          port=Port(triggers=("_mm",), refs=(*_many(_LOW_PRECISION_MM, prefix="torch."),
                                          *_many(_LOW_PRECISION_MM, prefix="torch.ops.aten.")))),
    _rule("TPU504", "apex-amp", W, NOFIX, REVIEW, (64,),
          "Apex AMP; use native torch.autocast('tpu', dtype=torch.bfloat16)",
          """`from apex import amp`, `amp.initialize(..., opt_level=...)`, `with amp.scale_loss(loss, opt)`.
Replace with `torch.autocast("tpu", dtype=torch.bfloat16)` and a plain `loss.backward()`.""",
          'model, opt = amp.initialize(model, opt, opt_level="O1")', None,
          port=Port(triggers=("apex",), refs=(("apex.amp", NameRef()),), imports=("apex.amp",))),
    _rule("TPU505", "apex-fused-norm", W, SAFE, AUTO_N, (65,),
          "Apex fused norm/SyncBN; use the torch.nn module",
          """`apex.normalization.FusedLayerNorm` -> `torch.nn.LayerNorm`, `FusedRMSNorm` -> `torch.nn.RMSNorm`,
`apex.parallel.SyncBatchNorm` -> `torch.nn.SyncBatchNorm`, `convert_syncbn_model` ->
`torch.nn.SyncBatchNorm.convert_sync_batchnorm`. Note: the constructor arguments match for the common
cases; apex-only ones (`memory_efficient`, `channel_last`, `fuse_relu`) must be removed by hand.""",
          "self.ln = FusedLayerNorm(dim)", "self.ln = torch.nn.LayerNorm(dim)",
          port=Port(triggers=("apex", "fused"), refs=(
              ("apex.normalization.FusedLayerNorm", NameRef(RENAME, "torch.nn.LayerNorm")),
              ("apex.normalization.fused_layer_norm.FusedLayerNorm", NameRef(RENAME, "torch.nn.LayerNorm")),
              ("apex.normalization.FusedRMSNorm", NameRef(RENAME, "torch.nn.RMSNorm")),
              ("apex.normalization.fused_layer_norm.FusedRMSNorm", NameRef(RENAME, "torch.nn.RMSNorm")),
              ("apex.parallel.SyncBatchNorm", NameRef(RENAME, "torch.nn.SyncBatchNorm")),
              ("apex.parallel.convert_syncbn_model",
               NameRef(RENAME, "torch.nn.SyncBatchNorm.convert_sync_batchnorm"))))),
    _rule("TPU506", "apex-fused-optimizer", W, NOFIX, REVIEW, (65,),
          "Apex fused optimizer is CUDA-only; use torch.optim or torch.tpu.optimizers",
          """`apex.optimizers.FusedAdam` (AdamW semantics by default) -> `torch.optim.AdamW`, `FusedLAMB`,
`FusedSGD` -> torch.optim equivalents. Check hyper-parameter names.""",
          "opt = FusedAdam(model.parameters(), lr=1e-3)", None,
          port=Port(triggers=("apex", "fused"), refs=(("apex.optimizers", NameRef()),))),
    _rule("TPU507", "flash-attn", W, UNSAFE, REVIEW, (67,),
          "flash_attn kernels are CUDA-only; use F.scaled_dot_product_attention",
          """`flash_attn_func`, `flash_attn_varlen_func`, `flash_attn_qkvpacked_func` and HF
`attn_implementation="flash_attention_2"`. Use SDPA (layouts differ: flash_attn takes (B, S, H, D),
SDPA (B, H, S, D)). The unsafe fix changes `attn_implementation` to "sdpa".""",
          'model = AutoModel.from_pretrained(name, attn_implementation="flash_attention_2")',
          'model = AutoModel.from_pretrained(name, attn_implementation="sdpa")',
          port=Port(triggers=("flash_attn", "flash_attention"), hooks=(HF_KWARGS,), refs=(("flash_attn", NameRef()),),
               imports=("flash_attn",))),
    _rule("TPU508", "xformers", W, NOFIX, REVIEW, (68,),
          "xformers is CUDA-only; use F.scaled_dot_product_attention",
          """`xformers.ops.memory_efficient_attention` and other xformers imports. Use SDPA with an attention mask
(`attn_bias` becomes `attn_mask`).""",
          "out = xops.memory_efficient_attention(q, k, v)", None,
          port=Port(triggers=("xformers",), refs=(("xformers", NameRef()),), imports=("xformers",))),
    _rule("TPU509", "bitsandbytes", E, NOFIX, BLOCKER, (69,),
          "bitsandbytes quantisation is CUDA-only",
          """`import bitsandbytes`, `bnb.optim.Adam8bit`, `BitsAndBytesConfig`, `load_in_8bit/4bit=True`,
`prepare_model_for_int8_training/kbit_training`. Use bf16 weights or a TPU-native quantisation path.""",
          "model = AutoModel.from_pretrained(name, load_in_8bit=True)", None,
          port=Port(triggers=("bitsandbytes", "BitsAndBytes", "load_in_", "peft"), hooks=(HF_KWARGS,), refs=(
              ("bitsandbytes", NameRef()), ("transformers.BitsAndBytesConfig", NameRef()),
              *_many("prepare_model_for_int8_training prepare_model_for_kbit_training", prefix="peft.")),
               imports=("bitsandbytes",))),
    _rule("TPU510", "hf-accelerate", INFO, NOFIX, REVIEW, (71,),
          "HF accelerate places on tpu from version 1.16; choose bf16 mixed precision",
          """`Accelerator()` user code needs no change: Accelerate 1.16 and later place the model and batches on
the tpu device (`torch.accelerator`). Older versions would use the CPU while the program believes it uses the
device; with the bundled backend they are refused at `Accelerator()` (unless `cpu=True`). Choose
`mixed_precision="bf16"`.""",
          'accelerator = Accelerator(mixed_precision="fp16")', None,
          port=Port(triggers=("accelerate", "Accelerator"), refs=(("accelerate.Accelerator", NameRef()),),
               imports=("accelerate",))),
    _rule("TPU511", "deepspeed", E, NOFIX, BLOCKER, (72,),
          "DeepSpeed needs a TorchTPU accelerator; not available",
          """`deepspeed.initialize`, `deepspeed.ops.*` (FusedAdam, CPUAdam), `get_accelerator()`, a ds_config
`"fp16": {"enabled": True}`. Use torch DDP/FSDP2 with bf16 on TPU.""",
          "engine, opt, _, _ = deepspeed.initialize(model=model, config=ds_config)", None,
          port=Port(triggers=("deepspeed", "fp16"), hooks=(DS_CONFIG,),
               refs=_many("initialize init_distributed ops accelerator zero", prefix="deepspeed."),
               imports=("deepspeed",))),
    _rule("TPU512", "gpu-monitoring", W, NOFIX, REVIEW, (56,),
          "NVIDIA GPU monitoring does not see TPUs",
          """`pynvml`, `GPUtil`, `nvidia-smi` subprocesses, `torch.cuda.utilization()/temperature()/power_draw()`.
Remove, or read TPU runtime metrics.""",
          'out = subprocess.check_output(["nvidia-smi", "--query-gpu=memory.used"])', None,
          port=Port(triggers=("nvml", "GPUtil", "nvidia", "gpustat", "cuda"), hooks=(STRING_LITERAL,),
               refs=_many("utilization temperature power_draw clock_rate"),
               imports=("pynvml", "GPUtil", "py3nvml", "nvidia_smi"))),
    _rule("TPU513", "rapids", E, NOFIX, BLOCKER, (),
          "RAPIDS (cuML, cuDF, ...) runs only on NVIDIA GPUs",
          """`import cuml`, `cudf`, `cugraph`, `cuspatial`, `cucim`, `cuvs`, `pylibraft`, `dask_cudf`, `rmm`: RAPIDS
libraries keep their data in GPU memory and run CUDA kernels. Use their CPU counterparts (scikit-learn for cuML,
pandas for cuDF, ...) on the host, or torch ops on the tpu device.""",
          "from cuml.cluster import KMeans", None,
          port=Port(triggers=("cuml", "cudf", "cugraph", "cuspatial", "cucim", "pylibraft"), words=("rmm", "cuvs"),
                    refs=_many("cuml cudf cugraph cuspatial cucim cuvs pylibraft dask_cudf rmm", prefix=""),
                    imports=("cuml", "cudf", "cugraph", "cuspatial", "cucim", "cuvs", "pylibraft", "dask_cudf",
                             "rmm"))),
    # ---- TPU6xx performance lints ----
    _rule("TPU601", "host-sync-in-loop", INFO, NOFIX, REVIEW, (76,),
          "host sync inside a loop stalls the TPU pipeline",
          """`.item()`, `.cpu()`, `.tolist()`, `.numpy()` inside a `for`/`while` body or a comprehension force the
host to wait for the device every iteration. Accumulate on device and read once, or log every N steps.""",
          "for batch in loader:\n        total += loss(batch).item()", None,
          port=Port(words=("item", "cpu", "tolist", "numpy"), hooks=(CALL_LINTS,))),
    _rule("TPU602", "dynamic-shape-op", INFO, NOFIX, REVIEW, (77,),
          "op with a data-dependent output shape forces recompiles on TPU",
          """`nonzero`, `unique`, `masked_select`, `argwhere`, one-argument `torch.where`. Pad to fixed sizes
or use masks (`torch.where(cond, a, b)`) so shapes stay static.""",
          "idx = torch.nonzero(mask)", None,
          port=Port(words=("where", "nonzero", "unique", "unique_consecutive", "masked_select", "argwhere"), hooks=(CALL_LINTS,))),
    _rule("TPU603", "non-128-dim", INFO, NOFIX, REVIEW, (78,),
          "model dimension not a multiple of 128 under-fills the TPU MXU",
          """`head_dim=64`, `hidden_size=...` and similar sizes that are not multiples of 128 pad the 128x128 matrix
units. Prefer 128/256 multiples where the model allows.""",
          "config = dict(head_dim=64)", None,
          port=Port(digit_words=("head_dim", "hidden_size", "d_model", "n_embd", "embed_dim", "hidden_dim",
                            "intermediate_size", "dim_head", "head_size", "ffn_dim", "d_ff", "kv_channels",
                            "d_head", "d_kv"), hooks=(CALL_LINTS, *ASSIGN_LINTS, DICT_LINTS))),
    _rule("TPU604", "gpu-peak-flops", INFO, NOFIX, REVIEW, (80,),
          "hard-coded GPU peak FLOPs; MFU will be wrong on TPU",
          """A FLOPs constant (`flops_promised = 312e12  # A100`) used for MFU. Use the TPU generation's peak
(see `tputool tune`'s spec table).""",
          "flops_promised = 312e12  # A100 bf16 peak", None,
          port=Port(triggers=("flop", "FLOP", "A100", "H100", "H200", "B200", "V100", "A10", "A6000", "L4", "T4", "RTX"),
               hooks=ASSIGN_LINTS)),
]

RULES: dict[str, Rule] = {r.code: r for r in _RULE_LIST}

# ---- non-Python file rules (engine) ----
# TPU9xx rules live in tputool/rules/text.py, diagnose's TPU8xx in tputool/rules/runtime.py; tputool/rules/catalogue.py merges them.
