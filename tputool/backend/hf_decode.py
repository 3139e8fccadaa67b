"""Hugging Face `generate()` on tpu: a decoding loop whose every step has the same shapes.

HF's `_sample` loop grows `input_ids`, `position_ids` and the 2D `attention_mask` by one position per token
(`torch.cat`), and slices the last one back out for the next step. On a device that compiles one program per
shape, the glue between two decoding steps is then a new XLA program every token: for a 2-layer model, most of a
cold `generate()`'s time. `decode` is the same loop with that glue kept at one shape: the generated ids are
written into a buffer (`max_length` rounded up as the cache's length is) at a position held on the device, the next step's inputs are the
new tokens and last positions themselves (what HF's slices return), the 2D mask is kept at the static cache's
length (HF pads it to that length before use: the same mask). The model step, logits processors, stopping
criteria, streamer and compiled forward are HF's own, called in HF's order with the same values: processors
and criteria that read the ids get them (a view of the buffer; only the end-of-sequence criterion, which reads
the last token alone, is given that token). Tokens equal HF's loop's (tests/backend/test_hf_generate.py). The last
step also prepares the next step's inputs (dropped) where the cache has room, so it records what every other step
does and reuses their fused program.

The decoding step runs in Fused eager mode (one fused program per token, kept in the disk cache) until the model
has decoded `COMPILE_AFTER` tokens in this process, or a call asks for that many: only then is it HF's compiled
step (when HF would compile it). A compiled step decodes a token ~2x faster here but costs a Dynamo trace of ~2 s in
every new process, which no cache keeps; a short generation never earns it back, a long one does within a few
hundred tokens. `TPUTOOL_HF_COMPILE_AFTER=0` compiles from the first call, as HF does; so do Strict and Debug
eager modes, which have no fused eager step.

It runs only where that equivalence was checked: the transformers versions in `VERIFIED`, a decoder-only model
whose `prepare_inputs_for_generation` and `_update_model_kwargs_for_generation` are HF's own, a static cache,
no per-step records (`output_scores`, ...), `synced_gpus`, assistant or chunked prefill, model inputs among `_KWARGS`; anything
else runs HF's loop unchanged. `TPUTOOL_HF_STATIC_CACHE=0` turns it off with the static cache default.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch

from tputool.backend import fused
from tputool.backend import tensor as tt
from tputool.backend.hf_generate import cache_bucket

VERIFIED = ("5.25.",)
"""transformers versions (prefixes) whose `_sample` this loop was checked against."""
_KWARGS = frozenset({"cache", "use_cache", "attention_mask", "position_ids", "logits_to_keep"})
"""The model inputs HF's loop passes through `_sample` that `decode` knows how to keep at one shape."""
STOP_CHECK = "generate() stop check"
"""The flush and host-sync reason of each decoding step's end (`tputool diagnose`: a designed boundary)."""
COMPILE_AFTER = 512
"""Tokens a model decodes eagerly in a process before its decoding step is compiled (see the module docstring):
about where the eager steps' extra time has cost what the compile costs (tiny Llama, 2-core host, disk cache warm:
~4.6 ms per token against a ~2.2 s trace). `TPUTOOL_HF_COMPILE_AFTER` sets it."""
_DECODED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""model -> tokens it decoded eagerly in this process."""
_RECORDS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
"""Per-step records `return_dict_in_generate` can ask for: left to HF's loop."""


def eligible(model: Any, mixin: type, input_ids: torch.Tensor, stopping_criteria: Any, generation_config: Any,
             synced_gpus: bool, model_kwargs: dict) -> bool:
    """Whether `decode` computes what HF's `_sample` would for this call (else HF's loop runs)."""
    import transformers

    if not transformers.__version__.startswith(VERIFIED):  # (checked first: older ones lack these names)
        return False
    from transformers.cache_utils import StaticCache, StaticLayer
    from transformers.generation.stopping_criteria import MaxLengthCriteria

    cache = model_kwargs.get("cache")
    mask = model_kwargs.get("attention_mask")
    positions = model_kwargs.get("position_ids")
    cls = type(model)
    if not (getattr(model, "device", None) is not None
            and model.device.type == "tpu" and not model.config.is_encoder_decoder and not synced_gpus
            and not any(getattr(generation_config, f) for f in _RECORDS) and not generation_config.is_assistant
            and generation_config.prefill_chunk_size is None and set(model_kwargs) <= _KWARGS
            and model_kwargs.get("use_cache", True) and isinstance(cache, StaticCache)
            and cls.prepare_inputs_for_generation is mixin.prepare_inputs_for_generation
            and cls._update_model_kwargs_for_generation is mixin._update_model_kwargs_for_generation
            and input_ids.dtype == torch.long and input_ids.ndim == 2 and generation_config.max_length is not None
            and any(type(c) is MaxLengthCriteria and c.max_length <= generation_config.max_length
                    for c in stopping_criteria)):
        return False
    if positions is not None and positions.ndim != 2:
        return False
    if mask is not None:  # (kept at the cache's length: only where HF pads it to exactly that length)
        layers = getattr(cache, "layers", ())
        if mask.ndim != 2 or not layers or any(type(layer) is not StaticLayer for layer in layers):
            return False
        if len({layer.max_cache_len for layer in layers}) != 1 or layers[0].max_cache_len < generation_config.max_length:
            return False
    return True


def compile_after() -> int:
    """`COMPILE_AFTER`, or `TPUTOOL_HF_COMPILE_AFTER` where set (a bad value is an error naming the variable)."""
    raw = os.environ.get("TPUTOOL_HF_COMPILE_AFTER")
    if raw is None:
        return COMPILE_AFTER
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"TPUTOOL_HF_COMPILE_AFTER={raw!r}: expected a number of tokens >= 0")
    return value


