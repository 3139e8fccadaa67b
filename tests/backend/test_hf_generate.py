"""Hugging Face `generate()` on tpu with its default compiled decoding step: CPU's greedy tokens, one decoding
program per cache bucket (counted, never timed), reused across calls and prompt lengths."""

from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from tputool.backend import hf_generate  # noqa: E402
from tputool.diagnose.jaxwatch import JaxWatch  # noqa: E402

VOCAB = 128
COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON))


def _qwen3_moe():
    return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, **COMMON))


def test_cache_bucket_rounds_up_to_a_power_of_two_within_the_models_positions() -> None:
    assert [hf_generate.cache_bucket(n) for n in (1, 40, 64, 65, 300)] == [64, 64, 64, 128, 512]
    assert hf_generate.cache_bucket(100, limit=96) == 100  # never shorter than the generation
    assert hf_generate.cache_bucket(40, limit=48) == 48  # capped at the model's positions
    assert hf_generate.cache_bucket(40, limit=32) == 40


def _programs(run) -> tuple[object, int]:
    """`run()`'s result and how many XLA programs JAX built (lowered) while it ran."""
    watch = JaxWatch(lambda: 0)
    watch.install()
    try:
        out = run()
    finally:
        watch.remove()
    return out, sum(1 for _, name, _ in watch.spans if name == "lower_s")


@pytest.mark.parametrize(("kind", "build"), [("llama", _llama), ("qwen3_moe", _qwen3_moe)])
def test_compiled_decode_gives_cpus_tokens_and_compiles_once_per_bucket(kind: str, build, tpu_device: str,
                                                                       monkeypatch) -> None:
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TPUTOOL_HF_COMPILE_AFTER", "0")  # (HF's own choice: the step compiled from the first call)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build().eval()
    dev = copy.deepcopy(model).to(tpu_device)
    g = torch.Generator().manual_seed(1)
    kw = {"max_new_tokens": 4, "do_sample": False}
    graphs = counters["stats"]["unique_graphs"]
    for length in (6, 9):  # max_length 10 and 13: one bucket (64), so one decoding step for both
        prompt = torch.randint(1, VOCAB, (1, length), generator=g)
        got = dev.generate(prompt.to(tpu_device), **kw, return_dict_in_generate=True)
        assert got.sequences.cpu().tolist() == model.generate(prompt, **kw).tolist()
        assert got.past_key_values.layers[0].keys.shape[-2] == 64
    assert counters["stats"]["unique_graphs"] - graphs == 1  # the decoding step, traced once, no recompile
    # The prompt's first ops just changed shape (6 -> 9): whether Fused eager ran them alone in the second call
    # depends on the shapes earlier traces of the process began with (`fused.ROOT_WINDOW`), so the call after it
    # may fuse them into one new program of its prefill. From then on nothing is new:
    dev.generate(prompt.to(tpu_device), **kw).cpu()  # (read, as below: nothing of it joins the next call's trace)
    again, built = _programs(lambda: dev.generate(prompt.to(tpu_device), **kw).cpu())
    assert built == 0  # a repeated call reuses every program, the compiled step's included
    assert again.tolist() == model.generate(prompt, **kw).tolist()


def test_decoding_step_is_compiled_once_the_model_decoded_enough_tokens_eagerly(tpu_device: str, monkeypatch) -> None:
    from torch._dynamo.utils import counters

    from tputool.backend import hf_decode

    monkeypatch.setenv("TPUTOOL_HF_COMPILE_AFTER", "8")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _llama().eval()
    dev = copy.deepcopy(model).to(tpu_device)
    prompt = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    kw = {"max_new_tokens": 5, "do_sample": False}
    want = model.generate(prompt, **kw).tolist()
    traced = []
    for _ in range(3):  # 5 tokens, then 10 decoded eagerly: the third call is compiled
        graphs = counters["stats"]["unique_graphs"]
        assert dev.generate(prompt.to(tpu_device), **kw).cpu().tolist() == want
        traced.append(counters["stats"]["unique_graphs"] - graphs)
    assert traced == [0, 0, 1]
    other = copy.deepcopy(model).to(tpu_device)  # a call asking for that many tokens is compiled at once
    assert not hasattr(other, "_compiled_call")  # (HF's get_compiled_call keeps the compiled step there)
    long = other.generate(prompt.to(tpu_device), max_new_tokens=8, do_sample=False).cpu().tolist()
    assert hasattr(other, "_compiled_call")
    assert long == model.generate(prompt, max_new_tokens=8, do_sample=False).tolist()
    monkeypatch.setenv("TPUTOOL_HF_COMPILE_AFTER", "soon")
    with pytest.raises(ValueError, match="TPUTOOL_HF_COMPILE_AFTER='soon'"):
        hf_decode.compile_after()


