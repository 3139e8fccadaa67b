"""tputool tune --target (predicted), tputool-tune.yaml round trip, apply_config and tputool run."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from typer.testing import CliRunner

from tputool.cli import app
from tputool.errors import UserError
from tputool.tune.config import active_config, apply_config, clear_config, load_config

runner = CliRunner()

BIG_LLAMA = ["--set", "dim=2048", "--set", "n_layers=16", "--set", "n_heads=16", "--set", "n_kv_heads=8",
             "--set", "ffn_dim=5632", "--set", "max_seq_len=2048", "--set", "vocab_size=32000"]


@pytest.fixture(autouse=True)
def _no_active_config():
    clear_config()
    yield
    clear_config()


def test_predicted_tune_writes_a_config(tmp_path, monkeypatch):
    monkeypatch.setattr("tputool.tune.tpu_compile.available", lambda: False)
    out = tmp_path / "tputool-tune.yaml"
    res = runner.invoke(app, ["tune", "--model", "llama", "--target", "v5e-8", *BIG_LLAMA, "--batch", "1,8",
                              "--attention", "plain,chunked:512", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "estimated for v5e-8" in res.output and "libtpu not installed" in res.output
    doc = yaml.safe_load(out.read_text())
    assert doc["mode"] == "predicted" and doc["hardware"]["devices"] == 8
    m = doc["mesh"]
    assert m["data"] * m["fsdp"] * m["tensor"] == 8
    assert doc["predicted"]["memory_bytes_per_device"] <= 16e9
    # a 1.4B model with 16 B/param of state cannot be replicated on 16 GB chips: flagged as memory misfit
    rejected = doc["search"]["rejected"]
    assert any(r["stage"] == "memory" and r["what"].startswith("d8f1t1") for r in rejected)
    cfg = load_config(out)
    assert cfg.candidate.n_devices == 8 and cfg.candidate.remat == doc["remat"]


def test_bad_target_is_one_line_error():
    res = runner.invoke(app, ["tune", "--target", "v9-8"])
    assert res.exit_code != 0
    assert isinstance(res.exception, UserError) and "unknown TPU generation" in str(res.exception)


@pytest.mark.parametrize("args", [["--batch", "0"], ["--remat", "some"], ["--attention", "chunked"],
                                  ["--precision", "fp8"], ["--set", "novalue"]])
def test_bad_search_options(args):
    res = runner.invoke(app, ["tune", "--target", "v5e-8", *args])
    assert isinstance(res.exception, UserError)


def write_cfg(path, **changes):
    doc = {"tputool_tune": 1, "model": "llama", "mode": "measured", "mesh": {"data": 2, "fsdp": 4, "tensor": 1},
           "batch_per_shard": 2, "remat": "save-dots", "attention": {"impl": "chunked", "block": 16},
           "precision": "bf16"}
    doc.update(changes)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_apply_config_and_param_specs(tmp_path):
    cfg = apply_config(write_cfg(tmp_path / "t.yaml"))
    assert active_config() is cfg
    assert cfg.mesh_shape == {"data": 2, "fsdp": 4, "tensor": 1}
    assert cfg.param_spec("layers.0.attn.wq.weight", (64, 64)) == (None, "fsdp")
    assert cfg.param_spec("layers.0.attn_norm.weight", (64,)) == (None,)
    assert cfg.remat_policy() is not None


@pytest.mark.parametrize("change", [{"tputool_tune": 7}, {"mesh": {"data": 2}}, {"remat": "sometimes"}])
def test_bad_config_files(tmp_path, change):
    with pytest.raises(UserError):
        load_config(write_cfg(tmp_path / "t.yaml", **change))


def test_run_applies_config_for_the_script(tmp_path):
    cfg = write_cfg(tmp_path / "t.yaml")
    script = tmp_path / "train.py"
    out = tmp_path / "seen.txt"
    script.write_text(textwrap.dedent(f"""
        import sys
        from tputool.tune import active_config
        c = active_config()
        open({str(out)!r}, "w").write(f"{{c.candidate.key}} {{sys.argv[1:]}}")
    """))
    res = runner.invoke(app, ["run", "--config", str(cfg), str(script), "--lr", "3"])
    assert res.exit_code == 0, res.output
    assert out.read_text() == "d2f4t1 b2 save-dots chunked/16 bf16 ['--lr', '3']"


def test_run_missing_script(tmp_path):
    res = runner.invoke(app, ["run", "--config", str(write_cfg(tmp_path / "t.yaml")), "nope.py"])
    assert isinstance(res.exception, UserError)


def test_config_drives_the_graph_backends_sharding(tmp_path, monkeypatch):
    """cfg.shard_model places each parameter with cfg.param_spec (the rules of tputool.partition, untranslated)
    and replicates buffers."""
    from types import SimpleNamespace

    import torch
    from torch import nn

    from tputool.backend.graph import sharding
    from tputool.tune.config import TuneConfig

    cfg = load_config(write_cfg(tmp_path / "t.yaml", mesh={"data": 1, "fsdp": 4, "tensor": 2}))
    model = nn.Module()
    model.tok_emb = nn.Embedding(256, 64)
    model.layers = nn.ModuleList([nn.Module()])
    model.layers[0].attn = nn.Module()
    model.layers[0].attn.wq = nn.Linear(64, 64, bias=False)
    model.layers[0].attn.wo = nn.Linear(64, 64, bias=False)
    model.layers[0].attn_norm = nn.LayerNorm(64, bias=False)
    model.register_buffer("rope", torch.zeros(8, 4))
    mesh = SimpleNamespace(shape=cfg.mesh_shape)
    monkeypatch.setattr(TuneConfig, "make_mesh", lambda self, devices=None: mesh)
    placed = []
    monkeypatch.setattr(sharding, "mark_sharding", lambda t, m, spec: placed.append((tuple(t.shape), m, spec)))
    got_mesh, specs = cfg.shard_model(model)
    assert got_mesh is mesh and all(m is mesh for _, m, _ in placed)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert set(shapes) == {"tok_emb.weight", "layers.0.attn.wq.weight", "layers.0.attn.wo.weight",
                           "layers.0.attn_norm.weight"}
    for name, shape in shapes.items():
        assert specs[name] == cfg.param_spec(name, shape)
    assert specs["rope"] == () and [s for sh, _, s in placed if sh == (8, 4)] == [()]
    assert cfg.param_spec("layers.0.attn.wq.weight", (64, 64)) == ("tensor", "fsdp")
    assert cfg.param_spec("layers.0.attn.wo.weight", (64, 64)) == ("fsdp", "tensor")


def test_written_config_round_trips(tmp_path, monkeypatch):
    """The YAML is TuneConfig.to_dict(); load_config reads it back into the same TuneConfig."""
    monkeypatch.setattr("tputool.tune.tpu_compile.available", lambda: False)
    out = tmp_path / "tputool-tune.yaml"
    res = runner.invoke(app, ["tune", "--model", "llama", "--target", "v5e-8", "--batch", "1,8", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(out.read_text())
    cfg = load_config(out)
    assert cfg.to_dict() == doc
    assert list(doc)[:4] == ["tputool_tune", "model", "mode", "label"]
    assert {"hardware", "mesh", "global_batch", "partition_rules", "predicted", "search"} <= set(doc)


def test_shard_model_on_the_tpu_device(tmp_path):
    import torch

    from tputool.models import build_model

    cfg = load_config(write_cfg(tmp_path / "t.yaml", mesh={"data": 1, "fsdp": 1, "tensor": 1}))
    model = build_model("mlp").to("tpu")
    mesh, specs = cfg.shard_model(model)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
    assert set(specs) >= {n for n, _ in model.named_parameters()}
    out = model(torch.randn(4, 32).to("tpu"))
    assert out.shape == (4, 10)


def test_tune_a_user_model_file(tmp_path, monkeypatch):
    monkeypatch.setattr("tputool.tune.tpu_compile.available", lambda: False)
    f = tmp_path / "mymodel.py"
    f.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def build():
            return nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))

        def example_batch(batch_size, device, generator):
            return torch.randn(batch_size, 512, generator=generator), torch.randn(batch_size, 512, generator=generator)
    """))
    out = tmp_path / "tune.yaml"
    res = runner.invoke(app, ["tune", "--model", f"{f}:build", "--target", "v6e-8", "--batch", "8,64",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(out.read_text())
    assert doc["model"].endswith("mymodel.py:build") and doc["attention"]["impl"] == "plain"
    # no heads or ffn width known for a plain Sequential: tensor parallelism is ruled out, and said why
    assert doc["mesh"]["tensor"] == 1
    assert any("split over tensor" in r["reason"] for r in doc["search"]["rejected"])
