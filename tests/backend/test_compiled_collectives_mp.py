"""Two processes under torchrun: torch.compile'd graphs whose collectives span both ranks run as one computation
even when they draw random numbers or hold an all_to_all of uneven splits, and a compiled FSDP2 model trains
(fixtures/compiled_worker.py); checked against each rank's own draws and against torch's gloo group on CPU tensors."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.backend.test_parallel_multiprocess import LOSS_TOL, NPROC, PARAM_TOL, torchrun

WORKER = Path(__file__).resolve().parent / "fixtures" / "compiled_worker.py"


def _ranks(case: str, device: str, tmp_path: Path) -> list[dict]:
    out = tmp_path / f"{case}-{device}"
    out.mkdir()
    run = torchrun([str(WORKER), case, device, str(out)], tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(NPROC)]


def test_a_graph_drawing_random_numbers_runs_as_one_program_with_each_ranks_own_draws(tmp_path: Path) -> None:
    ranks = _ranks("rng", "tpu", tmp_path)
    for got in ranks:
        assert got["graphs"] == {"one_program": 1}, got["warnings"]
        assert not any("cut around" in w for w in got["warnings"]), got["warnings"]
        # each rank draws exactly what the same draws compiled alone on that rank give (its own stream) ...
        torch.testing.assert_close(got["d"], got["alone"], rtol=0, atol=0)
        # ... and what the graph cut around its collective drew, the generator advanced alike
        torch.testing.assert_close(got["d_cut"], got["d"], rtol=0, atol=0)
        torch.testing.assert_close(got["s_cut"], got["s"])
        assert torch.equal(got["after"], got["after_alone"]) and torch.equal(got["after"], got["after_cut"])
        assert got["graphs_cut"] == {"one_program": 1, "split": 1}
    d0, d1 = ranks[0]["d"], ranks[1]["d"]
    assert not torch.equal(d0, d1)  # (different seeds, different draws)
    assert (d0 < 1).any() and (d0 >= 2).any()  # (dropout dropped some and kept some: 0 or 2, plus [0, 1))
    for got in ranks:  # the all_reduce inside the program sums both ranks' draws
        torch.testing.assert_close(got["s"], 2 * d0 + 2 * d1)


def test_uneven_all_to_all_in_a_compiled_graph_runs_as_one_program_as_gloo(tmp_path: Path) -> None:
    cpu = _ranks("a2a", "cpu", tmp_path)
    for want in cpu:
        torch.testing.assert_close(want["compiled"], want["eager"])
        torch.testing.assert_close(want["one_way_compiled"], want["one_way"])
    assert cpu[0]["one_way"].shape == (0, 2) and cpu[1]["one_way"].shape == (2, 2)
    tpu = _ranks("a2a", "tpu", tmp_path)
    for want, got in zip(cpu, tpu, strict=True):
        for key in ("eager", "compiled", "eager_grad", "compiled_grad", "one_way", "one_way_compiled"):
            torch.testing.assert_close(got[key], want[key], msg=key)
        # (forward and backward, and a rank that receives nothing: its program keeps the exchange all the same)
        assert got["graphs"] == {"one_program": 3}, got["compiled_warnings"]
        assert not any("cut around" in w for w in got["compiled_warnings"]), got["compiled_warnings"]


def test_fsdp2_model_compiled_for_tpu_trains_as_eager_gloo_on_cpu(tmp_path: Path) -> None:
    cpu = _ranks("fsdp2", "cpu", tmp_path)
    assert cpu[0]["losses"] != cpu[1]["losses"]  # (each rank trains on its own data)
    tpu = _ranks("fsdp2", "tpu", tmp_path)
    for want, got in zip(cpu, tpu, strict=True):
        assert got["compiled_graphs"] > 0  # (FSDP2's hooks run eagerly, the layers between them compiled)
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]), **LOSS_TOL)
        torch.testing.assert_close(got["state"], want["state"], **PARAM_TOL)