def test_callers_max_cache_len_and_cache_choice_are_kept(tpu_device: str) -> None:
    torch.manual_seed(0)
    dev = _llama().eval().to(tpu_device)
    prompt = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(3)).to(tpu_device)
    kw = {"max_new_tokens": 3, "do_sample": False, "return_dict_in_generate": True, "disable_compile": True}
    assert dev.generate(prompt, max_cache_len=20, **kw).past_key_values.layers[0].keys.shape[-2] == 20
    assert type(dev.generate(prompt, cache_implementation="dynamic", **kw).past_key_values).__name__ == "DynamicCache"


def _qwen3():
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=8, **COMMON))


class _Streamer:
    """Records what generate() streams."""

    def __init__(self) -> None:
        self.got: list = []

    def put(self, value) -> None:
        self.got.append(value.tolist())

    def end(self) -> None:
        self.got.append("end")


def _decode_calls(monkeypatch) -> list:
    """Counts calls of the shape-stable decoding loop."""
    from tputool.backend import hf_decode

    calls: list = []
    real = hf_decode.decode
    monkeypatch.setattr(hf_decode, "decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


# (name, model, prompt rows, extra generate() arguments): each run through tputool's loop and HF's own on tpu
def _mistral_sliding():
    return transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=8, **COMMON))


def _mixtral():
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                                                       **COMMON))


_LOOP_CASES = [
    ("greedy", _llama, 1, {}),
    ("sliding window", _mistral_sliding, 2, {}),
    ("moe sampled", _qwen3_moe, 2, {"do_sample": True}),
    ("mixtral end of sequence", _mixtral, 2, {"eos_from_step": 2, "pad_token_id": 0}),
    ("greedy qwen3", _qwen3, 2, {}),
    ("sampled", _llama, 2, {"do_sample": True, "top_k": 20, "temperature": 0.9}),
    ("left padding", _llama, 2, {"attention_mask": [[0, 0, 1, 1, 1, 1, 1], [1] * 7], "pad_token_id": 0}),
    ("repetition penalty", _qwen3, 1, {"repetition_penalty": 1.5}),
    ("end of sequence", _llama, 2, {"eos_from_step": 3, "pad_token_id": 0}),
    ("streamer", _llama, 1, {"streamer": True}),
]


