"""Pure helpers on string nodes: read literal values, swap 'cuda' for 'tpu' in device strings."""

from __future__ import annotations

import libcst as cst

from tputool.codemods.python.tables import CUDA_DEVICE_RE


def literal(node: cst.CSTNode) -> str | None:
    """The value of a plain (non-f, non-bytes) string literal, else None."""
    if isinstance(node, cst.SimpleString):
        prefix = node.prefix.lower()
        if "b" in prefix:
            return None
        try:
            value = node.evaluated_value
        except Exception:  # noqa: BLE001 - odd escapes: treat as not a literal
            return None
        return value if isinstance(value, str) else None
    return None


def with_value(node: cst.SimpleString, new_text: str) -> cst.SimpleString:
    """The same literal (prefix and quotes kept) holding `new_text`; only simple contents are rewritten."""
    prefix = node.prefix
    quote = node.quote
    return node.with_changes(value=f"{prefix}{quote}{new_text}{quote}")


def replace_prefix(node: cst.SimpleString, old: str, new: str) -> cst.SimpleString | None:
    """Swap a leading `old` for `new` inside the literal's raw text, or None when it does not start so."""
    raw = node.raw_value
    if not raw.startswith(old):
        return None
    return with_value(node, new + raw[len(old):])


def is_cuda_device(node: cst.CSTNode) -> bool:
    """True for a literal "cuda" / "cuda:N"."""
    v = literal(node)
    return v is not None and CUDA_DEVICE_RE.match(v) is not None


def tpu_device_expr(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """A device expression with CUDA swapped for TPU, or None when it holds no CUDA device string.

    Handles literals, conditional expressions, f-strings, `"cuda:{}".format(i)`, `"cuda:%d" % i`
    and `"cuda:" + str(i)`.
    """
    if isinstance(node, cst.SimpleString):
        return replace_prefix(node, "cuda", "tpu") if is_cuda_device(node) else None
    if isinstance(node, cst.IfExp):
        if _mentions_cuda_string(node.test):
            return None  # `'cuda' if 'cuda' in d else 'cpu'`: TPU109 rewrites the check first (unsafe), then this
        body = tpu_device_expr(node.body)
        orelse = tpu_device_expr(node.orelse)
        if body is None and orelse is None:
            return None
        return node.with_changes(body=body or node.body, orelse=orelse or node.orelse)
    dyn = tpu_dynamic_string(node)
    return dyn


def tpu_dynamic_string(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """A dynamically built 'cuda:<n>' string rewritten to 'tpu:<n>', or None."""
    if isinstance(node, cst.FormattedString) and node.parts:
        first = node.parts[0]
        text = first.value if isinstance(first, cst.FormattedStringText) else ""
        whole = text == "cuda" and len(node.parts) == 1  # f"cuda": an f-string with no field
        if (text.startswith("cuda:") or whole) and "b" not in node.prefix.lower():
            new_first = first.with_changes(value="tpu" + first.value[len("cuda"):])
            return node.with_changes(parts=[new_first, *node.parts[1:]])
        return None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo | cst.Add):
        left = node.left
        v = literal(left)
        if isinstance(left, cst.SimpleString) and v is not None and v.startswith("cuda:") \
                and (isinstance(node.operator, cst.Modulo) or v == "cuda:"):
            new_left = replace_prefix(left, "cuda:", "tpu:")
            return node.with_changes(left=new_left) if new_left is not None else None
        return None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format":
        recv = node.func.value
        v = literal(recv)
        if isinstance(recv, cst.SimpleString) and v is not None and v.startswith("cuda:"):
            new_recv = replace_prefix(recv, "cuda:", "tpu:")
            if new_recv is not None:
                return node.with_changes(func=node.func.with_changes(value=new_recv))
    return None


def _mentions_cuda_string(node: cst.CSTNode) -> bool:
    """True when a 'cuda' / 'cuda:N' / 'cuda:' string literal occurs anywhere under node."""
    import libcst.matchers as m

    for lit in m.findall(node, m.SimpleString()):
        v = literal(lit)
        if v is not None and (v == "cuda:" or CUDA_DEVICE_RE.match(v)):
            return True
    return False
