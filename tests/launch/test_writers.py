"""`tputool launch --via jobset|xpk|gcloud|ray` for a single-host, a multi-host and a multi-slice target: the
JobSet validated against the JobSet CRD's published OpenAPI schema (tests/launch/data, strict: no unknown
fields) and its Job and pod against Kubernetes' own schemas (kubernetes-validate, strict); the commands parsed
(shlex, then their flags) and the command every host runs parsed by the host command's own parser."""

from __future__ import annotations

import argparse
import base64
import copy
import json
import shlex
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from tputool.cli import app
from tputool.errors import UserError
from tputool.launch import host
from tputool.launch.writers import gcloud, jobset, make_launch, ray_job, xpk
from tputool.tune.slices import parse_target

DATA = Path(__file__).resolve().parent / "data"
TARGETS = ["v5e-4", "v5p-32", "v6e-256x2"]  # single host, multi-host, multi-slice
K8S_VERSION = "1.33.0"


def _strict(schema: dict) -> dict:
    """The schema with unknown fields refused wherever it lists the known ones (as the API server prunes
    them silently, a typo would otherwise pass)."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


JOBSET_SCHEMA = _strict(json.loads((DATA / "jobset-v1alpha2.schema.json").read_text())["schema"])


def _host_args(argv: list[str]) -> argparse.Namespace:
    """The host command's arguments, parsed by its own parser (after `python -m tputool.launch.host`)."""
    assert argv[1:3] == ["-m", "tputool.launch.host"], argv
    return host.parser().parse_args(argv[3:])


def _launch(target: str, **kw):
    return make_launch(parse_target(target), "train.py", ["--lr", "3e-4", "--name", "a b"], name="llama",
                       image="us-docker.pkg.dev/p/r/train:1", **kw)


def _check_host_command(argv: list[str], target: str) -> None:
    a = _host_args(argv)
    assert parse_target(a.target) == parse_target(target)
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    assert (a.script, args) == ("train.py", ["--lr", "3e-4", "--name", "a b"])


@pytest.mark.parametrize("target", TARGETS)
def test_jobset_is_valid_and_has_the_slice_layout(target):
    sl = parse_target(target)
    doc = yaml.safe_load(yaml.safe_dump(jobset(_launch(target))))
    jsonschema.validate(doc, JOBSET_SCHEMA)
    (rj,) = doc["spec"]["replicatedJobs"]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}, "spec": rj["template"]["spec"]}
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    spec = rj["template"]["spec"]
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert rj["replicas"] == sl.slices
    assert spec["parallelism"] == spec["completions"] == sl.hosts
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": sl.chip.gke_accelerator,
                                   "cloud.google.com/gke-tpu-topology": sl.gke_topology}
    assert c["resources"]["limits"]["google.com/tpu"] == sl.chips_per_host
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert doc["spec"]["network"]["enableDNSHostnames"] is True
    _check_host_command(c["command"], target)
    env = {e["name"]: e for e in c["env"]}
    if sl.slices > 1:
        assert env["MEGASCALE_NUM_SLICES"]["value"] == str(sl.slices)
        # the first pod of slice 0, by the JobSet's stable DNS name <jobset>-<job>-<replica>-<index>.<subdomain>
        assert env["MEGASCALE_COORDINATOR_ADDRESS"]["value"] == \
            f"llama-{rj['name']}-0-0.{doc['spec']['network']['subdomain']}"
        assert "job-index" in env["MEGASCALE_SLICE_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    else:
        assert not [k for k in env if k.startswith("MEGASCALE")]


def test_the_schema_check_can_fail():
    doc = jobset(_launch("v5p-32"))
    doc["spec"]["replicatedJobs"][0]["replica"] = 2  # a typo
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, JOBSET_SCHEMA)
    pod = copy.deepcopy(doc["spec"]["replicatedJobs"][0]["template"]["spec"])
    pod["template"]["spec"]["hostNetwork"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"},
                                      "spec": pod}, K8S_VERSION, strict=True)