@pytest.mark.parametrize(("name", "build", "rows", "extra"), _LOOP_CASES, ids=[c[0] for c in _LOOP_CASES])
def test_decode_loop_gives_hfs_loops_tokens(name, build, rows, extra, tpu_device, monkeypatch) -> None:
    from tputool.backend import hf_decode

    torch.manual_seed(0)
    model = build().eval()
    dev = copy.deepcopy(model).to(tpu_device)
    prompt = torch.randint(1, VOCAB, (rows, 7), generator=torch.Generator().manual_seed(2))
    kw = {"max_new_tokens": 12, "do_sample": False, **extra}
    if "attention_mask" in kw:
        kw["attention_mask"] = torch.tensor(kw["attention_mask"])
    if "eos_from_step" in kw:  # an end-of-sequence token the first row generates at that step
        kw["eos_token_id"] = model.generate(prompt, max_new_tokens=12, do_sample=False)[0, 7 + kw.pop("eos_from_step")]

    def run(on: str, streamer=None):
        args = {k: v.to(on) if isinstance(v, torch.Tensor) and k == "attention_mask" else v for k, v in kw.items()}
        if streamer is not None:
            args["streamer"] = streamer
        torch.manual_seed(5)
        return (dev if on != "cpu" else model).generate(prompt.to(on), **args).cpu().tolist()

    streams = [_Streamer(), _Streamer()] if kw.pop("streamer", False) else [None, None]
    calls = _decode_calls(monkeypatch)
    ours = run(tpu_device, streams[0])
    assert calls, "the shape-stable loop did not run"
    monkeypatch.setattr(hf_decode, "eligible", lambda *a, **k: False)
    assert ours == run(tpu_device, streams[1])  # HF's own loop, same device, same seed
    assert len(calls) == 1
    if streams[0] is not None:
        assert streams[0].got == streams[1].got
    if not kw.get("do_sample"):
        assert ours == run("cpu")
    if "eos_token_id" in kw:
        assert len(ours[0]) == len(ours[1]) < 7 + 12 or ours[0][-1] == 0  # the first row stopped and was padded


def test_decode_loop_builds_no_program_per_token(tpu_device: str) -> None:
    torch.manual_seed(0)
    dev = _llama().eval().to(tpu_device)
    prompt = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(4)).to(tpu_device)
    dev.generate(prompt, max_new_tokens=4, do_sample=False).cpu()
    _, built = _programs(lambda: dev.generate(prompt, max_new_tokens=24, do_sample=False).cpu())
    assert built <= 2  # the result's length is new (HF's loop: two programs per new length, ~40 here)


def test_the_last_token_reuses_the_decoding_steps_program(tpu_device: str, monkeypatch) -> None:
    """A first generate() builds one program for the prompt and one for every decoding step, the last included
    (its stopping criterion's `torch.full(size, True)` and the inputs no step will read used to make it another
    program of the whole model)."""
    from tputool.backend import fused

    sizes: list = []
    real = fused.Trace._compiled
    monkeypatch.setattr(fused.Trace, "_compiled", lambda self, *a: sizes.append(len(self.nodes)) or real(self, *a))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**COMMON, "hidden_size": 48})).eval()
    dev = copy.deepcopy(model).to(tpu_device)  # (shapes no other test makes: every program is new here)
    prompt = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(4))
    got = dev.generate(prompt.to(tpu_device), max_new_tokens=5, do_sample=False).cpu()
    assert got.tolist() == model.generate(prompt, max_new_tokens=5, do_sample=False).tolist()
    assert len([n for n in sizes if n >= 100]) == 2, sizes  # the prompt's and the decoding step's (before: 3)


_OTHER_CALLS = [
    ("per-step scores", _llama, {"return_dict_in_generate": True, "output_scores": True}),
    ("sliding window with a mask", _mistral_sliding, {"attention_mask": [[0, 1, 1, 1, 1]]}),
]


@pytest.mark.parametrize(("name", "build", "extra"), _OTHER_CALLS, ids=[c[0] for c in _OTHER_CALLS])
def test_decode_loop_leaves_other_calls_to_hfs_loop(name, build, extra, tpu_device: str, monkeypatch) -> None:
    torch.manual_seed(0)
    model = build().eval()
    dev = copy.deepcopy(model).to(tpu_device)
    prompt = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(3))
    kw = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0, **extra}
    if "attention_mask" in kw:
        kw["attention_mask"] = torch.tensor(kw["attention_mask"])
    calls = _decode_calls(monkeypatch)
    got = dev.generate(prompt.to(tpu_device), **{k: v.to(tpu_device) if isinstance(v, torch.Tensor) else v
                                                 for k, v in kw.items()})
    assert not calls
    if "output_scores" in kw:
        assert len(got.scores) == 3
        got = got.sequences
    ref = model.generate(prompt, **{k: v for k, v in kw.items() if k not in ("return_dict_in_generate", "output_scores")})
    assert got.cpu().tolist() == ref.tolist()
