"""The attention math of both backbone families, as plain functions.

SOFT (SPEC 1.1, TPAMI paper Eq. 5, Alg. 2, Eq. 16, Eq. 25):
    ``gaussian_kernel``      κ(a, b) = exp(-||a - b||² / 2) between two token sets
    ``kernel_features``      [a, |a|², -1/2] and [b, -1/2, |b|²]: κ = exp(min(â·b̂ᵀ, 0))
    ``kernel_matmul``        κ(q, l)·w or κ(q, l)ᵀ·w, κ recomputed in backward (not kept)
    ``newton_pinv``          Moore–Penrose inverse by Newton–Raphson iteration, per matrix
    ``newton_pinv_apply``    A⁺·Z for a thin Z ('spectral' never forms A⁺)
    ``regularized_apply``    fast mode: a Tikhonov solve standing in for the iterate
    ``normalize_inverse``    attention normalization D^-1/2 A⁺ D^-1/2
    ``soft_attention``       P·Â·(Pᵀ·V) computed as P·(Â·(Pᵀ·V))
    ``PINV_METHODS`` / ``PINV_AUTO``  the ways to compute the iterate, and which one
                             'auto' runs per device (``newton.py``)
    ``KERNEL_PLAN``          per device: the chunk size of P, and up to which size P is
                             formed once without gradients (``soft.py``)

SimA (SPEC 2.1):
    ``sima_attention``       L1-normalized q, k over tokens, no softmax

Shapes use B batch, h heads, N tokens, m landmarks, d head dim. Every function works on
any leading batch dimensions (``...``).
"""
from .newton import (PINV_AUTO, PINV_METHODS, TF32_FP32_STEPS, newton_alpha, newton_pinv,
                     newton_pinv_apply, newton_pinv_error, normalize_inverse,
                     regularized_apply, resolve_pinv_method, round_tf32)
from .sima import sima_attention
from .soft import (KERNEL_PLAN, gaussian_kernel, kernel_features, kernel_matmul,
                   soft_attention)

__all__ = [
    'KERNEL_PLAN', 'PINV_AUTO', 'PINV_METHODS', 'TF32_FP32_STEPS', 'gaussian_kernel',
    'kernel_features', 'kernel_matmul', 'newton_alpha', 'newton_pinv', 'newton_pinv_apply',
    'newton_pinv_error', 'normalize_inverse', 'regularized_apply', 'resolve_pinv_method',
    'round_tf32', 'sima_attention', 'soft_attention'
]
