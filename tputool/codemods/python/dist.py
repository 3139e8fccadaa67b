"""TPU4xx/TPU5xx call handlers: process groups, DDP, torch.compile, optimizers and Hugging Face arguments."""

from __future__ import annotations

import libcst as cst

from tputool.codemods.python.context import PortBase, keyword_args
from tputool.codemods.python.device import _commas, availability_test
from tputool.codemods.python.strings import literal, replace_prefix, tpu_device_expr
from tputool.codemods.python.tables import (
    COMPILE_INDUCTOR_KWARGS,
    DDP_QNAMES,
    INIT_PROCESS_GROUP,
    OPTIMIZER_NAMES,
)
from tputool.rules.port import FUSED_ON_TPU


def _nccl_to_tpu(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """'nccl' -> 'tpu' in a literal or either branch of a conditional."""
    if literal(node) == "nccl":
        return replace_prefix(node, "nccl", "tpu")
    if isinstance(node, cst.IfExp):
        b, o = _nccl_to_tpu(node.body), _nccl_to_tpu(node.orelse)
        if b is None and o is None:
            return None
        return node.with_changes(body=b or node.body, orelse=o or node.orelse)
    return None


def backend_args(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU406: init_process_group("nccl") and backend="nccl" on any call."""
    if q is None and isinstance(upd.func, cst.Name | cst.Attribute):
        last = upd.func.value if isinstance(upd.func, cst.Name) else upd.func.attr.value
        if last == "init_process_group":
            q = "torch.distributed.init_process_group"  # `dist` imported somewhere we cannot see
    args = list(upd.args)
    changed = False
    for i, a in enumerate(args):
        is_backend = (a.keyword is not None and a.keyword.value == "backend") or (
            a.keyword is None and i == 0 and q in INIT_PROCESS_GROUP)
        if not is_backend:
            continue
        new = _nccl_to_tpu(a.value)
        if new is not None and t.fire("TPU406", t.at(orig, upd, i)):
            args[i] = a.with_changes(value=new)
            changed = True
    return upd.with_changes(args=args) if changed else upd


def ddp(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU409: DDP(device_ids=..., output_device=...); unsafe fix drops both."""
    if q not in DDP_QNAMES:
        return upd
    drop = [i for i, a in enumerate(upd.args) if a.keyword is not None
            and a.keyword.value in ("device_ids", "output_device")]
    if not drop or not t.fire("TPU409", orig):
        return upd
    return upd.with_changes(args=_commas([a for i, a in enumerate(upd.args) if i not in drop]))


def compile_call(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU415 torch.compile(...) gets backend="tpu"; TPU416 Inductor options= dropped (mode= stays)."""
    if q != "torch.compile" or any(a.star for a in upd.args):
        return upd
    args = list(upd.args)
    b = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "backend"), None)
    if b is None:
        if t.fire("TPU415", orig):
            args.append(cst.Arg(keyword=cst.Name("backend"), value=cst.SimpleString('"tpu"'),
                                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                      whitespace_after=cst.SimpleWhitespace(""))))
            args = _commas(args)
    elif literal(args[b].value) == "inductor" and t.fire("TPU415", orig):
        args[b] = args[b].with_changes(value=replace_prefix(args[b].value, "inductor", "tpu"))
    drop = [i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value in COMPILE_INDUCTOR_KWARGS]
    if drop and t.fire("TPU416", orig):
        args = _commas([a for i, a in enumerate(args) if i not in drop])
    return upd.with_changes(args=args)


def fused_optimizer(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU418: torch.optim.X(..., fused=True) for an X the tpu device has no fused step for (FUSED_ON_TPU runs
    fused); the unsafe fix drops a literal True."""
    name = q.rsplit(".", 1)[-1] if q else (upd.func.value if isinstance(upd.func, cst.Name) else None)
    if not ((q and q.startswith("torch.optim.")) or name in OPTIMIZER_NAMES) or name in FUSED_ON_TPU:
        return upd
    idx = next((i for i, a in enumerate(upd.args) if a.keyword is not None and a.keyword.value == "fused"), None)
    if idx is None:
        return upd
    v = upd.args[idx].value
    if isinstance(v, cst.Name) and v.value in ("False", "None"):
        return upd
    literal_true = isinstance(v, cst.Name) and v.value == "True"
    if t.fire("TPU418", t.at(orig, upd, idx), fixable=literal_true) and literal_true:
        return upd.with_changes(args=_commas([a for i, a in enumerate(upd.args) if i != idx]))
    return upd


_HOST_PLACES = frozenset({"cpu", "disk", "meta"})


def _host_placement(value: cst.BaseExpression) -> bool:
    """True for a device_map that places everything off the accelerator on purpose (`"cpu"`, `{"": "cpu"}`,
    `{"model": "cpu", "lm_head": "disk"}`): nothing there names a CUDA device, so TPU115 has nothing to say."""
    if isinstance(value, cst.Dict):
        vals = [literal(e.value) for e in value.elements if isinstance(e, cst.DictElement)]
        return bool(vals) and len(vals) == len(value.elements) and all(v in _HOST_PLACES for v in vals)
    return literal(value) in _HOST_PLACES


def hf_kwargs(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU115 device_map/max_memory, TPU509 load_in_8bit/4bit, TPU507 flash attention, TPU414 use_cuda."""
    args = list(upd.args)
    changed = False
    for i, a, kw in keyword_args(args):
        true = isinstance(a.value, cst.Name) and a.value.value == "True"
        if kw in ("device_map", "max_memory") and not (isinstance(a.value, cst.Name) and a.value.value == "None") \
                and not (kw == "device_map" and _host_placement(a.value)):
            new = tpu_device_expr(a.value) if kw == "device_map" else None
            note = "device_map needs the accelerate package: pip install 'tputool[hf]'"
            if t.fire("TPU115", t.at(orig, upd, i), fixable=new is not None, note=note) and new is not None:
                args[i] = a.with_changes(value=new)
                changed = True
        elif kw in ("load_in_8bit", "load_in_4bit") and true:
            t.fire("TPU509", t.at(orig, upd, i))
        elif kw == "use_flash_attention_2" and true:
            t.fire("TPU507", t.at(orig, upd, i), fixable=False)
        elif kw == "attn_implementation" and literal(a.value) in ("flash_attention_2", "flash_attention_3"):
            if t.fire("TPU507", t.at(orig, upd, i)):
                args[i] = a.with_changes(value=cst.SimpleString('"sdpa"'))
                changed = True
        elif kw == "use_cuda" and true:
            t.fire("TPU414", t.at(orig, upd, i))
    return upd.with_changes(args=args) if changed else upd


def backend_assign(t: PortBase, orig: cst.Assign, upd: cst.Assign) -> cst.BaseSmallStatement:
    """backend = "nccl" (TPU406, a config default) or = "nccl" if ... else "gloo" (TPU407, unsafe fix)."""
    names = [x.target.value for x in upd.targets if isinstance(x.target, cst.Name)]
    names += [x.target.attr.value for x in upd.targets if isinstance(x.target, cst.Attribute)]
    if not any("backend" in n.lower() for n in names):
        return upd
    new = _nccl_to_tpu(upd.value)
    code = "TPU406" if isinstance(upd.value, cst.SimpleString) else "TPU407"
    # `"nccl" if torch.cuda.is_available() else "gloo"` moves with the availability test (TPU201): safe.
    safe = True if isinstance(orig.value, cst.IfExp) and availability_test(t, orig.value.test) else None
    if new is None or not t.fire(code, orig, safe=safe):
        return upd
    return upd.with_changes(value=new)


def ds_config(t: PortBase, orig: cst.Dict, upd: cst.BaseExpression) -> cst.BaseExpression:
    """TPU511: a DeepSpeed-style {"fp16": {"enabled": True}} config in Python (findings only: `upd` comes back)."""
    for e in orig.elements:
        if isinstance(e, cst.DictElement) and literal(e.key) == "fp16" and isinstance(e.value, cst.Dict):
            for inner in e.value.elements:
                if isinstance(inner, cst.DictElement) and literal(inner.key) == "enabled" \
                        and isinstance(inner.value, cst.Name) and inner.value.value == "True":
                    t.fire("TPU511", e, message='DeepSpeed fp16 config: TPU needs bf16 ("bf16": {"enabled": '
                                                "true}) and a TorchTPU DeepSpeed accelerator")
    return upd
