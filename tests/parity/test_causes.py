"""parity's causes from synthetic records: which ops draw from a random stream, and a random op called outside
any module whose draw departs before a module departs (not an inherited parameter difference)."""

import pytest
import torch

from tputool.parity.analyze import analyze
from tputool.parity.record import drawn_from, is_random


@pytest.mark.parametrize("op", ["aten.native_dropout.default", "aten.bernoulli_.float", "aten.uniform_.default",
                                "aten._fused_dropout.default", "aten.multinomial.default", "torch.multinomial",
                                "torch.Tensor.multinomial", "torch.randn_like", "torch.Tensor.normal_",
                                "torch.nn.functional.dropout", "torch.randint", "torch.randperm", "_standard_gamma"])
def test_random_ops(op):
    assert is_random(op)


@pytest.mark.parametrize("op", ["aten.native_dropout_backward.default", "aten.native_layer_norm.default",
                                "torch.nn.functional.normalize", "torch.nn.functional.poisson_nll_loss",
                                "aten.addmm.default", "torch.Tensor.__getitem__", "torch.argmax"])
def test_deterministic_ops(op):
    assert not is_random(op)


def test_what_a_draw_depends_on():
    p, x = torch.rand(2, 5), torch.zeros(3)
    assert drawn_from("torch.multinomial", (p, 1), {}) is p
    assert drawn_from("torch.Tensor.bernoulli_", (x, p), {}) is p  # not the tensor it fills
    assert drawn_from("torch.Tensor.normal_", (x,), {}) is None
    assert drawn_from("torch.randn_like", (p,), {}) is None  # only its shape matters
    assert drawn_from("torch.randn", ((3,),), {"out": x}) is None


def _entry(kind, name, step, call, value, **extra):
    key = f"{step}/{kind}/{name}#{call}"
    return {"key": key, "kind": kind, "name": name, "cls": extra.pop("cls", "Embedding"), "step": step,
            "call": call, "file": "/s/sample.py", "line": extra.pop("line", 20), "dtype": str(value.dtype),
            "shape": list(value.shape), "value": value.float() if value.is_floating_point() else value,
            "stats": None, "autocast": None, "random": kind == "random", "fallbacks": 0,
            "carried": "torch.float32", **extra}


def _records(draw_step=1, token=(7, 9), redraw="same", probs_off=0.0, shape_only=False):
    """A step 0 that agrees; in `draw_step` a multinomial draw (outside modules) of `token` (tpu, reference)
    from probabilities off by `probs_off`; then an embedding that departs in step 1 and whose replay shows
    nothing of its own (it computes the same from the same inputs)."""
    probs = torch.full((1, 16), 1 / 16)
    inp = {"dtype": "torch.float32", "shape": [1, 16], "value": probs, "stats": None}
    inp_tpu = {**inp, "value": probs + probs_off}
    emb = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(0))
    sides = []
    for i, tok in enumerate(token):
        draw = _entry("random", "torch.multinomial@sample.py:30", draw_step, 0, torch.tensor([[tok]]),
                      cls="torch.multinomial", line=30, site_file="/s/sample.py", site_line=30,
                      input=None if shape_only else inp_tpu if i == 0 else inp,
                      **({"redraw": redraw} if i == 0 else {}))
        out = emb + (1.0 if i == 0 else 0.0)
        entries = [_entry("out", "LM.emb", 0, 0, emb), _entry("out", "LM.emb", 1, 0, emb)]
        entries.insert(1 if draw_step == 0 else 2, draw)
        entries.append(_entry("out", "LM.emb", 1, 1, out))
        sides.append({"entries": entries, "steps": 2, "status": "step_limit", "matmul_precision": "highest"})
    sides[0]["replays"] = [{"key": "1/out/LM.emb#1", "name": "LM.emb", "cls": "Embedding", "ops": 1,
                            "ref_ops": 1, "divergence": None, "first": None, "random_at": None,
                            "random_ops": [], "fallback_ops": []}]
    return sides


def _causes(**kw):
    tpu, ref = _records(**kw)
    f = analyze(tpu, ref)["findings"][0]
    assert f["key"] == "1/out/LM.emb#1", f
    return f["causes"]


def test_a_draw_from_another_stream_is_the_cause():
    c = _causes()
    assert [x["name"] for x in c] == ["random-op"] and (c[0]["op"], c[0]["line"]) == ("torch.multinomial", 30)
    assert "another random stream" in c[0]["message"]


def test_a_draw_that_depends_only_on_shapes_differs_by_its_stream():
    c = _causes(shape_only=True, redraw=None)
    assert c[0]["name"] == "random-op" and "depend only on the random stream" in c[0]["message"], c


def test_a_draw_flipped_by_rounding_says_so():
    c = _causes(redraw="differs", probs_off=1e-8)
    assert c[0]["name"] == "random-op" and "float rounding of its input" in c[0]["message"], c


def test_a_draw_from_inputs_that_already_differ_is_not_blamed_on_the_stream():
    c = _causes(probs_off=1e-2)
    assert c[0]["name"] == "unknown" and "already differs" in c[0]["message"], c


@pytest.mark.parametrize("kw", [{"token": (7, 7)}, {"draw_step": 0}])
def test_without_a_differing_draw_in_its_step_the_parameters_are_still_suspected(kw):
    """A draw that agrees, or one that differed in an earlier step: the departure stays inherited (an update
    that differs), as a genuine optimizer bug must be reported."""
    c = _causes(**kw)
    assert [x["name"] for x in c] == ["inherited"] and "updates differ" in c[0]["message"], c


def test_replay_under_float32_autocast_runs_the_reference_without_autocast_warnings():
    """llm.c wraps its float32 forward in torch.amp.autocast(dtype=float32): the replay's reference passed that
    dtype to CPU autocast, which refuses it with a UserWarning printed into the user's parity run."""
    import warnings

    import tputool.backend  # noqa: F401 - registers the tpu device
    from tputool.diagnose.userframes import UserFrames
    from tputool.parity.replay import replay

    torch.manual_seed(0)
    module = torch.nn.Linear(8, 4).to("tpu")
    x = torch.randn(2, 8).to("tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("tpu", dtype=torch.float32):
            tpu_ops, ref_ops = replay(module, (x,), {}, UserFrames(__file__), 1 << 20)
    assert [o["op"] for o in tpu_ops] == [o["op"] for o in ref_ops] and tpu_ops