def _flags(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """(positionals, {--flag: value}) of a command line whose flags take one value (`--f v` or `--f=v`)."""
    pos, flags, i = [], {}, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            flags[k] = v
        elif a.startswith("--"):
            flags[a] = argv[i + 1]
            i += 1
        else:
            pos.append(a)
        i += 1
    return pos, flags


@pytest.mark.parametrize("target", TARGETS)
def test_xpk_command(target):
    sl = parse_target(target)
    argv = shlex.split(shlex.join(xpk(_launch(target), "c1", "proj", "us-east5-a")))
    pos, flags = _flags(argv)
    assert pos == ["xpk", "workload", "create"]
    assert flags["--cluster"] == "c1" and flags["--workload"] == "llama"
    assert flags["--tpu-type"] == sl.cloud_name and parse_target(flags["--tpu-type"]).chips_per_slice == \
        sl.chips_per_slice
    assert flags["--num-slices"] == str(sl.slices)
    assert flags["--docker-image"] == "us-docker.pkg.dev/p/r/train:1"
    assert (flags["--project"], flags["--zone"]) == ("proj", "us-east5-a")
    _check_host_command(shlex.split(flags["--command"]), target)


@pytest.mark.parametrize("target", TARGETS)
def test_gcloud_command(target):
    sl = parse_target(target)
    argv = shlex.split(shlex.join(gcloud(_launch(target), "my-tpu", "us-central2-b", "proj")))
    pos, flags = _flags(argv)
    kind = "queued-resources" if sl.slices > 1 else "tpu-vm"
    assert pos == ["gcloud", "compute", "tpus", kind, "ssh", "my-tpu"]
    assert flags["--zone"] == "us-central2-b" and flags["--project"] == "proj" and flags["--worker"] == "all"
    assert flags.get("--node") == ("all" if sl.slices > 1 else None)
    _check_host_command(shlex.split(flags["--command"]), target)


@pytest.mark.parametrize("target", TARGETS)
def test_ray_job(target):
    sl = parse_target(target)
    spec = json.loads(json.dumps(ray_job(_launch(target))))
    assert set(spec) <= {"entrypoint", "runtime_env", "metadata", "entrypoint_num_cpus", "entrypoint_resources",
                         "submission_id", "entrypoint_num_gpus", "entrypoint_memory"}  # the Jobs API's fields
    entry = shlex.split(spec["entrypoint"])
    assert entry[:3] == ["python", "-m", "tputool.launch.ray_driver"]
    cut = entry.index("--")
    pos, flags = _flags(entry[3:cut])
    assert not pos
    assert (int(flags["--hosts"]), int(flags["--slices"]), int(flags["--chips-per-host"]), flags["--accelerator"]) \
        == (sl.hosts, sl.slices, sl.chips_per_host, sl.cloud_name)
    _check_host_command(entry[cut + 1:], target)


def test_the_tune_config_travels_with_the_job(tmp_path):
    from tests.tune.test_config_cli import write_cfg

    cfg = write_cfg(tmp_path / "tputool-tune.yaml")
    argv = jobset(_launch("v5p-32", config=str(cfg)))["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]["containers"][0]["command"]
    a = _host_args(argv)
    assert base64.b64decode(a.config_b64).decode() == cfg.read_text()
    path = host.config_file(a.config_b64)  # (what every host does with it)
    assert Path(path).read_text() == cfg.read_text()
    Path(path).unlink()
    with pytest.raises(UserError):  # a bad file is refused when the launch is written
        _launch("v5p-32", config=str(write_cfg(tmp_path / "bad.yaml", mesh={"data": 0})))


def test_cli_writes_out_and_refuses_missing_settings(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    out = tmp_path / "jobset.yaml"
    r = CliRunner().invoke(app, ["launch", "--target", "v6e-256x2", "--via", "jobset", "--image", "img:1",
                                 "--out", str(out), str(script), "--steps", "10"])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    jsonschema.validate(doc, JOBSET_SCHEMA)
    assert _host_args(doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "command"]).args[-2:] == ["--steps", "10"]
    r = CliRunner().invoke(app, ["launch", "--target", "v5p-32", "--via", "jobset", str(script)])
    assert isinstance(r.exception, UserError) and "--image" in str(r.exception)
    r = CliRunner().invoke(app, ["launch", "--target", "v5e-16", "--via", "gcloud", "--tpu-name", "t", str(script)])
    assert isinstance(r.exception, UserError) and "--zone" in str(r.exception)
    r = CliRunner().invoke(app, ["launch", "--target", "v5e-16", "--via", "gcloud", "--tpu-name", "t",
                                 "--zone", "z", "--dry-run", str(script)])
    assert r.exit_code == 0 and shlex.split(r.output)[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "t"]
