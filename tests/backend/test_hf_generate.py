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
def test_compiled_decode_gives_cpus_tokens_and_compiles_once_per_bucket(kind: str, build, tpu_device: str) -> None:
    from torch._dynamo.utils import counters

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
    again, built = _programs(lambda: dev.generate(prompt.to(tpu_device), **kw).cpu())
    assert built == 0  # a repeated call reuses every program, the compiled step's included
    assert again.tolist() == model.generate(prompt, **kw).tolist()


def test_callers_max_cache_len_and_cache_choice_are_kept(tpu_device: str) -> None:
    torch.manual_seed(0)
    dev = _llama().eval().to(tpu_device)
    prompt = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(3)).to(tpu_device)
    kw = {"max_new_tokens": 3, "do_sample": False, "return_dict_in_generate": True, "disable_compile": True}
    assert dev.generate(prompt, max_cache_len=20, **kw).past_key_values.layers[0].keys.shape[-2] == 20
    assert type(dev.generate(prompt, cache_implementation="dynamic", **kw).past_key_values).__name__ == "DynamicCache"
