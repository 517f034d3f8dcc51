"""The attention math of both backbone families, as plain functions.

SOFT (SOFT, IJCV 2024: Eq. 5, Alg. 2, Eq. 25; the NeurIPS 2021 version's Eq. 16):
    ``gaussian_kernel``      κ(a, b) = exp(-||a - b||² / 2) between two token sets
    ``kernel_features``      [a, |a|², -1/2] and [b, -1/2, |b|²]: κ = exp(min(â·b̂ᵀ, 0))
    ``kernel_matmul``        κ(q, l)·w or κ(q, l)ᵀ·w, κ recomputed in backward (not kept)
    ``kernel_attention``     κ(q, l)·f(l, κ(q, l)ᵀ·v): both products, one backward
    ``soft_attention``       P·Â·(Pᵀ·V) computed as P·(Â·(Pᵀ·V))
    ``official_order_attention``  the official order (P·Â)·(Pᵀ·V) with the reference
                             iterate ``newton_pinv``: what every path is checked against
    ``newton_pinv``          the reference: the official Newton–Raphson iterate, formed
    ``newton_alpha``         its per-matrix step size
    ``normalize_inverse``    attention normalization D^-1/2 A⁺ D^-1/2

Which way computes A⁺·Z: a ``Variant`` computes it with its own options and declares
where it can run (``newton.py``: 'iterative', the reference, 'tf32' and the fast mode
'regularized'; ``spectral.py``: 'spectral', 'tridiagonal'). The dispatch (``plan.py``,
as SDPA chooses a backend) is each device's list and one rule:
    ``PLANS`` / ``plan_for`` the ``AttentionPlan`` of each device type, read once per
                             SOFT layer's forward and passed down
    ``select_variant``       the first of the plan's list that can run (a forced one
                             fails with its reasons)
    ``attention_plan``       force choices for a block of code, in this thread
    ``VARIANTS``             the registered variants; ``register_variant`` adds one
                             (packages outside the library: ``projects/``)

SimA (the SimA paper's attention): ``sima_attention``, L1-normalized q, k, no softmax.
Dtypes (``dtypes.py``, both families): ``compute_dtype``, ``device_type``.

Shapes use B batch, h heads, N tokens, m landmarks, d head dim; every function works on
any leading batch dimensions (``...``).
"""
from .dtypes import compute_dtype, device_type
from .newton import (TF32, Iterative, Regularized, Variant, newton_alpha, newton_iterate,
                     newton_pinv, newton_pinv_error, normalize_inverse, regularized_apply,
                     round_tf32)
from .plan import (DEFAULT_PLAN, PLANS, VARIANTS, AttentionPlan, Inputs, VariantNotSupported,
                   attention_plan, pinv_methods, plan_for, register_variant, select_variant)
from .spectral import Spectral, Tridiagonal
from .sima import sima_attention
from .soft import (gaussian_kernel, kernel_attention, kernel_features, kernel_matmul,
                   official_order_attention, soft_attention)

__all__ = [
    'DEFAULT_PLAN', 'PLANS', 'TF32', 'VARIANTS', 'AttentionPlan', 'Inputs', 'Iterative',
    'Regularized', 'Spectral', 'Tridiagonal', 'Variant', 'VariantNotSupported',
    'attention_plan', 'compute_dtype', 'device_type', 'gaussian_kernel', 'kernel_attention',
    'kernel_features', 'kernel_matmul', 'newton_alpha', 'newton_iterate', 'newton_pinv',
    'newton_pinv_error', 'normalize_inverse', 'official_order_attention', 'pinv_methods',
    'plan_for', 'regularized_apply', 'register_variant', 'round_tf32', 'select_variant',
    'sima_attention', 'soft_attention'
]
