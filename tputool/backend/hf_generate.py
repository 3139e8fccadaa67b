"""Hugging Face `generate()` on tpu: a static KV cache unless the caller chose a cache.

With HF's default (dynamic) cache the key/value tensors grow by one position per token, so every op of every
decoding step has a new shape and compiles a new XLA program: the first 32 tokens of a 2-layer model take tens of
seconds. A static cache keeps one shape for the whole generation (HF then also compiles the decoding step, as it
does on CUDA with a static cache). Greedy and sampled outputs are the same with either cache: this changes
speed, not results. The caller's own `cache_implementation=`, a `cache=` object or `use_cache=False` win;
`TPUTOOL_HF_STATIC_CACHE=0` turns the default off.

Nothing here imports transformers: the patch is applied when `transformers.generation.utils` is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

ENV = "TPUTOOL_HF_STATIC_CACHE"
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
        return original(self, generation_config, model_kwargs, *args, **kwargs)

    _prepare_cache_for_generation._tputool = True
    _prepare_cache_for_generation.__wrapped__ = original
    cls._prepare_cache_for_generation = _prepare_cache_for_generation


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
