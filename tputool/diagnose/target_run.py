"""The abstract run of `tputool diagnose --target SLICE` (child side: `python -m tputool.diagnose.target_run`).

The script runs as `__main__` inside ONE JAX trace (`jax.make_jaxpr`) until `--steps` optimizer steps are
done: every tpu tensor holds a tracer (shape and dtype, no data), so whatever the backend runs (eager op
kernels, Fused traces, compiled graphs, optimizer updates) is recorded, not executed. Host->tpu copies
larger than `SMALL_HOST_BYTES` become opaque placeholders of their shape (small ones, e.g. scalars, keep
their values); reads of a tpu value on the host (`.item()`, printing, a branch on a tensor) get zeros and
are reported as assumptions. The recorded run is then compiled for the target's compile-only TPU devices
(`tputool.tune.tpu_compile`): the last step cut out of the run as one program (`last_step`: the state live
at its start donated in, the state handed on to the next step out; XLA's memory analysis of it is the
peak), and each distinct program the backend would compile on its own (count, compile seconds, the ones
the TPU compiler rejects with the user's line). DDP and FSDP2 run as rank 0 of the slice's ranks (fake
process group); a tuned config (`--config`) puts its mesh on the slice's devices, and the step is then
compiled SPMD over them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import runpy
import sys
import time
import traceback
import weakref
from collections.abc import Iterator
from typing import Any

SMALL_HOST_BYTES = 4096
"""Host->tpu copies up to this size keep their values (scalars, small index tensors); larger ones are
placeholders of their shape and dtype."""

TOP_TEMPORARIES = 5
"""How many of the largest intermediate values the report lists."""

_USED = re.compile(r"(?:Used |required for [^(]*\()([\d.]+)([KMGT]?)")
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class AbstractRun:
    """The hook the backend calls under the abstract run (`runtime.STATE.abstract`)."""

    def __init__(self, frames, devices: list) -> None:
        self.frames = frames
        self.devices = devices  # the slice's compile-only devices (a tuned config's mesh is made of them)
        self.assumptions: dict[tuple[str, str, int], int] = {}
        self.placements: dict[int, Any] = {}  # storage key -> the NamedSharding the script placed it with

    def placed(self, t, sharding) -> None:
        """Tensor `t` was placed with `sharding` (`mark_sharding`: a tuned config's `shard_model`)."""
        self.placements[t.untyped_storage()._cdata] = sharding

    def from_host(self, arr):
        """The tpu value of host array `arr`: the array itself when small, else an opaque placeholder."""
        import jax.numpy as jnp
        from jax import lax

        if arr.nbytes <= SMALL_HOST_BYTES:
            return jnp.asarray(arr)
        return lax.optimization_barrier(jnp.zeros(arr.shape, arr.dtype))  # (the compiler cannot fold it)

    def read(self, a, reason: str):
        """A host copy of tpu value `a`: its value when it is concrete, else zeros (an assumption, recorded)."""
        import jax
        import numpy as np

        if not isinstance(a, jax.core.Tracer):
            return np.asarray(a)
        where = self.frames.location(2) or ("?", 0)
        key = (reason, where[0], where[1])
        self.assumptions[key] = self.assumptions.get(key, 0) + 1
        return np.zeros(a.shape, a.dtype)


COLLECTIVE_BYTES: dict[str, int] = {}
"""Bytes each kind of collective moved per rank in the abstract run ("all-reduce": DDP's gradient buckets)."""


DDP_BUCKETS: dict[int, Any] = {}
"""DDP's flat gradient buckets by index (the reducer keeps them from step to step, as on a GPU)."""


def _ddp_allreduce(state, bucket):
    """DDP's gradient all-reduce among identical replicas: the bucket as it is (its mean), bytes counted."""
    import torch

    buf = bucket.buffer()
    DDP_BUCKETS[bucket.index()] = buf
    COLLECTIVE_BYTES["all-reduce"] = COLLECTIVE_BYTES.get("all-reduce", 0) + buf.numel() * buf.element_size()
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def simulate_world(n: int) -> None:
    """Make this process rank 0 of a world of `n` ranks (one per device of the slice): torchrun's variables,
    and `torch.distributed.init_process_group` on PyTorch's fake process group, whose collectives do not run
    (each rank's programs are the same; rank 0's are compiled for one device of the slice)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    real = dist.init_process_group

    def init_process_group(*args, **kwargs):
        kwargs.update(backend="cpu:fake,tpu:fake", store=FakeStore(), rank=0, world_size=n)
        kwargs.pop("init_method", None)
        return real(**kwargs)

    dist.init_process_group = init_process_group
    import torch.nn.parallel.distributed as ddp

    # every simulated rank holds the same model: DDP's cross-rank shape check would compare zeros
    ddp._verify_param_shape_across_processes = lambda *args, **kwargs: None
    ddp_init = ddp.DistributedDataParallel.__init__

    def init_ddp(self, *args, **kwargs):  # the fake group's all-reduce returns nothing: DDP gets the bucket back
        ddp_init(self, *args, **kwargs)
        self.register_comm_hook(None, _ddp_allreduce)

    ddp.DistributedDataParallel.__init__ = init_ddp


def _live(kind: type) -> Iterator[Any]:
    """The objects the collector tracks that are `kind`s (a weak proxy is skipped: `isinstance` on one whose
    object died raises ReferenceError, and nanochat's process holds such proxies)."""
    proxies = weakref.ProxyTypes
    for o in gc.get_objects():
        if type(o) not in proxies and isinstance(o, kind):
            yield o


def _live_tpu_tensors() -> Iterator[Any]:
    import torch

    from tputool.backend.tensor import has_data

    for o in _live(torch.Tensor):
        if o.device.type == "tpu" and has_data(o):
            yield o


def _live_state(placements: dict[int, Any] | None = None) -> tuple[list[tuple], dict[str, int]]:
    """The live tpu tensors' values (each storage once) as (storage key, tracer, role, sharding or None: as
    placed, or replicated), and their bytes per chip
    by role: parameters, gradients, optimizer state, DDP's buckets, other (batches, losses, buffers). A tensor
    placed with a sharding (`placements`, by storage) holds its shard per chip, and so do a placed parameter's
    gradient and optimizer state of its shape. A DTensor (FSDP2's `fully_shard`) counts as its local shard."""
    import jax
    import torch

    def key_of(t) -> int:
        return getattr(t, "_local_tensor", t).untyped_storage()._cdata

    placed = dict(placements or {})
    optimizers = list(_live(torch.optim.Optimizer))
    opt_storages = set()
    for opt in optimizers:
        for param, st in opt.state.items():
            where = placed.get(key_of(param)) if isinstance(param, torch.Tensor) else None
            for v in (st.values() if isinstance(st, dict) else ()):
                if isinstance(v, torch.Tensor) and v.device.type == "tpu":
                    opt_storages.add(key_of(v))
                    if where is not None and v.shape == param.shape:
                        placed.setdefault(key_of(v), where)
    entries, seen, roles = [], set(), {"parameters": 0, "gradients": 0, "optimizer_state": 0, "ddp_buckets": 0,
                                       "other": 0}
    tensors = list(_live_tpu_tensors())
    params = [o for o in _live(torch.nn.Parameter) if o.device.type == "tpu"]
    param_keys = {key_of(t) for t in params}
    grads = {key_of(t.grad) for t in params if t.grad is not None and t.grad.device.type == "tpu"}
    for t in params:
        if t.grad is not None and key_of(t) in placed:
            placed.setdefault(key_of(t.grad), placed[key_of(t)])
    buckets = {b.untyped_storage()._cdata for b in DDP_BUCKETS.values()}
    for t in tensors:
        st = t.untyped_storage()
        key = st._cdata
        if key in seen:
            continue
        seen.add(key)
        base = st._tpu
        if not isinstance(base, jax.core.Tracer):
            continue
        role = ("parameters" if key in param_keys else "optimizer_state" if key in opt_storages
                else "gradients" if key in grads else "ddp_buckets" if key in buckets else "other")
        entries.append((key, base, role, placed.get(key)))
        nbytes = int(base.size) * base.dtype.itemsize
        roles[role] += nbytes // placed[key].num_devices * _replicas(placed[key]) if key in placed else nbytes
    return entries, roles


def _replicas(sharding) -> int:
    """How many chips of its mesh hold each shard of a NamedSharding."""
    used = {a for s in sharding.spec if s is not None for a in (s if isinstance(s, tuple) else (s,))}
    n = 1
    for axis, size in sharding.mesh.shape.items():
        n *= 1 if axis in used else size
    return n


PERSISTENT = ("parameters", "optimizer_state", "ddp_buckets")
"""Roles a step's program hands on to the next step even when they were created during it (AdamW's moments
and DDP's buckets in the first step)."""


def last_step(closed, n_final: int, keep: list[bool]):
    """The program of the run's last step, cut out of the whole run `closed` (outputs: `n_final` values live at
    the end, then the values live at the step's start): its inputs are the start values it reads, its outputs
    the end values that `keep` marks (the state handed on to the next step), everything else a temporary;
    returns it and, per input, the index of its start value. None when nothing is cut off (no start values)."""
    import jax.extend.core as jc
    from jax._src import core

    jaxpr = closed.jaxpr
    outs = list(jaxpr.outvars)
    finals = [v for v, k in zip(outs[:n_final], keep, strict=True) if k]
    boundary = {v for v in outs[n_final:] if isinstance(v, jc.Var)} - set(jaxpr.constvars)
    while True:
        needed = {v for v in finals if isinstance(v, jc.Var)}
        chosen, clash = [], set()
        for eqn in reversed(jaxpr.eqns):
            wanted = [o for o in eqn.outvars if o in needed]
            if not wanted or all(o in boundary for o in wanted):
                continue
            chosen.append(eqn)
            clash |= boundary.intersection(eqn.outvars)  # (an equation that also makes a start value)
            needed.update(v for v in eqn.invars if isinstance(v, jc.Var))
        if not clash:
            break
        boundary -= clash  # computed in the step, not handed in
    firsts: dict = {}
    for i, v in enumerate(outs[n_final:]):
        if v in boundary and v in needed:
            firsts.setdefault(v, i)
    invars = list(firsts)
    if not invars:
        return None
    chosen.reverse()
    effects = core.join_effects(*(e.effects for e in chosen))
    step = jc.Jaxpr(jaxpr.constvars, invars, finals, chosen, effects)
    return jc.ClosedJaxpr(step, closed.consts), list(firsts.values())


def _user_line(eqn, frames) -> tuple[str, int] | None:
    """The innermost user frame of the Python stack that recorded `eqn`."""
    tb = getattr(eqn.source_info, "traceback", None)
    if tb is None:
        return None
    for fr in tb.frames:  # (innermost first)
        if frames.is_user(fr.file_name):
            return fr.file_name, fr.line_num
    return None


def _programs(closed) -> list[tuple[Any, Any]]:
    """(program, first recording equation) of each distinct program the run called (the backend's jits)."""
    out, seen = [], set()
    for eqn in closed.jaxpr.eqns:
        sub = eqn.params.get("jaxpr") if eqn.primitive.name in ("pjit", "jit") else None
        if sub is None:
            continue
        key = str(sub)  # (one program per computation, however many jit objects traced it)
        if key in seen:
            continue
        seen.add(key)
        out.append((sub, eqn))
    return out


def _bytes(aval) -> int:
    return int(getattr(aval, "size", 0)) * getattr(getattr(aval, "dtype", None), "itemsize", 0)


def _largest(closed, frames) -> list[dict]:
    """The largest values the run computes, with the user line that made them."""
    rows = []
    for eqn in closed.jaxpr.eqns:
        for v in eqn.outvars:
            n = _bytes(v.aval)
            if n:
                rows.append((n, eqn, v.aval))
    rows.sort(key=lambda r: -r[0])
    out, seen = [], set()
    for n, eqn, aval in rows:
        where = _user_line(eqn, frames)
        key = (where, tuple(aval.shape), str(aval.dtype))
        if key in seen:
            continue
        seen.add(key)
        name = eqn.params.get("name", eqn.primitive.name)
        out.append({"bytes": n, "shape": list(aval.shape), "dtype": str(aval.dtype), "program": str(name),
                    "file": where[0] if where else None, "line": where[1] if where else None})
        if len(out) >= TOP_TEMPORARIES:
            break
    return out


def used_bytes(message: str) -> int | None:
    """The bytes XLA's RESOURCE_EXHAUSTED message says the program needs ("Used 20.5G of 15.75G hbm", "the
    total memory required for HLO temporaries (32.00G) exceeds available HBM")."""
    m = _USED.search(message)
    return int(float(m.group(1)) * _UNIT[m.group(2)]) if m else None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    for ln in text.splitlines():
        if ln.strip() and not ln.startswith("==="):
            return ln.strip()[:400]
    return type(e).__name__


@contextlib.contextmanager
def _stderr_to(path: str) -> Iterator[None]:
    """fd 2 into file `path` while the block runs (what a compiler that aborts the process said stays there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def fatal_line(text: str) -> str | None:
    """The message of the first fatal (absl `F...`) line of a log: what the TPU compiler aborted with."""
    for ln in text.splitlines():
        m = re.match(r"^F\d{4} [\d:.]+\s+\d+ [^\]]+\] (.*)$", ln)
        if m:
            return m.group(1).strip()
    return None


def compile_run(closed, devices: list, frames, log, progress: str, step_only: bool = False,
                last=None, mesh=None, starts: list | None = None) -> dict:
    """Compile the recorded run for `devices` (one chip: the first): each distinct program it called, then the
    last step as one program (`last`: (program, start index per input), its start state donated as the backend's
    optimizer donates it; the whole run when None); returns the figures of the report's "target" object.
    With a `mesh` (a tuned config's, over the slice), the programs are SPMD over it: the step's inputs placed
    as the script placed them (`starts`: the sharding of each start value, None: replicated), every other
    program's replicated; the figures are then per chip of the mesh.

    Before each program's compile, `progress` holds it as JSON (with its user line) and the compiler's log
    goes to `progress + ".err"`: when the TPU compiler aborts the process, the parent names the program."""
    import jax
    import jax.extend.core
    from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

    from tputool.backend.graph.attention_kernels import for_tpu_target
    from tputool.tune.tpu_compile import compiled_bytes

    sharding = SingleDeviceSharding(devices[0]) if mesh is None else NamedSharding(mesh, PartitionSpec())
    out_sharding = sharding if mesh is None else None  # (SPMD: XLA propagates the inputs' shardings)
    result: dict[str, Any] = {"failed": []}
    programs = [] if step_only else _programs(closed)
    compile_s = 0.0
    for sub, eqn in programs:
        args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, sharding=sharding) for v in sub.jaxpr.invars]
        where = _user_line(eqn, frames)
        with open(progress, "w") as f:
            json.dump({"program": str(eqn.params.get("name", "")), "file": where[0] if where else None,
                       "line": where[1] if where else None, "failed": result["failed"]}, f)
        t0 = time.perf_counter()
        try:
            with _stderr_to(progress + ".err"), for_tpu_target():
                jax.jit(jax.extend.core.jaxpr_as_fun(sub), out_shardings=out_sharding).lower(*args).compile()
        except Exception as e:  # noqa: BLE001 - the TPU compiler's rejection is the finding
            if "RESOURCE_EXHAUSTED" in str(e):
                continue  # (one eager program larger than the chip: the whole step's analysis says so)
            result["failed"].append({"program": str(eqn.params.get("name", "")), "error": _first_line(e),
                                     "file": where[0] if where else None, "line": where[1] if where else None})
        finally:
            with open(progress + ".err") as f:
                log.add(f.read(), "program")
        compile_s += time.perf_counter() - t0
    for p in (progress, progress + ".err"):
        if os.path.exists(p):
            os.unlink(p)
    result["programs"] = None if step_only else len(programs)
    result["compile_seconds"] = round(compile_s, 3)
    t0 = time.perf_counter()
    whole, taken = last if last is not None else (closed, [])
    placed = [(starts or [None] * (i + 1))[i] or sharding for i in taken]
    state = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, sharding=s)
             for v, s in zip(whole.jaxpr.invars, placed, strict=True)]
    result["step_program"] = "last step" if last is not None else "whole run"
    step = jax.jit(jax.extend.core.jaxpr_as_fun(whole), out_shardings=out_sharding,
                   donate_argnums=tuple(range(len(state))))
    try:
        with log.capture("step"), for_tpu_target():
            compiled = step.lower(*state).compile()
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        if "RESOURCE_EXHAUSTED" not in msg:
            result["step_error"] = _first_line(e)
            return result
        result["fits"] = False
        result["peak_bytes_per_chip"] = used_bytes(msg)
        result["oom_message"] = _first_line(e)
        result["step_compile_seconds"] = round(time.perf_counter() - t0, 3)
        return result
    result["step_compile_seconds"] = round(time.perf_counter() - t0, 3)
    ma = compiled.memory_analysis()
    result["peak_bytes_per_chip"] = int(compiled_bytes(compiled))
    result["temp_bytes_per_chip"] = int(ma.temp_size_in_bytes)
    result["fits"] = True
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    result["flops"] = float(ca.get("flops", 0.0)) if ca else 0.0
    result["bytes_accessed"] = float(ca.get("bytes accessed", 0.0)) if ca else 0.0
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the script abstractly, compile it for the target, write the JSON result."""
    p = argparse.ArgumentParser(prog="tputool.diagnose.target_run")
    p.add_argument("--record", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--step-only", action="store_true", help="only the whole step (the batch search's runs)")
    p.add_argument("--config", help="a tputool-tune.yaml to apply (its mesh over the slice's devices)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    script = os.path.abspath(ns.script)
    os.environ["TPUTOOL_DIAGNOSE"] = "1"
    os.environ["TPUTOOL_CACHE_DIR"] = "off"  # (compile-only devices cannot load programs from JAX's cache)
    import jax
    import jax.extend.core
    import torch  # (loads the bundled backend before the script runs)

    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)  # op by op: each program keeps its user line

    from tputool.backend.graph.attention_kernels import for_tpu_target
    from tputool.backend.runtime import STATE
    from tputool.diagnose.observe import StepCounter, StepLimitReached
    from tputool.diagnose.userframes import UserFrames
    from tputool.tune.slices import parse_target
    from tputool.tune.tpu_compile import topology_devices
    from tputool.tune.xla_log import XlaLog

    sl = parse_target(ns.target)
    frames = UserFrames(os.path.dirname(script))
    record: dict[str, Any] = {"status": "ok", "steps": 0, "error": None}
    log = XlaLog()
    with log.capture(f"topology {sl.topology_name}", keep_rest=False):  # (libtpu's start-up lines without a TPU)
        devices = topology_devices(sl.topology_name)
    if ns.config:  # one process drives the whole slice through the config's mesh (as `tputool run --config`)
        from tputool.tune.config import apply_config

        apply_config(ns.config)
    elif sl.n_devices > 1:
        simulate_world(sl.n_devices)
    steps = StepCounter(ns.steps)
    run = AbstractRun(frames, devices)
    roles: dict[str, int] = {}
    sys.argv = [script, *ns.args]
    sys.path.insert(0, os.path.dirname(script))

    live: list = []  # (key, value, role, sharding) live at the end of the last step (before the script drops it)
    start: list = []  # (key, value, role, sharding) live at the start of the last step

    def at_step(n: int) -> None:
        nonlocal roles
        if n == ns.steps:
            live[:], roles = _live_state(run.placements)
        elif n == ns.steps - 1:
            start[:] = _live_state(run.placements)[0]

    def at_forward(module, args) -> None:  # the last step starts at its first call of a model
        if steps.steps == ns.steps - 1 and not forwarded and next(module.parameters(), None) is not None:
            forwarded.append(module)
            start[:] = _live_state(run.placements)[0]

    forwarded: list = []
    steps.on_step.append(at_step)
    hook = torch.nn.modules.module.register_module_forward_pre_hook(at_forward)

    def body() -> list:
        nonlocal roles
        try:
            kept = runpy.run_path(script, run_name="__main__")  # noqa: F841 - its globals stay alive meanwhile
            live[:], roles = _live_state(run.placements)
            start.clear()  # (the script ended before its last step: no step to cut out)
        except StepLimitReached:
            record["status"] = "step_limit"
        except SystemExit as e:
            if e.code not in (None, 0):
                record["status"] = "exited"
                record["error"] = {"type": "SystemExit", "message": f"the script exited with status {e.code}",
                                   "traceback": frames.trim_traceback(e.__traceback__)}
        except BaseException as e:  # noqa: BLE001 - the script's failure goes into the record
            record["status"] = "error"
            record["error"] = {"type": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else "",
                               "traceback": frames.trim_traceback(e.__traceback__)}
        return [e[1] for e in live] + [e[1] for e in start]

    t0 = time.perf_counter()
    STATE.abstract = run
    torch._C._set_multithreading_enabled(False)  # backward on this thread: JAX's trace is per thread
    steps.install()
    try:
        with for_tpu_target():  # (Pallas kernels traced now are Mosaic kernels, as on a TPU)
            closed = jax.make_jaxpr(body)()
    finally:
        steps.remove()
        hook.remove()
        STATE.abstract = None
    started = {e[0] for e in start}
    keep = [key in started or role in PERSISTENT for key, _, role, _ in live]
    last = last_step(closed, len(live), keep) if start else None
    record["steps"] = steps.steps
    record["trace_seconds"] = round(time.perf_counter() - t0, 3)
    record["assumptions"] = [{"reason": r, "file": f, "line": ln, "count": n, "value": "zeros"}
                             for (r, f, ln), n in run.assumptions.items()]
    record["live_bytes"] = roles
    record["collective_bytes"] = dict(COLLECTIVE_BYTES)
    record["world"] = sl.n_devices if sl.n_devices > 1 and not ns.config else 1
    mesh = next(iter(run.placements.values())).mesh if run.placements else None
    if mesh is not None:
        record["sharding"] = {"mesh": dict(mesh.shape), "placed_tensors": len(run.placements)}
    starts = [e[3] for e in start]  # (a placed parameter's gradient and optimizer state follow it)
    if record["status"] in ("ok", "step_limit"):
        try:
            record.update(compile_run(closed, devices, frames, log, ns.record + ".progress", ns.step_only, last,
                                      mesh, starts))
            record["largest_values"] = _largest(closed, frames)
            held = sum(roles.values())
            if record.get("peak_bytes_per_chip") is not None and held > record["peak_bytes_per_chip"]:
                # the backend's optimizer is its own program: everything live at the end of the step (the
                # gradients included) is held at once there, however the step's one program fused it away
                record["step_program_peak_bytes"] = record["peak_bytes_per_chip"]
                record["peak_bytes_per_chip"] = held
                record["fits"] = held <= sl.chip.hbm_bytes
        except Exception as e:  # noqa: BLE001
            record["status"] = "error"
            record["error"] = {"type": type(e).__name__, "message": _first_line(e),
                               "traceback": [], "internal": traceback.format_exc(limit=3)}
    record["xla_log"] = log.summary()
    with open(ns.record, "w") as f:
        json.dump(record, f, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
