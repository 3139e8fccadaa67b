"""Collective bandwidth of the tpu process group (JAX's distributed runtime) next to torch's gloo on CPU tensors.

Runs itself under torchrun for each process count. In every worker, for each collective and size, the columns
alternate round by round (the same machine load hits all of them):
  tpu        the "tpu" group on tpu tensors, each call waited for (torch.tpu.synchronize);
  tpu-nochk  the same with the signature exchange off (TPUTOOL_DIST_CHECKS=0): what the store handshake costs;
  jax        the same collective as a bare jitted JAX program (psum / all_gather / psum_scatter under shard_map
             over the processes' devices, no torch): the floor any group built on JAX's runtime reaches here;
  gloo       a gloo group on CPU tensors (the same values).
algbw = bytes / median time, bytes being the larger buffer (all_reduce: the tensor; all_gather: the gathered
output; reduce_scatter: the input), as nccl-tests count them. ratio = tpu / gloo (>= 1: the tpu group is faster); jax/gloo is the same
ratio for bare JAX.

    .venv/bin/python benchmarks/collectives.py [--nproc 2,4] [--sizes 1K,...,64M] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M"
OPS = ("all_reduce", "all_gather", "reduce_scatter")
COLUMNS = ("tpu", "tpu-nochk", "jax", "gloo")


def _bytes(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def _label(n: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n // size}{unit}"
    return str(n)


# ---- worker (one rank) --------------------------------------------------------------------------------

def _bare_jax(op: str, elems: int, n: int):
    """A zero-argument call running `op` as a bare jitted shard_map program on this process's block."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("r",))
    bodies = {"all_reduce": lambda a: lax.psum(a, "r"),
              "all_gather": lambda a: lax.all_gather(a, "r", tiled=True),
              "reduce_scatter": lambda a: lax.psum_scatter(a, "r", scatter_dimension=0, tiled=True)}
    local = elems // n if op == "all_gather" else elems
    out_spec = P() if op == "all_gather" else P("r")
    fn = jax.jit(jax.shard_map(bodies[op], mesh=mesh, in_specs=P("r"), out_specs=out_spec, check_vma=False))
    block = jax.device_put(jnp.ones((local,), jnp.float32), jax.local_devices()[0])
    x = jax.make_array_from_single_device_arrays((n * local,), NamedSharding(mesh, P("r")), [block])
    return lambda: jax.block_until_ready(fn(x))


def _worker(sizes: list[int], rounds: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("tpu")
    rank, n = dist.get_rank(), dist.get_world_size()
    os.environ["TPUTOOL_DIST_CHECKS"] = "0"
    nochk = dist.new_group(backend="tpu")
    os.environ["TPUTOOL_DIST_CHECKS"] = "1"
    groups = {"tpu": (None, "tpu"), "tpu-nochk": (nochk, "tpu"), "gloo": (dist.new_group(backend="gloo"), "cpu")}
    results = []
    for op in OPS:
        for nbytes in sizes:
            elems = max(n, nbytes // 4 // n * n)  # float32, divisible by the world size
            bufs = {"jax": _bare_jax(op, elems, n)}
            for col, (_, dev) in groups.items():
                x = torch.ones(elems, device=dev)
                if op == "all_reduce":
                    bufs[col] = (x,)
                elif op == "all_gather":
                    bufs[col] = (torch.empty(elems, device=dev), x[: elems // n].contiguous())
                else:
                    bufs[col] = (torch.empty(elems // n, device=dev), x)
            iters = max(2, min(20, int(4e6 / nbytes)))
            times = {c: [] for c in COLUMNS}
            for _ in range(rounds + 1):  # (the first round compiles: dropped)
                dist.barrier(group=groups["gloo"][0])
                t0 = time.perf_counter()
                for _ in range(iters):
                    bufs["jax"]()
                times["jax"].append((time.perf_counter() - t0) / iters)
                for col, (group, dev) in groups.items():
                    b = bufs[col]
                    sync = torch.tpu.synchronize if dev == "tpu" else (lambda: None)
                    dist.barrier(group=groups["gloo"][0])
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        if op == "all_reduce":
                            dist.all_reduce(b[0], group=group)
                        elif op == "all_gather":
                            dist.all_gather_into_tensor(b[0], b[1], group=group)
                        else:
                            dist.reduce_scatter_tensor(b[0], b[1], group=group)
                        sync()
                    times[col].append((time.perf_counter() - t0) / iters)
            med = {c: statistics.median(v[1:]) for c, v in times.items()}
            results.append({"op": op, "bytes": elems * 4, "nproc": n, **{f"{c}_s": med[c] for c in COLUMNS}})
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


# ---- driver ---------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nproc: int, sizes: str, rounds: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "r.json")
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               f"--master_port={_free_port()}", __file__, "--worker", "--sizes", sizes, "--rounds", str(rounds),
               "--out", out]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.loads(Path(out).read_text())


def _table(rows: list[dict]) -> str:
    lines = [f"{'nproc':>5} {'collective':<15} {'size':>6} " + " ".join(f"{c + ' GB/s':>15}" for c in COLUMNS)
             + f" {'ratio':>7} {'jax/gloo':>8}"]
    for r in rows:
        bw = {c: r["bytes"] / r[f"{c}_s"] / 1e9 for c in COLUMNS}
        lines.append(f"{r['nproc']:>5} {r['op']:<15} {_label(r['bytes']):>6} "
                     + " ".join(f"{bw[c]:>15.3f}" for c in COLUMNS) + f" {bw['tpu'] / bw['gloo']:>7.2f} {bw['jax'] / bw['gloo']:>8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse the options; as a torchrun worker run the measurements, else launch them and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", default="2,4")
    p.add_argument("--sizes", default=SIZES)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        _worker([_bytes(s) for s in a.sizes.split(",")], a.rounds, a.out)
        return
    rows = []
    for nproc in (int(x) for x in a.nproc.split(",")):
        rows += _launch(nproc, a.sizes, a.rounds)
    print(_table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
