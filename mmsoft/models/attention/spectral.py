"""'spectral': the T-step Newton–Raphson iterate (paper Alg. 2) through one
eigendecomposition of the symmetric kernel A.

Every iterate is a polynomial in A, so on an eigenpair (λ, u) the T-step iterate acts as
the filter v_T(λ) (``_spectral_filter``), and Y·Z = U·diag(v_T(Λ))·Uᵀ·Z is applied to the
thin Z without forming Y. A float64 kernel is decomposed in float64; a float32 one in
float32 where a first-order error bound allows it, its Perron eigenpair split off in
float64 first, and in float64 elsewhere (``_mixed_spectral_factors``). ``newton.py``
keeps the factors (``_NewtonInverse``) and its autograd Functions apply them.
Shapes: ... leading batch dimensions, m landmarks.
"""
import torch

from .step_size import newton_alpha

__all__ = ['MIXED_ESTIMATE_LIMIT', 'PERRON_STEPS']

# Power-iteration steps for the Perron eigenpair, and the largest first-order error
# estimate a float32 decomposition may have (``_mixed_spectral_factors``).
PERRON_STEPS = 12
MIXED_ESTIMATE_LIMIT = 4e-4


def _spectral_filter(lam, alpha, iters):
    """v_T(λ): what T Newton–Raphson steps from V₀ = αA do to an eigenvalue λ of A.

    Every iterate is a polynomial in A (V₀ = αA commutes with A), so on an eigenpair
    (λ, u) it acts as v_T(λ) = (1 - (1 - αλ²)^(2^T)) / λ, with v_T(λ) → α·λ·2^T as λ → 0.
    """
    a = alpha.squeeze(-1)
    x = a * lam * lam  # αλ², (..., m)
    # (1 - x)^(2^T) = exp(2^T · log|1 - x|) (2^T is even); log1p keeps small x exact.
    tiny = torch.finfo(lam.dtype).tiny
    log_base = torch.where(x < 0.5, torch.log1p(-x.clamp(max=0.5)),
                           torch.log((1 - x).abs().clamp_min(tiny)))
    one_minus = -torch.expm1(log_base * float(2**iters))  # 1 - (1 - x)^(2^T)
    nonzero = lam != 0
    return torch.where(nonzero, one_minus / torch.where(nonzero, lam, torch.ones_like(lam)),
                       a * lam * float(2**iters))


def _spectral_factors(A, alpha, iters):
    """(U, v) with Y = U·diag(v)·Uᵀ the T-step iterate of symmetric A (..., m, m), from
    A = U·Λ·Uᵀ by eigh in float64 (a float32 decomposition alone is exact only to
    ~eps·||A||, which moves the filter of eigenvalues near where it turns over,
    αλ²·2^T ≈ 1, and mixes eigenvectors of close eigenvalues: float32 kernels go through
    ``_mixed_spectral_factors``).

    Returns:
        (Tensor, Tensor): U (..., m, m) and v (..., m) in float64, in which they are
        applied to the thin Z too.
    """
    lam, U = torch.linalg.eigh(A.double())
    return U, _spectral_filter(lam, alpha.double(), iters)


def _filter_slope(lam, alpha, iters):
    """v_T'(λ), the slope of ``_spectral_filter``: with y = 1 - αλ² and p = 2^T,
    v_T'(λ) = (2αpλ²·y^(p-1) - (1 - y^p)) / λ², → α·p as λ → 0. Float64 in and out."""
    a, p = alpha.squeeze(-1), float(2**iters)
    x = a * lam * lam
    y = 1 - x
    # y^(p-1) = sign(y)·|y|^(p-1) (p - 1 is odd); |y| ≤ 1.01 for the α of newton_alpha
    y_pm1 = torch.sign(y) * torch.exp((p - 1) * torch.log(y.abs().clamp_min(1e-300)))
    tiny = x < 1e-12  # where the quotient cancels: the limit α·p
    slope = (2 * p * x * y_pm1 - (1 - y * y_pm1)) / torch.where(tiny, torch.ones_like(lam),
                                                                 lam * lam)
    return torch.where(tiny, a * p, slope)


def _perron_pair(A, A64, steps=PERRON_STEPS):
    """A's largest eigenvalue μ and its unit eigenvector x (the Perron pair of a kernel
    with positive entries) by ``steps`` power-iteration steps from A·1, the last two in
    float64 (the others in float32: half the memory traffic), and the float64 residual
    ||A·x - μ·x||. A (..., m, m) symmetric float32 and A64 the same in float64; returns
    (..., 1, 1), (..., m, 1), (..., 1, 1), float64."""
    # Row vectors: xᵀ·A (= (A·x)ᵀ, A symmetric) runs as a matrix product, ~4× faster on
    # the CPU than A·x as a batched product with one column.
    x = A.sum(-2, keepdim=True)  # (..., 1, m)
    for k in range(steps):
        if k == steps - 2:
            x = x.double()
        x = (x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)) @ (
            A64 if x.dtype == torch.float64 else A)
    x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    xA = x @ A64
    mu = xA @ x.transpose(-1, -2)
    residual = torch.linalg.vector_norm(xA - mu * x, dim=-1, keepdim=True)
    return mu, x.transpose(-1, -2), residual


