"""A DDP training step of tputool's Llama in NPROC processes: the tpu device over the "tpu" group against CPU
tensors over torch's gloo group, interleaved in one torchrun launch.

Every process builds the same model twice (CPU copy wrapped in DDP over a gloo group, tpu copy in DDP over the
default "tpu" group), trains each on its own rank-dependent batch with AdamW, and the rows are timed in
ROUNDS interleaved rounds of `--steps` steps (so both see the same machine load); the best round's median is
kept. Rank 0 prints ms/step and the tpu/gloo ratio.
Timings on a CPU-only machine measure dispatch, host collectives and XLA:CPU, not TPU speed; read the ratio.

    python benchmarks/ddp_step.py [--nproc 2] [--config tiny|small] [--batch 8] [--steps 10] [--modes strict,fused]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from collections.abc import Callable

from train_step import median_ms  # (benchmarks/ is this script's directory: sys.path[0])

ROUNDS = 3


def _launch(args: argparse.Namespace) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}", f"--master_port={port}",
           __file__, "--config", args.config, "--batch", str(args.batch), "--steps", str(args.steps),
           "--modes", args.modes]
    return subprocess.call(cmd, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})



def _step_fn(model, spec, x, y, device: str, process_group, mode: str | None) -> Callable[[], None]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, process_group=process_group)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = spec.loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        float(loss.detach().cpu())  # (waits for the step: tpu work is asynchronous)

    if mode is None:
        return step

    def in_mode() -> None:
        with torch.tpu.eager_mode(getattr(torch.tpu.EagerMode, mode)):
            step()

    return in_mode


MODES = {"strict": "DEFER_NEVER", "fused": "DEFER_AND_FUSE"}


def _worker(args: argparse.Namespace) -> None:
    import copy

    import torch
    import torch.distributed as dist

    from tputool.models import MODELS
    from tputool.models.llama import LlamaConfig

    rank = int(os.environ["RANK"])
    refused = None
    try:
        dist.init_process_group("tpu")
        torch.tpu.set_device(int(os.environ["LOCAL_RANK"]))
    except RuntimeError as e:
        refused = str(e).splitlines()[0]
        dist.init_process_group("gloo")
    gloo = dist.new_group(backend="gloo")
    spec = MODELS["llama"]
    cfg = getattr(LlamaConfig, args.config)()
    torch.manual_seed(0)
    base = spec.build(cfg)
    x, y = spec.example_batch(cfg, args.batch, "cpu", torch.Generator().manual_seed(100 + rank))
    rows: dict[str, Callable[[], None]] = {"cpu-gloo": _step_fn(copy.deepcopy(base), spec, x, y, "cpu", gloo, None)}
    if refused is None:
        for name in args.modes.split(","):
            rows[f"tpu-{name}"] = _step_fn(copy.deepcopy(base).to("tpu"), spec, x.to("tpu"), y.to("tpu"), "tpu",
                                           None, MODES[name])
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for name, step in rows.items():
            step()  # (warm-up: the first call compiles)
            best[name] = min(best.get(name, float("inf")), median_ms(step, args.steps))
    if rank == 0:
        n = sum(p.numel() for p in base.parameters())
        print(f"DDP train step, llama {args.config} ({n / 1e6:.1f}M params), batch {args.batch} per rank, "
              f"{dist.get_world_size()} processes, best of {ROUNDS} interleaved rounds of {args.steps} steps")
        ref = best["cpu-gloo"]
        for name, ms in best.items():
            print(f"  {name:10s} {ms:9.1f} ms/step   {ms / ref:5.2f}x cpu-gloo")
        if refused is not None:
            print(f"  tpu rows: not run: {refused}")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--config", choices=("tiny", "small"), default="tiny")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--modes", default="strict,fused", help="tpu eager modes to time: strict, fused")
    args = p.parse_args()
    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:
        _worker(args)
    else:
        sys.exit(_launch(args))


if __name__ == "__main__":
    main()
