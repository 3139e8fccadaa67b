"""Keep tied parameters tied across `module.to("tpu")`.

For CUDA, `Module._apply` moves each parameter in place (`param.data = ...`), so a Parameter shared by two
modules (a tied LM head) stays one object. For a PrivateUse1 device PyTorch cannot do that and builds one
new Parameter per module slot, silently untying the weights. `install()` wraps `Module._apply` so that,
after a conversion, every slot that held one shared Parameter holds the same new one again.
"""

from __future__ import annotations

import threading

import torch

_local = threading.local()
_installed = False


def _shared_slots(module: torch.nn.Module) -> list[list[tuple[torch.nn.Module, str]]]:
    slots: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for m in module.modules():
        for name, p in m._parameters.items():
            if p is not None:
                slots.setdefault(id(p), []).append((m, name))
    return [s for s in slots.values() if len(s) > 1]


def install() -> None:
    """Wrap torch.nn.Module._apply once (idempotent)."""
    global _installed
    if _installed:
        return
    original = torch.nn.Module._apply

    def _apply(self, fn, recurse=True):
        if getattr(_local, "active", False):
            return original(self, fn, recurse)
        groups = _shared_slots(self)
        _local.active = True
        try:
            out = original(self, fn, recurse)
        finally:
            _local.active = False
        for group in groups:
            first_mod, first_name = group[0]
            keep = first_mod._parameters[first_name]
            for m, name in group[1:]:
                if m._parameters[name] is not keep:
                    m._parameters[name] = keep
        return out

    _apply.__wrapped__ = original
    torch.nn.Module._apply = _apply
    _installed = True
