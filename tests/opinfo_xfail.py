"""Expected failures of tests/test_opinfo.py, one line of reason each.

Keys: an OpInfo id (``name`` or ``name.variant``) fails in both modes; ``id@strict`` /
``id@defer`` in one mode; ``XFAIL_GRAD`` holds gradient-only failures and ``XFAIL_DTYPE``
``id@dtype`` entries for the non-float32 sweeps. The xfails are strict: an entry that
passes fails the run, so this list can only shrink.
"""

XFAIL = {
    # missing lowerings
    "_upsample_bilinear2d_aa": "no lowering: antialiased bilinear upsampling",
    "linalg.ldl_factor": "no lowering: JAX has no LDL (sytrf) factorization",
    "linalg.ldl_factor_ex": "no lowering: JAX has no LDL (sytrf) factorization",
    "linalg.ldl_solve": "no lowering: JAX has no LDL (sytrf) factorization",
    "linalg.lstsq": "no lowering: aten.linalg_lstsq has no meta kernel for its output shapes",
    "linalg.lstsq.grad_oriented": "no lowering: aten.linalg_lstsq has no meta kernel",
    "nn.functional.fractional_max_pool2d": "no lowering (and its samples come from the device RNG)",
    "nn.functional.fractional_max_pool3d": "no lowering (and its samples come from the device RNG)",
    "nn.functional.linear_cross_entropy.chunked": "no lowering for torch_nn._linear_cross_entropy_batch_chunked",
    "nn.functional.linear_cross_entropy.chunked_none": "no lowering for torch_nn._linear_cross_entropy_batch_chunked_no_reduction",
    "sparse.mm.reduce": "sparse tensors are not supported on tpu",
    "sparse.sampled_addmm": "sparse tensors are not supported on tpu",
    "to_sparse": "sparse tensors are not supported on tpu",
    "chalf": "complex32 is not a JAX dtype",
    "resize_": "resizing a tpu tensor to another shape is not supported",
    "resize_as_": "resizing a tpu tensor to another shape is not supported",
    # semantics that differ by design
    "_native_batch_norm_legit": "eval mode: CPU returns empty save_mean/save_invstd, PyTorch's meta kernel [C]; lazyrt follows meta",
    "native_batch_norm": "eval mode: CPU returns empty save_mean/save_invstd, PyTorch's meta kernel [C]; lazyrt follows meta",
    "svd_lowrank": "random projection drawn on the device: the tpu RNG stream differs from CPU's",
    "pca_lowrank": "random projection drawn on the device: the tpu RNG stream differs from CPU's",
    "linalg.eigh": "eigenvector signs differ between JAX's and PyTorch's LAPACK calls (eigenvalues match)",
    "matrix_exp": "JAX expm (Pade 13) vs PyTorch (Taylor 18): one element rel 2.6e-3 on an input with entries ~1e5",
    "as_strided.partial_views": "as_strided over a non-contiguous base storage layout",
    "tensor_split": "harness: moves the index tensor to tpu, and PyTorch requires it on the CPU",
}

XFAIL_GRAD = {
    "_segment_reduce.offsets": "no lowering: aten._segment_reduce_backward",
    "cdist": "no lowering: aten._cdist_backward",
    "grid_sampler_3d": "no lowering: aten.grid_sampler_3d_backward",
    "linalg.solve_ex": "gradient differs for a singular-ish sample (info != 0 path)",
    "nn.functional.ctc_loss": "no lowering: aten._ctc_loss_backward",
    "nn.functional.interpolate.bicubic": "no lowering: aten.upsample_bicubic2d_backward",
    "nn.functional.interpolate.bilinear": "no lowering: aten.upsample_bilinear2d_backward",
    "_segment_reduce.lengths": "no lowering: aten._segment_reduce_backward",
    "linalg.tensorsolve": "gradient differs (solve_ex backward on this sample)",
    "nn.functional.multilabel_margin_loss": "no lowering: aten.multilabel_margin_loss_backward",
    "nn.functional.pad.replicate": "no lowering: aten.replication_pad1d_backward",
    "nn.functional.pdist": "no lowering: aten._pdist_backward",
    "nn.functional.upsample_bilinear": "no lowering: aten.upsample_bilinear2d_backward",
    "masked_scatter": "no lowering: aten.masked_scatter_backward",
    "nn.functional.softshrink": "no lowering: aten.softshrink_backward",
    "nn.functional.hardshrink": "no lowering: aten.hardshrink_backward",
    "nn.functional.pad.replicate_negative": "no lowering: aten.replication_pad2d_backward",
    "nn.functional.interpolate.linear": "no lowering: aten.upsample_linear1d_backward",
    "nn.functional.interpolate.trilinear": "no lowering: aten.upsample_trilinear3d_backward",
    "nn.functional.multi_margin_loss": "no lowering: aten.multi_margin_loss_backward",
    "logcumsumexp": "gradient differs from CPU autograd on the first sample",
    "nn.functional.grid_sample": "no lowering: aten.grid_sampler_2d_backward",
    "grid_sampler_2d": "no lowering: aten.grid_sampler_2d_backward",
    "linalg.solve": "gradient differs for the first sample (solve_ex backward)",
    "to": "PyTorch autograd asserts on streams (opt_ready_stream) for this cross-device sample",
}

XFAIL_DTYPE: dict = {}

# Only with more samples than CI's default 2 (LAZYRT_OPINFO_SAMPLES=0 or > 2).
XFAIL_ALL_SAMPLES = {
    "nn.functional.scaled_dot_product_attention": "a sample uses dropout_p=0.5: the tpu RNG stream differs from CPU's",
    # Found by the all-samples sweep (LAZYRT_OPINFO_SAMPLES=0, 2026-11-29); present since
    # before that session's changes (checked at commit d7f2909). Each raises at the op or
    # differs in value on a later sample; none is reached by CI's first two samples.
    "addr": "a later sample's values differ from CPU",
    "linspace.tensor_overload": "start/end as CPU scalar tensors: copy across devices raises",
    "logspace.tensor_overload": "start/end as CPU scalar tensors: copy across devices raises",
    "masked_scatter": "a mask with fewer dims than the input: the lowering cannot broadcast it",
    "native_group_norm": "a zero-size sample: the lowering divides by zero",
    "nn.functional.group_norm": "a zero-size sample: the lowering divides by zero",
    "nn.functional.conv2d": "a padding sample with one value: the lowering passes one pad",
    "nn.functional.conv3d": "a padding sample with one value: the lowering passes one pad",
    "svd": "a later sample's singular vectors differ from CPU",
    "linalg.svd": "a later sample's singular vectors differ from CPU",
    "gather": "a 0-d index sample: index and input ranks differ in the lowering",
    "scatter": "a scatter.reduce sample: the lowering indexes past its argument list",
    "unique_consecutive": "a zero-size sample: the lowering reshapes size 0",
    "searchsorted": "an empty sorted sequence: the lowering divides by zero",
    "repeat_interleave": "no lowering for aten.repeat_interleave.Tensor (repeats as a tensor)",
}

# Gradients that fail only on a later sample (LAZYRT_OPINFO_GRAD_SAMPLES / _SAMPLES != 1).
XFAIL_GRAD_ALL_SAMPLES: dict = {}