def compile_now(model: Any, new_tokens: int) -> bool:
    """Whether this call's decoding step should be the compiled one: the model has decoded `compile_after()`
    tokens eagerly in this process, or this call alone asks for that many, or eager mode is not Fused (Strict
    and Debug launch one program per op: their eager step is never the cheaper one)."""
    from tputool.backend import runtime

    after = compile_after()
    return (runtime.STATE.mode is not runtime.EagerMode.DEFER_AND_FUSE or new_tokens >= after
            or _DECODED.get(model, 0) >= after)


def decode(model: Any, input_ids: torch.Tensor, logits_processor: Any, stopping_criteria: Any,
           generation_config: Any, streamer: Any = None, **model_kwargs: Any) -> torch.Tensor:
    """HF's `_sample` (greedy or sampled, transformers `VERIFIED`) with every decoding step at one shape."""
    from transformers.cache_utils import StaticLayer
    from transformers.generation.stopping_criteria import EosTokenCriteria

    device = input_ids.device
    batch, length = input_ids.shape
    max_length = generation_config.max_length
    pad_token_id = generation_config._pad_token_tensor
    if pad_token_id is not None:
        pad_token_id = pad_token_id.to(device)
    has_eos = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
    unfinished = torch.ones(batch, dtype=torch.long, device=device)
    compiled = compile_now(model, max_length - length) and model._valid_auto_compile_criteria(model_kwargs,
                                                                                              generation_config)
    model_forward = model.get_compiled_call(generation_config.compile_config) if compiled else model.__call__
    outputs = model._prefill(input_ids, generation_config, model_kwargs, is_first_iteration=True)

    # the shapes kept for the whole loop: ids in a buffer written at `where` (as long as the cache, so calls in one
    # bucket share programs), the mask at the cache's length
    ids = torch.zeros((batch, cache_bucket(max(max_length, length))), dtype=input_ids.dtype, device=device)
    ids[:, :length] = input_ids
    where = torch.full((1,), length, dtype=torch.long, device=device)
    mask = model_kwargs.pop("attention_mask", None)
    if mask is not None:  # (HF appends a 1 after each forward, then pads with zeros to the cache's length)
        full = torch.zeros((batch, model_kwargs["cache"].layers[0].max_cache_len), dtype=mask.dtype, device=device)
        full[:, :length] = mask
        mask = full
    positions = model_kwargs.pop("position_ids", None)
    if positions is not None:
        positions = positions[..., -1:]

    layers = getattr(model_kwargs["cache"], "layers", ())  # (a position past max_length in every layer)
    spare = bool(layers) and all(type(layer) is StaticLayer and layer.max_cache_len > max_length
                                 for layer in layers)
    this_peer_finished = False
    step = 0
    model_inputs: dict = {}
    with model._optimize_model_for_decode():
        while not this_peer_finished:
            if step:
                outputs = model_forward(**model_inputs, return_dict=True)
            step += 1
            # (HF's _update_model_kwargs_for_generation: the cache, then one more position of mask and positions)
            if "cache" in outputs:
                model_kwargs["cache"] = outputs["cache"]
            if mask is not None:
                mask = mask.index_fill(1, where, 1)
            if positions is not None:
                positions = positions + 1

            current = length + step - 1  # (the ids HF's loop holds here)
            logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32, device=device)
            scores = logits_processor(ids[:, :current], logits)
            if generation_config.do_sample:
                probs = torch.nn.functional.softmax(scores, dim=-1)
                next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
            else:
                next_tokens = torch.argmax(scores, dim=-1)
            if has_eos:
                next_tokens = next_tokens * unfinished + pad_token_id * (1 - unfinished)
            ids.index_copy_(1, where, next_tokens[:, None])
            where = where + 1
            grown = ids[:, :current + 1]
            done = torch.full((batch,), False, device=device, dtype=torch.bool)
            for criterion in stopping_criteria:  # (StoppingCriteriaList.__call__, the EOS criterion on the new token)
                done = done | criterion(next_tokens[:, None] if type(criterion) is EosTokenCriteria else grown, None)
            unfinished = unfinished & ~done
            stop = unfinished.max() == 0
            if current + 1 < max_length or spare:  # (the next step's inputs, recorded before the stop check: one
                # program computes both. HF: prepare_inputs_for_generation slices the grown ids and positions back
                # to their last column; it reads the cache's sizes only, which no forward has changed since. On the
                # last step they are made too where the cache has room for them, and dropped: that step then
                # records what every other step does and reuses its program instead of compiling one more)
                model_inputs = model.prepare_inputs_for_generation(
                    next_tokens[:, None], next_sequence_length=1, attention_mask=mask, position_ids=positions,
                    **model_kwargs)
            fused.flush(STOP_CHECK)  # (the step's end: HF's loop reads whether to stop every token)
            if streamer is not None:
                streamer.put(next_tokens.cpu())
            this_peer_finished = bool(tt.to_cpu(stop, STOP_CHECK))  # (HF: bool(unfinished.max() == 0))
            del outputs
    if not compiled:
        _DECODED[model] = _DECODED.get(model, 0) + step
    if streamer is not None:
        streamer.end()
    sequences = ids[:, :length + step].clone()
    if not generation_config.return_dict_in_generate:
        return sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    return GenerateDecoderOnlyOutput(sequences=sequences, cache=model_kwargs["cache"])
