"""Data for the OpInfo sweep (tests/backend/test_opinfo.py): op groups, the CI slice, tolerances.

Keys are OpInfo names with the variant after a dot, e.g. "div.no_rounding_mode".
"""

from __future__ import annotations

import torch

DISTRIBUTION_OPS = frozenset({
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal", "normal.in_place",
    "normal.number_mean", "uniform", "rand_like", "randn", "randn_like", "randint", "randint_like",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train", "nn.functional.rrelu",
})
"""Random ops: compared by shape, dtype, support (below) and, for >= 100 values, location and spread."""

NONNEGATIVE_OPS = frozenset({"bernoulli", "exponential", "geometric", "log_normal", "multinomial"})
UNIT_INTERVAL_OPS = frozenset({"bernoulli"})
INTEGRAL_OPS = frozenset({"bernoulli", "geometric", "multinomial", "randint", "randint_like"})
"""Support of the distribution, checked on every value: >= 0, within [0, 1], whole numbers.
(op_db's "rand_like" OpInfo calls torch.randn_like, so it is not listed.)"""

HEAVY_TAILED_OPS = frozenset({"cauchy"})
"""Distributions without a mean: compared by median and interquartile range instead of mean and std."""

RANDOM_SAMPLE_KWARGS = ("dropout_p",)
RANDOM_SAMPLE_ARGS = {"nn.functional.multi_head_attention_forward": 9}
"""A sample passing one of these kwargs, or the op's positional dropout argument at this index, > 0 (and not
training=False) is random: shape and dtype only."""

FIRST_OUTPUT_ONLY_OPS = {
    "native_batch_norm": "saved mean/invstd are device-specific in eval mode (empty on CPU)",
    "_native_batch_norm_legit": "saved mean/invstd are device-specific in eval mode (empty on CPU)",
}
"""Ops whose secondary outputs are device-specific (PyTorch's own test_compare_cpu expects them to differ):
only the first output is compared forward; backward is compared as usual."""

CPU_ARGS_OPS = frozenset({"tensor_split"})
"""Ops whose tensor arguments (not the input) must stay on CPU, as PyTorch requires: only the input moves."""

TIE_INDEX_OPS = frozenset({
    "sort", "argsort", "topk", "kthvalue", "mode", "median", "nanmedian", "max.reduction_with_dim",
    "min.reduction_with_dim", "cummax", "cummin",
})
"""Ops whose returned indices among equal input values are implementation-defined (unless `stable=True`):
on an input with repeated values only the values are compared, and backward (which follows the indices)
is not."""

SHAPE_ONLY_OPS = {
    "empty": "values of torch.empty are undefined",
    "empty_like": "values of torch.empty_like are undefined",
    "empty_strided": "values of torch.empty_strided are undefined",
    "empty_permuted": "values of torch.empty_permuted are undefined",
    "new_empty": "values of Tensor.new_empty are undefined",
    "new_empty_strided": "values of Tensor.new_empty_strided are undefined",
    "svd_lowrank": "randomised algorithm: the result depends on the random projection",
    "pca_lowrank": "randomised algorithm: the result depends on the random projection",
    "nn.functional.fractional_max_pool2d": "pooling regions are drawn at random",
    "nn.functional.fractional_max_pool3d": "pooling regions are drawn at random",
}
"""Ops whose values are undefined or random in a way no distribution test captures: shape and dtype only."""

SKIP_OPS = {
    "to_sparse": "sparse tensors are unsupported on tpu",
    "sparse.sampled_addmm": "sparse tensors are unsupported on tpu",
    "sparse.mm.reduce": "sparse tensors are unsupported on tpu",
    "as_strided.partial_views": "results over partially overlapping views are implementation-defined "
                                "(PyTorch's own device-vs-CPU test expects it to differ)",
}
"""Ops not run at all, with the reason shown to the user."""

SKIP_PREFIXES = {
    "jiterator_": "jiterator ops are CUDA-only (they raise on CPU too)",
}
"""Families of ops not run at all, by name prefix."""

CI_SLICE = (
    # elementwise unary
    "abs", "neg", "exp", "log", "sqrt", "rsqrt", "sin", "tanh", "sigmoid", "nn.functional.relu",
    "nn.functional.gelu", "nn.functional.silu",
    # elementwise binary / comparison
    "add", "sub", "mul", "div.no_rounding_mode", "pow", "maximum", "eq", "lt", "clamp",
    # reductions
    "sum", "mean", "amax", "argmax", "var", "prod", "logsumexp",
    # matmul / linear / conv
    "matmul", "mm", "bmm", "addmm", "einsum", "nn.functional.linear", "nn.functional.conv2d",
    # indexing / gather / scatter
    "index_select", "gather", "scatter_add", "index_put", "take_along_dim", "__getitem__",
    # where / masked
    "where", "masked_fill", "masked_select",
    # shape / view
    "reshape", "view", "permute", "transpose", "expand", "squeeze", "unsqueeze", "flatten", "narrow", "split",
    "cat", "stack",
    # normalisation / softmax / losses / nn
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.embedding",
    "nn.functional.cross_entropy", "nn.functional.mse_loss", "nn.functional.scaled_dot_product_attention",
    "nn.functional.max_pool2d",
    # scans / sorting
    "cumsum", "sort", "topk",
    # factories and random
    "zeros", "arange", "empty_like", "rand_like", "normal", "bernoulli", "nn.functional.dropout",
)
"""The representative slice CI runs (not marked slow)."""

CI_SLICE_EXTRA_DTYPES = frozenset({
    "add", "mul", "sub", "eq", "lt", "maximum", "sum", "amax", "cumsum", "sort", "where", "cat", "stack",
    "index_select", "gather", "reshape", "permute", "masked_fill", "zeros", "arange",
})
"""Slice ops also checked with int64 and bool (where the op supports them) in CI."""

SWEEP_DTYPES = (torch.float32, torch.int64, torch.bool)
"""Dtypes of the sweep; backward is checked for float32 only."""

FORWARD_TOL = {"atol": 1e-4, "rtol": 1e-4}
BACKWARD_TOL = {"atol": 1e-3, "rtol": 1e-3}
"""float32 tolerances against CPU (raised per op by the OpInfo's own toleranceOverride decorators).
Backward matches the 1e-3 PyTorch's own device-vs-CPU OpInfo test (TestCommon.test_compare_cpu) uses;
forward is 10x tighter."""
