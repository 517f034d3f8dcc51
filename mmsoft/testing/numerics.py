"""Landmark kernels that are hard for a float32 inverse, and the references the
pseudo-inverse paths are held to (docs/en/notes/numerics.md).

The reference is the float64 T-step iterate of the same kernel. On these kernels every
path stays finite and within ``KERNEL_BOUND`` of it, or within twice the official code's
float32 iteration's deviation (``official_float32_iterate``) where that itself misses
``KERNEL_BOUND`` (``kernel_bound``); the ratio to the official iteration is reported
(tools/analysis_tools/pinv_accuracy.py), not gated: fidelity is judged on the network's
outputs (``fidelity``). Used by the numerics tests and pinv_accuracy.py.
"""
import torch
import torch.nn.functional as F

from ..models.attention import PLANS, gaussian_kernel, newton_alpha, newton_pinv_apply
from ..models.attention.spectral import tridiagonal_apply

__all__ = [
    'HARD_KERNELS', 'KERNEL_BOUND', 'PINV_PATHS', 'PLAN_PATHS', 'float64_iterate',
    'hard_landmarks', 'hard_problem', 'inference_only', 'kernel_bound',
    'official_float32_iterate',
    'pinv_accuracy', 'relative_deviation'
]

HARD_KERNELS = ('clustered', 'pooled', 'duplicated', 'near_rank1', 'near_identity',
                'boundary')
KERNEL_BOUND = 1e-3

# The ways to compute A⁺·Z the library's variants take (``newton_pinv_apply`` arguments;
# 'tf32' with the schedule off CUDA, ``newton.TF32_FLOAT32_STEPS``, and with CUDA's
# plan's), each held to ``kernel_bound`` on the hard kernels.
_CUDA = PLANS['cuda']
PINV_PATHS = {
    'iterative': dict(method='iterative'),
    'spectral': dict(method='spectral'),
    'tf32': dict(method='tf32'),
    'tf32, padded to 8': dict(method='tf32', pad_to=8),
    "tf32, CUDA's plan": dict(method='tf32', tf32_float32_steps=_CUDA.tf32_float32_steps,
                              pad_to=_CUDA.pinv_pad),
    "tf32, CUDA's plan, last steps thin": dict(
        method='tf32', tf32_float32_steps=_CUDA.tf32_float32_steps, pad_to=_CUDA.pinv_pad,
        thin_steps=_CUDA.thin_steps),
    # the variant 'tridiagonal' (``spectral.tridiagonal_apply``; inference only, SciPy)
    'spectral, tridiagonal': dict(method='tridiagonal'),
}
PLAN_PATHS = tuple(PINV_PATHS)


def inference_only(kwargs):
    """Whether a path (``PINV_PATHS``) runs without gradients only: the tridiagonal
    application."""
    return kwargs['method'] == 'tridiagonal'


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


def official_float32_iterate(A, iters=20):
    """The official code's iterate in float32, V ← 2V - (V·A)·V from V₀ = αA (one α per
    matrix; paper Alg. 2): what the paths' deviations are reported against."""
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


def pinv_accuracy(kind, m, seed=0, n=32, paths=PLAN_PATHS, device='cpu'):
    """Output deviation of A⁺·Z from the float64 iterate for a hard kernel, per path
    (``PINV_PATHS``, run on ``device``: 'tf32' on CUDA with the GPU's own TF32), next to
    the official float32 iteration's (``hard_problem``, on the CPU).

    Returns:
        dict: ``floor`` (the official float32 deviation), ``bound`` (``kernel_bound``) and,
        per path, ``'<path> inference'`` (no gradient) and ``'<path> training'`` (the
        path with gradients; none for the inference-only tridiagonal application), each
        the deviation (inf where not finite).
    """
    A, Z, ref, floor = hard_problem(kind, m, seed, n)
    out = dict(floor=floor, bound=kernel_bound(floor))
    for name in paths:
        kwargs = PINV_PATHS[name]
        for grad in ((False, ) if inference_only(kwargs) else (False, True)):
            with torch.set_grad_enabled(grad):
                a, z = A.to(device, copy=True).requires_grad_(grad), Z.to(device)
                if kwargs['method'] == 'tridiagonal':
                    W = tridiagonal_apply(a, z, 20, nonnegative=True)
                else:
                    W = newton_pinv_apply(a, z, nonnegative=True, **kwargs)
                W = W.detach().cpu()
            dev = relative_deviation(W, ref) if torch.isfinite(W).all() else float('inf')
            out[f'{name} {"training" if grad else "inference"}'] = dev
    return out
