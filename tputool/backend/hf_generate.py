"""Hugging Face `generate()` on tpu: a static KV cache unless the caller chose a cache.

With HF's default (dynamic) cache the key/value tensors grow by one position per token, so every op of every
decoding step has a new shape and compiles a new XLA program: the first 32 tokens of a 2-layer model take tens of
seconds. A static cache keeps one shape for the whole generation (HF then also compiles the decoding step, as it
does on CUDA with a static cache). Greedy and sampled outputs are the same with either cache: this changes
speed, not results. The caller's own `cache_implementation=`, a `cache=` object or `use_cache=False` win;
`TPUTOOL_HF_STATIC_CACHE=0` turns the default off.
With that static cache, greedy and sampled decoding runs `hf_decode.decode`: HF's loop with the glue between two
steps kept at one shape (HF's grows the ids, positions and mask by one position per token: a new program each).

The static cache chosen here is sized to a bucket (`cache_bucket`: the next power of two of `max_length`, at least
`MIN_BUCKET`, at most the model's `max_position_embeddings` unless `max_length` is longer), not to each call's own
`max_length`: HF sizes it to the longest call so far, so every longer prompt or larger `max_new_tokens` gave the
decoding step new shapes, a Dynamo recompile (with symbolic shapes) and a new XLA program. With buckets, calls whose
`max_length` falls in one bucket share one compiled decoding step. The positions past a call's length are masked
out of attention, as HF's own `max_cache_len=` does. A caller's `max_cache_len=` is kept.

Nothing here imports transformers: the patch is applied when `transformers.generation.utils` is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

ENV = "TPUTOOL_HF_STATIC_CACHE"
MIN_BUCKET = 64
"""The smallest static cache length chosen for a tpu generate() (smaller lengths round up to it)."""
_MODULE = "transformers.generation.utils"


def install() -> None:
    """Patch HF's cache choice now if transformers is loaded, else when it is (idempotent)."""
    if os.environ.get(ENV, "1") == "0":
        return
    after_import(_MODULE, _patch)


def after_import(name: str, patch) -> None:
    """Run `patch(module)` on module `name` now if it is loaded, else right after it is first imported (once per
    name; `patch` must be idempotent)."""
    mod = sys.modules.get(name)
    if mod is not None:
        patch(mod)
    elif not any(isinstance(f, _Finder) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, patch))


def _patch(mod) -> None:
    cls = getattr(mod, "GenerationMixin", None)
    original = getattr(cls, "_prepare_cache_for_generation", None)
    if original is None or getattr(original, "_tputool", False):
        return

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        if (generation_config.cache_implementation is None and model_kwargs.get("cache") is None
                and generation_config.use_cache is not False and getattr(self, "device", None) is not None
                and self.device.type == "tpu" and not self.config.is_encoder_decoder):
            generation_config.cache_implementation = "static"  # this call's copy of the config
            # (a transformers without the `max_cache_len` field sizes the cache per call, as before)
            if (hasattr(generation_config, "max_cache_len") and generation_config.max_cache_len is None
                    and generation_config.max_length is not None):
                limit = getattr(self.config.get_text_config(decoder=True), "max_position_embeddings", None)
                generation_config.max_cache_len = cache_bucket(generation_config.max_length, limit)
        return original(self, generation_config, model_kwargs, *args, **kwargs)

    _prepare_cache_for_generation._tputool = True
    _prepare_cache_for_generation.__wrapped__ = original
    cls._prepare_cache_for_generation = _prepare_cache_for_generation
    _patch_sample(cls)


def _patch_sample(cls) -> None:
    """Greedy and sampled decoding on tpu through `hf_decode.decode` (one shape per step) where it is eligible."""
    original = getattr(cls, "_sample", None)
    if original is None or getattr(original, "_tputool", False):
        return

    def _sample(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                streamer=None, **model_kwargs):
        from tputool.backend import hf_decode

        if hf_decode.eligible(self, cls, input_ids, stopping_criteria, generation_config, synced_gpus, model_kwargs):
            return hf_decode.decode(self, input_ids, logits_processor, stopping_criteria, generation_config,
                                    streamer, **model_kwargs)
        return original(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                        streamer, **model_kwargs)

    _sample._tputool = True
    _sample.__wrapped__ = original
    cls._sample = _sample


def cache_bucket(max_length: int, limit: int | None = None) -> int:
    """The static KV cache length for a generation of `max_length` tokens: the next power of two, at least
    MIN_BUCKET, capped at `limit` (the model's positions) unless `max_length` itself is longer."""
    bucket = max(MIN_BUCKET, 1 << max(0, int(max_length) - 1).bit_length())
    if limit is not None and limit > 0:
        bucket = min(bucket, max(int(limit), int(max_length)))
    return max(bucket, int(max_length))


class _Finder(importlib.abc.MetaPathFinder):
    """Runs `patch` right after module `name` executes."""

    def __init__(self, name: str, patch) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self.patch)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, patch) -> None:
        self.inner, self.patch = inner, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.patch(module)
