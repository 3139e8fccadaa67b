"""XLA's C++ warnings written to fd 2 during a compile are captured and summarised one line per kind."""

from __future__ import annotations

import os

from tputool.tune.xla_log import XlaLog, kind_of

REMAT = (b"W0000 00:00:1764870430.123456   4242 hlo_rematerialization.cc:3011] Involuntary full "
         b"rematerialization. The compiler was not able to go below the HBM memory limit of 15.75G; "
         b"peak 21.3G\n")


def test_fd_level_writes_are_captured_and_summarised(capfd):
    log = XlaLog()
    with log.capture("d4f32t2 b1 none plain bf16"):
        os.write(2, REMAT)
        os.write(2, REMAT.replace(b"21.3G", b"22.0G"))
        os.write(2, b"I0000 00:00:1.0  1 service.cc:1] informational, dropped\n")
        os.write(2, b"not a log line, passed through\n")
    with log.capture("d8f16t2 b2 full splash/512 bf16"):
        os.write(2, REMAT)
        os.write(2, b"E1204 17:27:10.000001   7 spmd_partitioner.cc:630] Sharding 4 is replicated: slow\n")
        os.write(2, b"WARNING: could not determine TPU accelerator type, please set env var\n")
    err = capfd.readouterr().err
    assert "Involuntary" not in err and "informational" not in err
    assert "not a log line, passed through" in err
    lines = log.summary()
    assert lines == [
        "XLA warning x3: Involuntary full rematerialization - from d4f32t2 b1 none plain bf16, "
        "d8f16t2 b2 full splash/512 bf16",
        "XLA warning x1: Sharding N is replicated - from d8f16t2 b2 full splash/512 bf16",
        "XLA warning x1: could not determine TPU accelerator type, please set env var - from d8f16t2 b2 full "
        "splash/512 bf16",
    ]


def test_capture_restores_stderr_after_an_exception(capfd):
    log = XlaLog()
    try:
        with log.capture("c"):
            os.write(2, REMAT)
            raise RuntimeError("compile failed")
    except RuntimeError:
        pass
    os.write(2, b"after\n")
    assert "after" in capfd.readouterr().err
    assert len(log.summary()) == 1


def test_kind_is_the_first_clause():
    assert kind_of("Involuntary full rematerialization. The compiler ...") == "Involuntary full rematerialization"
    assert kind_of("Can't reduce memory use below 14.9GiB (15 bytes) by rematerialization") == \
        "Can't reduce memory use below NGiB (N bytes) by rematerialization"


def test_compile_step_files_warnings_under_the_candidate(capfd):
    from tputool.tune.measure import compile_step

    class FakeBuilt:
        def lower(self):
            return self

        def compile(self):
            os.write(2, REMAT)
            return "compiled"

    log = XlaLog()
    compiled, seconds = compile_step(FakeBuilt(), log, "d2f2t2 b4 none flash/128 bf16")
    assert compiled == "compiled" and seconds >= 0
    assert log.summary() == ["XLA warning x1: Involuntary full rematerialization - from d2f2t2 b4 none flash/128 bf16"]
    assert "Involuntary" not in capfd.readouterr().err
