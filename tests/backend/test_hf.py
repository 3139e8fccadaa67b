"""Hugging Face Transformers models (small configs, random weights, no download) run unchanged on the device.

Forward outputs and every parameter gradient must match CPU (rtol/atol 1e-4 forward, 1e-3 gradients).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

FWD_TOL = {"rtol": 1e-4, "atol": 1e-4}
GRAD_TOL = {"rtol": 1e-3, "atol": 1e-3}
VOCAB, SEQ, BATCH = 128, 16, 2


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def _bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertModel(cfg)


def _t5():
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                dropout_rate=0.0, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg)


def _mixtral():
    cfg = transformers.MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(cfg)


def _qwen3_moe():
    cfg = transformers.Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=8)
    return transformers.Qwen3MoeForCausalLM(cfg)


def _qwen3():
    cfg = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, head_dim=8)
    return transformers.Qwen3ForCausalLM(cfg)


def _inputs(kind: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -4:] = 0  # padding in the second row exercises the attention mask
    if kind == "bert":
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    if kind == "t5":
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(1, VOCAB, (BATCH, 8), generator=g)}
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


def _run(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    out = model(**inputs)
    if getattr(out, "loss", None) is not None:
        values = {"loss": out.loss, "logits": out.logits}
        objective = out.loss
    else:
        values = {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output}
        objective = out.last_hidden_state.pow(2).mean() + out.pooler_output.sum()
    objective.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in values.items()}, grads


def _parity(build, kind: str, device: str) -> None:
    torch.manual_seed(0)
    cpu_model = build().train()
    dev_model = copy.deepcopy(cpu_model).to(device)
    inputs = _inputs(kind)
    cpu_out, cpu_grads = _run(cpu_model, inputs)
    dev_out, dev_grads = _run(dev_model, {k: v.to(device) for k, v in inputs.items()})
    torch.testing.assert_close({k: v.cpu() for k, v in dev_out.items()}, cpu_out, **FWD_TOL)
    assert set(dev_grads) == set(cpu_grads) and cpu_grads
    torch.testing.assert_close({k: v.cpu() for k, v in dev_grads.items()}, cpu_grads, **GRAD_TOL)


@pytest.mark.parametrize(("kind", "build"), [("llama", _llama), ("gpt2", _gpt2), ("bert", _bert)])
def test_hf_forward_backward_matches_cpu(kind: str, build, tpu_device: str) -> None:
    _parity(build, kind, tpu_device)


@pytest.mark.parametrize(("kind", "build"), [("mixtral", _mixtral), ("qwen3_moe", _qwen3_moe)])
def test_hf_moe_forward_backward_matches_cpu(kind: str, build, tpu_device: str) -> None:
    # Their routing counts tokens per expert with torch.histc on integers (CPU has no int histc: CUDA does).
    _parity(build, kind, tpu_device)


@pytest.mark.parametrize(("kind", "build"), [("llama", _llama), ("qwen3", _qwen3), ("qwen3_moe", _qwen3_moe)])
def test_hf_greedy_generate_gives_cpus_tokens(kind: str, build, tpu_device: str) -> None:
    torch.manual_seed(0)
    model = build().eval()
    prompt = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
    kw = {"max_new_tokens": 6, "do_sample": False, "cache_implementation": "static", "disable_compile": True}
    want = model.generate(prompt, **kw)
    got = copy.deepcopy(model).to(tpu_device).generate(prompt.to(tpu_device), **kw)
    assert got.cpu().tolist() == want.tolist()


@pytest.mark.slow
def test_hf_t5_forward_backward_matches_cpu(tpu_device: str) -> None:
    _parity(_t5, "t5", tpu_device)


def test_from_pretrained_with_device_map_tpu(tmp_path, tpu_device: str) -> None:
    pytest.importorskip("accelerate", reason="device_map needs accelerate: pip install 'tputool[hf]'")
    torch.manual_seed(0)
    _llama().save_pretrained(tmp_path)  # random weights, saved locally: nothing is downloaded
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map="tpu")
    assert {p.device.type for p in model.parameters()} == {"tpu"}
    cpu_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    prompt = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(2))
    kw = {"max_new_tokens": 4, "do_sample": False, "cache_implementation": "static", "disable_compile": True}
    assert model.generate(prompt.to("tpu"), **kw).cpu().tolist() == cpu_model.generate(prompt, **kw).tolist()


def test_generate_on_tpu_defaults_to_a_static_cache_and_keeps_the_callers_choice(tpu_device: str) -> None:
    torch.manual_seed(0)
    model = _llama().eval()
    prompt = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(3))
    kw = {"max_new_tokens": 4, "do_sample": False, "return_dict_in_generate": True, "disable_compile": True}
    want = model.generate(prompt, **kw)
    dev = copy.deepcopy(model).to(tpu_device)
    got = dev.generate(prompt.to(tpu_device), **kw)
    assert got.sequences.cpu().tolist() == want.sequences.tolist()
    assert type(got.past_key_values).__name__ == "StaticCache"  # one shape for the whole generation
    assert type(want.past_key_values).__name__ == "DynamicCache"  # CPU keeps HF's default
    chosen = dev.generate(prompt.to(tpu_device), cache_implementation="dynamic", **kw)
    assert type(chosen.past_key_values).__name__ == "DynamicCache"
