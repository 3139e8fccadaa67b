"""`tputool launch --via jobset|xpk|gcloud|ray`: the launch of one script on every host of a slice (or of
several slices), written for the launcher people already use. Every host runs the same command,
`python -m tputool.launch.host --target T -- script args` (`host.py`), which turns the TPU environment the
launcher gives into the job's ranks.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tputool.errors import UserError
from tputool.launch.host import DEFAULT_PORT
from tputool.tune.slices import Slice

MEGASCALE_PORT = 8080
"""The port the multi-slice (DCN) runtime's coordinator listens on (what xpk's JobSets set)."""

JAX_COORDINATOR_PORT = 8471
"""The TPU runtime's port between hosts of a slice (declared on the container)."""

_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


@dataclass(frozen=True)
class Launch:
    """What every writer needs: the target slice(s), the script and its args, and the job's settings."""

    slice: Slice
    script: str
    args: tuple[str, ...] = ()
    name: str = "tputool"
    image: str | None = None
    config_yaml: str | None = None  # the tputool-tune.yaml's text, carried in the command
    port: int = DEFAULT_PORT
    python: str = "python"
    host_timeout: float | None = None  # seconds the hosts wait for each other (None: the process group's)

    def host_argv(self) -> list[str]:
        """The command every host runs."""
        cfg = ["--config-b64", base64.b64encode(self.config_yaml.encode()).decode()] if self.config_yaml else []
        wait = ["--host-timeout", f"{self.host_timeout:g}"] if self.host_timeout is not None else []
        return [self.python, "-m", "tputool.launch.host", "--target", self.slice.name,
                "--master-port", str(self.port), *wait, *cfg, "--", self.script, *self.args]

    def host_command(self) -> str:
        """`host_argv` as one shell line."""
        return shlex.join(self.host_argv())


def make_launch(sl: Slice, script: str, args: list[str], name: str | None = None, image: str | None = None,
                config: str | None = None, port: int | None = None, host_timeout: float | None = None) -> Launch:
    """A Launch after checking what every launcher needs (the slice fits hosts, a valid job name, the config)."""
    sl.check_hosts()
    name = name or _job_name(script)
    if not _NAME.match(name):
        raise UserError(f"job name '{name}' must be lowercase letters, digits and '-', start with a letter, "
                        "at most 40 characters (it names Kubernetes objects and hosts)")
    text = None
    if config is not None:
        from tputool.tune.config import load_config

        load_config(config)  # a bad file is refused here, not on every host
        text = Path(config).read_text()
    if host_timeout is not None and host_timeout <= 0:
        raise UserError(f"--host-timeout must be > 0 seconds, got {host_timeout:g}")
    return Launch(sl, script, tuple(args), name, image, text, port or DEFAULT_PORT, host_timeout=host_timeout)


def _job_name(script: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", Path(script).stem.lower()).strip("-")
    stem = stem if stem[:1].isalpha() else f"job-{stem}"
    return (stem[:40].rstrip("-")) or "tputool"


def jobset(lc: Launch) -> dict:
    """A JobSet (jobset.x-k8s.io/v1alpha2): one replicated job per slice, one pod per host."""
    if not lc.image:
        raise UserError("--via jobset needs --image (the container image holding tputool and the script)")
    sl, job = lc.slice, "slice"
    env: list[dict] = []
    if sl.slices > 1:
        env = [
            {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": f"{lc.name}-{job}-0-0.{lc.name}"},
            {"name": "MEGASCALE_NUM_SLICES", "value": str(sl.slices)},
            {"name": "MEGASCALE_SLICE_ID", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['jobset.sigs.k8s.io/job-index']"}}},
            {"name": "MEGASCALE_PORT", "value": str(MEGASCALE_PORT)},
        ]
    container = {
        "name": "main",
        "image": lc.image,
        "command": lc.host_argv(),
        "ports": [{"containerPort": lc.port}, {"containerPort": JAX_COORDINATOR_PORT},
                  {"containerPort": MEGASCALE_PORT}],
        "resources": {"limits": {"google.com/tpu": sl.chips_per_host}},
        "env": env,
    }
    pod = {
        "restartPolicy": "Never",
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "nodeSelector": {"cloud.google.com/gke-tpu-accelerator": sl.chip.gke_accelerator,
                         "cloud.google.com/gke-tpu-topology": sl.gke_topology},
        "containers": [container],
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": lc.name,
                     "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}},
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "network": {"enableDNSHostnames": True, "subdomain": lc.name},
            "replicatedJobs": [{
                "name": job,
                "replicas": sl.slices,
                "template": {"spec": {
                    "parallelism": sl.hosts, "completions": sl.hosts, "backoffLimit": 0,
                    "completionMode": "Indexed",
                    "template": {"spec": pod},
                }},
            }],
        },
    }


def jobset_yaml(lc: Launch) -> str:
    """The JobSet as YAML (`kubectl apply -f`)."""
    import yaml

    return yaml.safe_dump(jobset(lc), sort_keys=False, width=1000)


def xpk(lc: Launch, cluster: str | None, project: str | None, zone: str | None) -> list[str]:
    """`xpk workload create ...` (xpk writes the JobSet and sets the MEGASCALE_* variables itself)."""
    if not lc.image:
        raise UserError("--via xpk needs --image (the docker image xpk runs)")
    if not cluster:
        raise UserError("--via xpk needs --cluster (the GKE cluster xpk created)")
    argv = ["xpk", "workload", "create", "--cluster", cluster, "--workload", lc.name,
            "--tpu-type", lc.slice.cloud_name, "--num-slices", str(lc.slice.slices), "--docker-image", lc.image,
            "--command", lc.host_command()]
    argv += ["--project", project] if project else []
    argv += ["--zone", zone] if zone else []
    return argv


def gcloud(lc: Launch, tpu_name: str | None, zone: str | None, project: str | None) -> list[str]:
    """`gcloud compute tpus tpu-vm ssh NAME --worker=all --command ...` (several slices: the queued
    resource's `--node=all`); every host runs the command."""
    if not tpu_name or not zone:
        raise UserError("--via gcloud needs --tpu-name and --zone (the TPU VM, or queued resource for several "
                        "slices)")
    if lc.slice.slices > 1:
        argv = ["gcloud", "compute", "tpus", "queued-resources", "ssh", tpu_name, "--zone", zone, "--node=all"]
    else:
        argv = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu_name, "--zone", zone]
    argv += [f"--project={project}"] if project else []
    cd = "cd " + shlex.quote(str(Path(lc.script).parent)) + " && " if Path(lc.script).parent != Path() else ""
    return [*argv, "--worker=all", "--command", cd + lc.host_command()]


def ray_job(lc: Launch) -> dict:
    """A Ray job (the Jobs API's submit request): a driver that starts one task per TPU host (`ray_driver.py`)."""
    sl = lc.slice
    entry = ["python", "-m", "tputool.launch.ray_driver", "--hosts", str(sl.hosts), "--slices", str(sl.slices),
             "--chips-per-host", str(sl.chips_per_host), "--accelerator", sl.cloud_name, "--",
             *lc.host_argv()]
    return {
        "entrypoint": shlex.join(entry),
        "runtime_env": {"working_dir": "."},
        "metadata": {"tputool_target": sl.name, "job_name": lc.name},
        "entrypoint_num_cpus": 1,
    }


def ray_json(lc: Launch) -> str:
    """The Ray job as JSON (`ray job submit --submission-id ... -- <entrypoint>`, or the Jobs REST API)."""
    return json.dumps(ray_job(lc), indent=2)