def _perron_split(a, nonnegative):
    """One float32 kernel a (m, m) in float64, with its Perron pair split off where the
    pair has converged (residual ≤ u·μ/16, u = 2^-24): (A or A - μ·x·xᵀ in float64, α
    (1, 1) from the kernel's float64 copy while it is in cache, μ, x, split)."""
    u = torch.finfo(torch.float32).eps / 2
    a64 = a.double()
    alpha = newton_alpha(a64, nonnegative=nonnegative)  # (1, 1), float64
    mu, x, residual = _perron_pair(a, a64)
    split = residual.item() <= u * mu.item() / 16
    if split:
        a64.addmm_(x, x.T, alpha=-mu.item())  # A - μ·x·xᵀ, in float64
    return a64, alpha, mu, x, split


def _mixed_spectral_factors(A, iters, nonnegative=False):
    """(U, v) with Y = U·diag(v)·Uᵀ the T-step iterate of a float32 symmetric A (..., m, m),
    from a float32 eigendecomposition where that is accurate enough, a float64 one
    elsewhere. U is (..., m, m + 1): A's eigenvectors and the Perron vector.

    A float32 eigh is exact for a matrix within δ ≈ u·√m·||A|| of A (u = 2^-24, float32's
    unit roundoff); to first order that moves the filter by δ times its divided
    differences, at most δ·max|v_T'| (Daleckii–Krein), so the relative error of Y is
    about est = u·√m·max|λ|·max|v_T'(λ)| / max|v_T| over the computed eigenvalues. Measured
    against the float64 iterate, the deviation of Y·Z stayed below 2.3× est (the hard
    kernels of ``mmsoft.testing`` at m = 64-400, SOFT-S's 1050×1050 kernels at 800×1344
    on photos, a silhouette, a text page and a near-blank wall; docs/en/notes/numerics.md),
    and SOFT-S's kernels have est ≈ 2.2e-4-2.7e-4. A matrix whose est exceeds
    ``MIXED_ESTIMATE_LIMIT`` (2.5 × 4e-4 = the 1e-3 hard-kernel bound) is decomposed in
    float64 instead.

    ||A|| is mostly the Perron eigenvalue μ of a Gaussian kernel (λ₁/λ₂ ≈ 10 on SOFT's
    kernels; far more on near-duplicate landmarks, where float32 eigh alone deviates
    up to 5e-3). So μ and its vector x come first, in float64 (``_perron_pair``); where
    they have converged (residual ≤ u·μ/16) the float32 decomposition is of
    A - μ·x·xᵀ (formed in float64, then rounded), whose norm is λ₂, and x joins U with
    v_T(μ). A and A - μ·x·xᵀ have the same eigenvectors, and x's eigenvalue 0 there has
    v_T(0) = 0, so the iterate is the same.

    One kernel at a time (``_mixed_factors_into``): its float64 copy (8.8 MB at m = 1050)
    and the power steps stay in cache, no float64 copy of the whole batch is held, and
    eigh writes the eigenvectors straight into the result (docs/en/notes/numerics.md).

    Returns:
        (Tensor, Tensor): U (..., m, m + 1) (a transposed view: column-major, as eigh
        returns it) and v (..., m + 1), float32.
    """
    m = A.shape[-1]
    batch = A.shape[:-2]
    Ut = A.new_empty(*batch, m + 1, m)  # Uᵀ
    lam = A.new_empty(*batch, m)
    v = torch.empty(*batch, m + 1, dtype=torch.float64, device=A.device)
    for args in zip(A.reshape(-1, m, m), Ut.view(-1, m + 1, m), lam.view(-1, m),
                    v.view(-1, m + 1)):
        _mixed_factors_into(*args, iters, nonnegative)
    return Ut.mT, v.float()


def _mixed_factors_into(a, Ut, lam, v, iters, nonnegative):
    """``_mixed_spectral_factors`` of one kernel a (m, m), float32, written into Ut
    (m + 1, m) (Uᵀ: the eigenvectors, then the Perron vector or zeros), v (m + 1)
    (float64) and lam (m) (float32 scratch for eigh's eigenvalues). α comes from the
    kernel's float64 copy, while it is in cache (``newton_alpha`` decides in float64
    anyway: from the whole batch that cost the CPU's forward at 800×1344 0.35 s)."""
    u = torch.finfo(torch.float32).eps / 2  # float32's unit roundoff, 2^-24
    m = a.shape[-1]
    a64, alpha, mu, x, split = _perron_split(a, nonnegative)
    if not split:
        mu = torch.zeros_like(mu)
    # Uᵀ[:m]ᵀ is column-major, eigh's own layout: it decomposes into it in place
    torch.linalg.eigh(a64.float(), out=(lam, Ut[:m].mT))
    lam64 = lam.double()
    v_lam = _spectral_filter(lam64, alpha, iters)
    v_mu = _spectral_filter(mu[0], alpha, iters)  # (1,); 0 where not split
    est = (u * m**0.5 * lam64.abs().amax() * _filter_slope(lam64, alpha, iters).abs().amax()
           / torch.maximum(v_lam.abs().amax(), v_mu.abs()[0]))
    if est.item() > MIXED_ESTIMATE_LIMIT:  # whole in float64
        U64, v_lam = _spectral_factors(a.double(), alpha, iters)
        Ut[:m] = U64.mT
        split = False
    Ut[m] = x[:, 0] if split else 0
    v[:m] = v_lam
    v[m] = v_mu[0] if split else 0
