"""Landmark kernels that are hard for a float32 inverse, and the references the
pseudo-inverse paths are held to (docs/en/notes/numerics.md).

The reference is the float64 T-step iterate of the same kernel; the floor of every
default path is the official code's float32 iteration (``official_float32_iterate``).
Used by the numerics tests and tools/analysis_tools/pinv_accuracy.py.
"""
import torch
import torch.nn.functional as F

from ..models.attention import gaussian_kernel, newton_alpha, newton_pinv_apply

__all__ = [
    'HARD_KERNELS', 'float64_iterate', 'hard_landmarks', 'hard_problem',
    'official_float32_iterate', 'pinv_accuracy', 'relative_deviation'
]

HARD_KERNELS = ('clustered', 'pooled', 'duplicated', 'near_rank1', 'near_identity')


def hard_landmarks(kind, m, d=32, seed=0):
    """(m, d) float64 landmarks whose Gaussian kernel is hard for a float32 inverse.

    'clustered': 4 tight clusters (cond ~5e2); 'pooled': 2×2 means of smooth tokens, as
    SOFT pools them (cond ~2e4 at m = 196); 'duplicated': a quarter of the landmarks twice
    (singular); 'near_rank1': all near one point (cond ~2e7); 'near_identity': far apart,
    squared norms ~20 (αλ² close to 2). 'pooled' needs m = k² (k even or odd).
    """
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    if kind == 'clustered':
        if m % 4:
            raise ValueError(f"'clustered' needs m divisible by 4, got {m}")
        return (randn(4, 1, d) * 0.6 + 0.08 * randn(4, m // 4, d)).reshape(m, d)
    if kind == 'pooled':
        side = round(m**0.5)
        if side * side != m:
            raise ValueError(f"'pooled' needs a square m, got {m}")
        t = F.avg_pool2d(randn(1, d, 2 * side, 2 * side) * 0.35, 3, 1, 1)
        return F.avg_pool2d(t, 2).flatten(2)[0].T.contiguous()
    if kind == 'duplicated':
        x = randn(m - m // 4, d) * 0.3
        return torch.cat([x, x[:m // 4]])
    if kind == 'near_rank1':
        return randn(1, d) + 1e-2 * randn(m, d)
    if kind == 'near_identity':
        return randn(m, d) * (20 / d)**0.5
    raise ValueError(f'kind must be one of {HARD_KERNELS}, got {kind!r}')


def official_float32_iterate(A, iters=20):
    """The official code's iterate in float32, V ← 2V - (V·A)·V from V₀ = αA (one α per
    matrix, SPEC 1.1 step 5): the accuracy floor of every default path."""
    A = A.float()
    V = newton_alpha(A) * A
    for _ in range(iters):
        V = 2 * V - (V @ A) @ V
    return V


def float64_iterate(A, iters=20):
    """The reference: the T-step iterate of A in float64."""
    A = A.double()
    V = newton_alpha(A) * A
    for _ in range(iters):
        V = 2 * V - V @ (A @ V)
    return V


def relative_deviation(W, ref):
    """max|W - ref| / max|ref|, in float64."""
    return ((W.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def hard_problem(kind, m, seed=0, n=32):
    """A hard float32 kernel A (m, m) (``hard_landmarks``), a Z (m, n), the reference
    A⁺·Z (the float64 iterate of A, times Z) and the floor: the official float32
    iteration's deviation from it."""
    x = hard_landmarks(kind, m, seed=seed)
    A = gaussian_kernel(x, x).float()
    Z = torch.randn(m, n, generator=torch.Generator().manual_seed(seed + 1))
    ref = float64_iterate(A) @ Z.double()
    return A, Z, ref, relative_deviation(official_float32_iterate(A) @ Z, ref)


def pinv_accuracy(kind, m, seed=0, n=32,
                  methods=('iterative', 'spectral', 'tf32', 'tf32x3')):
    """Output deviation of A⁺·Z from the float64 iterate for a hard kernel, per path,
    next to the official float32 iteration's (the floor; ``hard_problem``).

    Returns:
        dict: ``floor`` (the official float32 deviation) and, per method,
        ``'<method> inference'`` (no gradient) and ``'<method> training'`` (the path with
        gradients), each as a ratio to the floor.
    """
    A, Z, ref, floor = hard_problem(kind, m, seed, n)
    out = dict(floor=floor)
    for method in methods:
        with torch.no_grad():
            W = newton_pinv_apply(A, Z, method=method, nonnegative=True)
        out[f'{method} inference'] = relative_deviation(W, ref) / floor
        with torch.enable_grad():
            W = newton_pinv_apply(A.clone().requires_grad_(), Z, method=method,
                                  nonnegative=True)
        out[f'{method} training'] = relative_deviation(W.detach(), ref) / floor
    return out
