"""The host command's reading of the TPU environment: ranks from TPU_WORKER_ID / MEGASCALE_SLICE_ID as JAX
numbers its processes, and a host whose environment does not match the slice refused in one line."""

from __future__ import annotations

import pytest

from tputool.errors import UserError
from tputool.launch import host
from tputool.tune.slices import parse_target


def _env(worker=0, hosts=4, accel="v5p-32", **extra):
    return {"TPU_WORKER_ID": str(worker), "TPU_WORKER_HOSTNAMES": ",".join(f"h{i}" for i in range(hosts)),
            "TPU_ACCELERATOR_TYPE": accel, **extra}


def test_ranks_and_coordinator_single_and_multi_slice():
    sl = parse_target("v5p-32")
    info = host.read_tpu_env(_env(worker=3))
    host.check_host(info, sl)
    env = host.torch_env(info, sl, 1234)
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("3", "4", "h0", "1234")
    sl2 = parse_target("v5p-32x3")
    info = host.read_tpu_env(_env(worker=1, MEGASCALE_NUM_SLICES="3", MEGASCALE_SLICE_ID="2",
                                  MEGASCALE_COORDINATOR_ADDRESS="s0h0:8080"))
    host.check_host(info, sl2)
    env = host.torch_env(info, sl2, 1234)
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("9", "12", "s0h0")


@pytest.mark.parametrize(("env", "target", "says"), [
    (_env(hosts=2), "v5p-32", r"lists 2 host\(s\)"),
    (_env(accel="v5p-64"), "v5p-32", "part of a v5p-64 slice"),
    (_env(worker=4), "v5p-32", "TPU_WORKER_ID 4 is outside"),
    (_env(), "v5p-32x2", "MEGASCALE_NUM_SLICES"),
    (_env(MEGASCALE_NUM_SLICES="2", MEGASCALE_SLICE_ID="1"), "v5p-32x2", "MEGASCALE_COORDINATOR_ADDRESS"),
    (_env(accel="v5litepod-16"), "v5e-16", None),
])
def test_a_host_that_does_not_match_the_slice_is_refused(env, target, says):
    info = host.read_tpu_env(env)
    if says is None:
        host.check_host(info, parse_target(target))
        return
    with pytest.raises(UserError, match=says):
        host.check_host(info, parse_target(target))


def test_the_host_command_exits_2_with_one_line(monkeypatch, capsys):
    for k, v in _env(hosts=3).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as e:
        host.main(["--target", "v5p-32", "--", "train.py"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lists 3 host(s)" in err
