"""The one libcst transformer: it visits each node kind once and dispatches to the per-rule handlers."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import QualifiedNameProvider

from tputool.codemods.python import amp, api, device, dist, perf
from tputool.codemods.python.context import PortBase
from tputool.codemods.python.imports import import_findings

# Call handlers run in this order on every call (each may return a new node for the next).
CALL_HANDLERS = (
    api.owned_elsewhere,
    device.format_call,
    device.cuda_method,
    device.to_call,
    device.torch_device,
    device.set_device_arg,
    device.device_kwargs,
    device.lookup_default,
    device.argparse_call,
    device.startswith_check,
    amp.cuda_autocast,
    amp.generic_autocast,
    amp.grad_scaler,
    amp.custom_fwd_call,
    amp.precision_methods,
    amp.dtype_kwargs,
    dist.backend_args,
    dist.ddp,
    dist.compile_call,
    dist.fused_optimizer,
    dist.hf_kwargs,
    perf.call_lints,
    api.bf16_supported,  # last: it may replace the call by `True`
)


class _Rules(PortBase):
    """Rewrites CUDA-specific code for TPU and records findings (see tputool/rules/port.py).

    Never instantiated itself: libcst caches metadata dependencies per class and a subclass would inherit
    its parent's cache, so the two concrete transformers below are siblings.
    """

    def visit_Import(self, node: cst.Import) -> bool:
        import_findings(self, node)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        import_findings(self, node)
        return False

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        new = device.is_cuda_attr(self, original_node, updated_node)
        if new is not updated_node:
            return new
        return api.reference(self, original_node, updated_node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return api.reference(self, original_node, updated_node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        q = self.call_qname(original_node)
        node: cst.BaseExpression = updated_node
        for handler in CALL_HANDLERS:
            if not isinstance(node, cst.Call):
                break
            node = handler(self, original_node, node, q)
        return node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        device.own_cuda_method(self, node)
        return True

    def leave_Decorator(self, original_node: cst.Decorator, updated_node: cst.Decorator) -> cst.Decorator:
        return amp.decorator(self, original_node, updated_node)

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString
                           ) -> cst.BaseExpression:
        api.string_literal(self, original_node)
        return updated_node

    def leave_FormattedString(self, original_node: cst.FormattedString, updated_node: cst.FormattedString
                              ) -> cst.BaseExpression:
        return device.dynamic_string(self, original_node, updated_node)

    def leave_BinaryOperation(self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation
                              ) -> cst.BaseExpression:
        device.modulo_device_count(self, original_node, updated_node)
        return device.dynamic_string(self, original_node, updated_node)

    def leave_BooleanOperation(self, original_node: cst.BooleanOperation, updated_node: cst.BooleanOperation
                               ) -> cst.BaseExpression:
        return api.and_true(self, original_node, updated_node)

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        return device.ifexp(self, original_node, updated_node)

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison
                         ) -> cst.BaseExpression:
        return device.comparison(self, original_node, updated_node)

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.BaseSmallStatement:
        perf.assign_lints(self, original_node)
        node = device.assign_default(self, original_node, updated_node)
        return dist.backend_assign(self, original_node, node)

    def leave_AnnAssign(self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign
                        ) -> cst.BaseSmallStatement:
        perf.assign_lints(self, original_node)
        return device.assign_default(self, original_node, updated_node)

    def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
        return device.param_default(self, original_node, updated_node)

    def leave_Tuple(self, original_node: cst.Tuple, updated_node: cst.Tuple) -> cst.BaseExpression:
        return device.sequence_devices(self, original_node, updated_node)

    def leave_List(self, original_node: cst.List, updated_node: cst.List) -> cst.BaseExpression:
        return device.sequence_devices(self, original_node, updated_node)

    def leave_Set(self, original_node: cst.Set, updated_node: cst.Set) -> cst.BaseExpression:
        return device.sequence_devices(self, original_node, updated_node)

    def leave_Dict(self, original_node: cst.Dict, updated_node: cst.Dict) -> cst.BaseExpression:
        dist.ds_config(self, original_node)
        perf.dict_lints(self, original_node)
        return device.dict_default(self, original_node, updated_node)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine):
        body = api.statements(self, original_node.body, updated_node.body)
        if body is None:
            return updated_node
        if not body:
            placeholder = updated_node.with_changes(body=[cst.Pass()])
            self.removed_lines[id(placeholder)] = placeholder  # kept alive so its id is never reused
            return placeholder
        return updated_node.with_changes(body=body)

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite,
                                   updated_node: cst.SimpleStatementSuite) -> cst.SimpleStatementSuite:
        body = api.statements(self, original_node.body, updated_node.body)
        if body is None:
            return updated_node
        return updated_node.with_changes(body=body or [cst.Pass()])

    def _drop_removed(self, body):
        """The statements without removed-line placeholders, or None when there are none.

        The comment lines above a removed statement move to the next statement when it follows directly (they
        may describe it too); where a blank line or the block's end follows, they were about the removed
        statement and go with it, as does its own trailing comment.
        """
        if not any(id(s) in self.removed_lines for s in body):
            return None
        out, carry = [], []
        for s in body:
            if id(s) in self.removed_lines:
                carry += list(s.leading_lines)
                continue
            if carry:
                lead = list(s.leading_lines)
                if not (lead[:1] and lead[0].comment is None):  # follows directly: keep what was above
                    s = s.with_changes(leading_lines=[*carry, *lead])
                carry = []
            out.append(s)
        return out

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
                            ) -> cst.IndentedBlock:
        body = self._drop_removed(updated_node.body)
        if body is None and updated_node.body:
            return updated_node
        return updated_node.with_changes(body=body or [cst.SimpleStatementLine(body=[cst.Pass()])])

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._drop_removed(updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_With(self, original_node: cst.With, updated_node: cst.With):
        return api.with_unwrap(self, original_node, updated_node)


class PortTransformer(_Rules):
    """The rules, resolving names from the file's import index (no scope analysis needed)."""

    METADATA_DEPENDENCIES = ()


class ScopedPortTransformer(_Rules):
    """The same rules, resolving names with libcst scope analysis (files where imports are shadowed)."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)
