"""The attention math of both backbone families, as plain functions.

SOFT (TPAMI paper Eq. 5, Alg. 2, Eq. 16, Eq. 25):
    ``gaussian_kernel``      κ(a, b) = exp(-||a - b||² / 2) between two token sets
    ``kernel_features``      [a, |a|², -1/2] and [b, -1/2, |b|²]: κ = exp(min(â·b̂ᵀ, 0))
    ``kernel_matmul``        κ(q, l)·w or κ(q, l)ᵀ·w, κ recomputed in backward (not kept)
    ``kernel_attention``     κ(q, l)·f(l, κ(q, l)ᵀ·v): both products, one backward
    ``newton_pinv``          Moore–Penrose inverse by Newton–Raphson iteration, per matrix
    ``newton_pinv_apply``    A⁺·Z for a thin Z ('spectral' never forms A⁺)
    ``regularized_apply``    fast mode: a Tikhonov solve standing in for the iterate
    ``normalize_inverse``    attention normalization D^-1/2 A⁺ D^-1/2
    ``soft_attention``       P·Â·(Pᵀ·V) computed as P·(Â·(Pᵀ·V))
    ``official_order_attention``  the official order (P·Â)·(Pᵀ·V): the reference
    ``EXACT_PINV_METHODS``   the ways to compute the iterate (``newton.py``; 'spectral''s
                             eigendecomposition in ``spectral.py``, the step size α
                             ``newton_alpha`` in ``step_size.py``)

Which way runs (``dispatch.py``, as SDPA chooses a backend): each ``Variant`` declares
where it can run and why not (``not_supported_reasons``); ``select_variant`` takes the
first of the plan's list that can, and a forced one fails with its reasons.
    ``VARIANTS``             the inverse's variants: 'iterative' (the reference),
                             'spectral', 'tridiagonal', 'tf32', 'regularized'
    ``register_variant``     add one (packages outside the library: ``projects/``)

Per device (``plan.py``), read once per SOFT layer's forward and passed down:
    ``PLANS`` / ``plan_for`` the ``AttentionPlan`` of each device type: the variants 'auto'
                             tries, the chunks of P, the depthwise-conv layout
    ``attention_plan``       force choices for a block of code, in this thread
    ``pinv_methods``         what a layer's ``pinv_method`` may say ('auto' and the variants)

Dtypes (``dtypes.py``, both families): ``compute_dtype``, ``device_type``.

SimA (the SimA paper's attention):
    ``sima_attention``       L1-normalized q, k over tokens, no softmax

Shapes use B batch, h heads, N tokens, m landmarks, d head dim. Every function works on
any leading batch dimensions (``...``).
"""
from .dispatch import (KERNEL_PRODUCTS, VARIANTS, Inputs, KernelProducts, Variant,
                       VariantNotSupported, register_kernel_products, register_variant,
                       select_variant)
from .dtypes import compute_dtype, device_type
from .newton import (EXACT_PINV_METHODS, Products, newton_pinv, newton_pinv_apply,
                     newton_pinv_error, normalize_inverse, regularized_apply, round_tf32)
from .plan import (DEFAULT_PLAN, PINV_METHODS, PLANS, AttentionPlan, attention_plan, pinv_methods,
                   plan_for, resolve_pinv_method)
from .sima import sima_attention
from .soft import (gaussian_kernel, kernel_attention, kernel_features, kernel_matmul,
                   official_order_attention, soft_attention)
from .step_size import newton_alpha

__all__ = [
    'DEFAULT_PLAN', 'EXACT_PINV_METHODS', 'KERNEL_PRODUCTS', 'PINV_METHODS', 'PLANS', 'VARIANTS',
    'AttentionPlan', 'Inputs', 'KernelProducts', 'Products', 'Variant', 'VariantNotSupported',
    'attention_plan', 'compute_dtype', 'device_type', 'gaussian_kernel', 'kernel_attention',
    'kernel_features', 'kernel_matmul', 'newton_alpha', 'newton_pinv', 'newton_pinv_apply',
    'newton_pinv_error', 'normalize_inverse', 'official_order_attention', 'pinv_methods',
    'plan_for', 'regularized_apply', 'register_kernel_products', 'register_variant',
    'resolve_pinv_method', 'round_tf32', 'select_variant', 'sima_attention', 'soft_attention'
]
