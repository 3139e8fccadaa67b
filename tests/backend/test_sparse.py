"""Sparse COO tensors move to tpu and compute as on CPU (every eager mode).

Before: `model.to("tpu")` of Whisper (its `alignment_heads` buffer is `to_sparse()`) raised the dispatcher's
"Could not run 'aten::_sparse_coo_tensor_with_dims_and_tensors' with arguments from the 'Sparsetpu' backend".
"""

from __future__ import annotations

import pytest
import torch


def _uncoalesced() -> torch.Tensor:
    i = torch.tensor([[0, 1, 1, 0, 2], [2, 0, 0, 2, 1]])
    return torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0, 3.0, 4.0, -1.5]), (3, 3), check_invariants=False)


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    """`a` (from tpu) is `b` (CPU): same layout, and for sparse the same indices, values and coalesced flag."""
    a = a.cpu()
    assert a.layout == b.layout and a.shape == b.shape and a.dtype == b.dtype
    if b.is_sparse:
        assert a.is_coalesced() == b.is_coalesced()
        torch.testing.assert_close(a._indices(), b._indices(), rtol=0, atol=0)
        torch.testing.assert_close(a._values(), b._values())
    else:
        torch.testing.assert_close(a, b)


CASES = {
    "move": lambda s: s,
    "coalesce": lambda s: s.coalesce(),
    "to_dense": lambda s: s.to_dense(),
    "clone": lambda s: s.clone(),
    "dtype": lambda s: s.to(torch.float64),
    "sparse_mm": lambda s: torch.sparse.mm(s, torch.arange(12.0).reshape(3, 4).to(s.device)),
    "mm": lambda s: s.coalesce() @ torch.arange(6.0).reshape(3, 2).to(s.device),
    "addmm": lambda s: torch.addmm(torch.ones(3, 2, device=s.device), s, torch.ones(3, 2, device=s.device),
                                   beta=0.5, alpha=2.0),
    "indices": lambda s: s.coalesce().indices(),
    "values": lambda s: s.coalesce().values(),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sparse_ops_on_tpu_match_cpu(mode, case):
    fn = CASES[case]
    _same(fn(_uncoalesced().to("tpu")), fn(_uncoalesced()))


@pytest.mark.parametrize("dense_dim", [0, 1])
def test_dense_to_sparse_and_back(mode, dense_dim):
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    sparse_dim = 2 - dense_dim
    _same(x.to("tpu").to_sparse(sparse_dim), x.to_sparse(sparse_dim))
    _same(x.to_sparse(sparse_dim).to("tpu").to_dense(), x)


def test_bool_sparse_buffer_of_a_module_moves_with_it(mode):
    """Whisper's pattern: a non-persistent sparse bool buffer; `.to("tpu")` moves it, `.indices()` reads it."""
    m = torch.nn.Module()
    heads = torch.zeros(4, 6, dtype=torch.bool)
    heads[2:, 3:] = True
    m.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)
    m.to("tpu")
    assert m.alignment_heads.device.type == "tpu" and m.alignment_heads.is_sparse
    torch.testing.assert_close(m.alignment_heads.indices().T.cpu(), heads.nonzero())
    assert torch.equal(m.alignment_heads.to_dense().cpu(), heads)
    assert "nnz=6" in repr(m.alignment_heads) and "tpu" in repr(m.alignment_heads)
    m.cpu()
    assert m.alignment_heads.device.type == "cpu" and torch.equal(m.alignment_heads.to_dense(), heads)


def test_other_ops_run_on_cpu_as_every_fallback_and_in_place_ones_fail_in_one_line(tpu_device, monkeypatch):
    s, ref = _uncoalesced().to("tpu"), _uncoalesced()
    with pytest.warns(RuntimeWarning, match="no tpu kernel for sparse tensors; it runs on CPU"):
        total = s + s
    _same(total, ref + ref)
    _same(s.t(), ref.t())
    _same(torch.sparse.sum(s, 1), torch.sparse.sum(ref, 1))
    with pytest.raises(RuntimeError, match="Cannot get indices on an uncoalesced tensor"):
        s.indices()
    with pytest.raises(NotImplementedError, match=r"aten::mul_.Tensor \(in place\) is not supported for sparse COO "
                                                  r"tensors on tpu; call .to_dense\(\) first"):
        s.mul_(2)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        s @ torch.ones(2, 2, device="tpu")
    monkeypatch.setenv("TPUTOOL_FALLBACK", "error")
    with pytest.raises(NotImplementedError, match="TPUTOOL_FALLBACK=error"):
        s * 3


def test_pending_values_of_fused_mode_are_computed_before_a_sparse_op_reads_them(tpu_device):
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    try:
        v = torch.arange(5.0, device="tpu") * 2 + 1  # pending in the trace
        i = torch.tensor([[0, 1, 1, 0, 2], [2, 0, 0, 2, 1]], device="tpu")
        s = torch.sparse_coo_tensor(i, v, (3, 3), check_invariants=False)
        ref = torch.sparse_coo_tensor(i.cpu(), torch.arange(5.0) * 2 + 1, (3, 3))
        _same(s.to_dense(), ref.to_dense())
        _same(s.coalesce(), ref.coalesce())
        w = torch.ones(3, 2, device="tpu") * 3  # pending dense operand
        _same(torch.addmm(w, s, w), torch.addmm(torch.full((3, 2), 3.0), ref, torch.full((3, 2), 3.0)))
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)


def test_deepcopy_save_and_load_of_a_tpu_sparse_tensor(tpu_device, tmp_path):
    """`copy.deepcopy(model)` (parity's replay copies modules) and `torch.save` of a model with a sparse buffer."""
    import copy

    s = _uncoalesced().to("tpu")
    m = torch.nn.Module()
    m.register_buffer("heads", s)
    _same(copy.deepcopy(m).heads, _uncoalesced())
    torch.save(m.state_dict(), tmp_path / "m.pt")
    _same(torch.load(tmp_path / "m.pt")["heads"], _uncoalesced())
    assert torch.load(tmp_path / "m.pt", map_location="cpu")["heads"].device.type == "cpu"
