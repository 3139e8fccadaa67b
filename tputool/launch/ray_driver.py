"""The driver of `tputool launch --via ray`: one Ray task per TPU host, all hosts of a slice at once.

Each slice is a placement group of `hosts` bundles of `{"TPU": chips per host}`, spread over distinct nodes
(STRICT_SPREAD), the first bundle also holding the slice's `TPU-<type>-head` resource that Ray's TPU nodes
advertise on worker 0 (so the hosts of one bundle set are the hosts of one slice). Every task runs the host
command (`host.py`) in the environment its TPU node gives (KubeRay's TPU webhook sets TPU_WORKER_ID and
TPU_WORKER_HOSTNAMES); for several slices the driver adds MEGASCALE_* (coordinator: slice 0's first host).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def _run_host(argv: list[str], extra_env: dict[str, str]) -> int:
    return subprocess.run(argv, env={**os.environ, **extra_env}, check=False).returncode


def _ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def main(argv: list[str] | None = None) -> None:
    """Start the host command on every TPU host of every slice and exit with the first failure's status."""
    p = argparse.ArgumentParser(prog="python -m tputool.launch.ray_driver")
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--slices", type=int, default=1)
    p.add_argument("--chips-per-host", type=int, required=True)
    p.add_argument("--accelerator", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command

    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init()
    head = f"TPU-{a.accelerator}-head"
    groups = []
    for _ in range(a.slices):
        bundles = [{"TPU": a.chips_per_host, **({head: 1} if i == 0 else {})} for i in range(a.hosts)]
        groups.append(placement_group(bundles, strategy="STRICT_SPREAD"))
    ray.get([g.ready() for g in groups])
    run = ray.remote(_run_host)
    extra: list[dict[str, str]] = [{} for _ in groups]
    if a.slices > 1:
        ip = ray.remote(_ip)
        coordinator = ray.get(ip.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            groups[0], placement_group_bundle_index=0), resources={"TPU": a.chips_per_host}).remote())
        extra = [{"MEGASCALE_COORDINATOR_ADDRESS": coordinator, "MEGASCALE_NUM_SLICES": str(a.slices),
                  "MEGASCALE_SLICE_ID": str(s), "MEGASCALE_PORT": "8080"} for s in range(a.slices)]
    tasks = [run.options(resources={"TPU": a.chips_per_host}, scheduling_strategy=PlacementGroupSchedulingStrategy(
        g, placement_group_bundle_index=i)).remote(command, extra[s])
        for s, g in enumerate(groups) for i in range(a.hosts)]
    codes = ray.get(tasks)
    sys.exit(next((c for c in codes if c), 0))


if __name__ == "__main__":
    main()
