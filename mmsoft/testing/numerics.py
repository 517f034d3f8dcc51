"""Landmark kernels that are hard for a float32 inverse, and the paths held to the
reference on them (docs/en/notes/numerics.md).

The reference is the float64 run of the library's reference iterate
(``newton_iterate``, SOFT IJCV 2024 Alg. 2) on the same kernel. On these kernels every
path stays finite and within ``KERNEL_BOUND`` of it, or within twice the float32
reference's deviation where that itself misses ``KERNEL_BOUND`` (``kernel_bound``); the
ratio to the float32 reference is reported (tools/analysis_tools/pinv_accuracy.py), not
gated: fidelity is judged on the network's outputs (``fidelity``).
"""
from dataclasses import replace

import torch
import torch.nn.functional as F

from ..models.attention import PLANS, TF32, VARIANTS, gaussian_kernel, newton_iterate

__all__ = [
    'HARD_KERNELS', 'KERNEL_BOUND', 'PINV_PATHS', 'PLAN_PATHS', 'hard_landmarks',
    'hard_problem', 'kernel_bound', 'pinv_accuracy', 'relative_deviation'
]

HARD_KERNELS = ('clustered', 'pooled', 'duplicated', 'near_rank1', 'near_identity',
                'boundary')
KERNEL_BOUND = 1e-3

# The variants a plan may run (CUDA's 'tf32' with its options and without its thin
# steps; 'tf32' with the defaults, as off CUDA, also padded), each held to
# ``kernel_bound`` on the hard kernels. 'tridiagonal' computes no gradients.
_CUDA_TF32 = next(v for _, v in PLANS['cuda'].pinv if v.name == 'tf32')
PINV_PATHS = {
    'iterative': VARIANTS['iterative'],
    'spectral': VARIANTS['spectral'],
    'tf32': TF32(),
    'tf32, padded to 8': TF32(pad_to=8),
    "tf32, CUDA's plan": replace(_CUDA_TF32, thin_steps=0),
    "tf32, CUDA's plan, last steps thin": _CUDA_TF32,
    'spectral, tridiagonal': VARIANTS['tridiagonal'],
}
PLAN_PATHS = tuple(PINV_PATHS)


def kernel_bound(floor):
    """The bound on a hard kernel's deviation: ``KERNEL_BOUND``, or twice the official
    float32 iteration's deviation ``floor`` where that is larger (near the step size's
    boundary, where the iterate is ill-conditioned)."""
    return max(KERNEL_BOUND, 2 * floor)


def hard_landmarks(kind, m, d=32, seed=0):
    """(m, d) float64 landmarks whose Gaussian kernel is hard for a float32 inverse.

    'clustered': 4 tight clusters (cond ~5e2); 'pooled': 2×2 means of smooth tokens, as
    SOFT pools them (cond ~2e4 at m = 196); 'duplicated': a quarter of the landmarks twice
    (singular); 'near_rank1': all near one point (cond ~2e7); 'near_identity': far apart,
    squared norms ~20 (αλ² close to 2); 'boundary': farther apart, squared norms ~35, the
    top eigenvalues within ~1e-5 of the step size's boundary αλ² = 2 (the iterate is
    ill-conditioned there: the official float32 iteration deviates up to 1e-2, and TF32
    rounding of V₀ made it diverge). 'pooled' needs m = k² (k even or odd).
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
    if kind == 'boundary':
        return randn(m, d) * (35 / d)**0.5
    raise ValueError(f'kind must be one of {HARD_KERNELS}, got {kind!r}')


def relative_deviation(W, ref):
    """max|W - ref| / max|ref|, in float64."""
    return ((W.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def hard_problem(kind, m, seed=0, n=32):
    """A hard float32 kernel A (m, m) (``hard_landmarks``), a Z (m, n), the reference
    A⁺·Z (the float64 iterate of A, times Z) and the floor: the float32 reference
    iterate's deviation from it."""
    x = hard_landmarks(kind, m, seed=seed)
    A = gaussian_kernel(x, x).float()
    Z = torch.randn(m, n, generator=torch.Generator().manual_seed(seed + 1))
    ref = newton_iterate(A.double()) @ Z.double()
    return A, Z, ref, relative_deviation(newton_iterate(A) @ Z, ref)


def pinv_accuracy(kind, m, seed=0, n=32, paths=PLAN_PATHS, device='cpu'):
    """Output deviation of A⁺·Z from the float64 iterate for a hard kernel, per path
    (``PINV_PATHS``, run on ``device``: 'tf32' on CUDA with the GPU's own TF32), next to
    the float32 reference's (``hard_problem``, on the CPU).

    Returns:
        dict: ``floor`` (the official float32 deviation), ``bound`` (``kernel_bound``) and,
        per path, ``'<path> inference'`` (no gradient) and ``'<path> training'`` (the
        path with gradients; none for the inference-only tridiagonal application), each
        the deviation (inf where not finite).
    """
    A, Z, ref, floor = hard_problem(kind, m, seed, n)
    out = dict(floor=floor, bound=kernel_bound(floor))
    for name in paths:
        variant = PINV_PATHS[name]
        for grad in ((False, True) if variant.gradients else (False, )):
            with torch.set_grad_enabled(grad):
                a, z = A.to(device, copy=True).requires_grad_(grad), Z.to(device)
                W = variant.apply(a, z, 20).detach().cpu()
            dev = relative_deviation(W, ref) if torch.isfinite(W).all() else float('inf')
            out[f'{name} {"training" if grad else "inference"}'] = dev
    return out
