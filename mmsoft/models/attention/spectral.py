"""'spectral': the T-step Newton–Raphson iterate (paper Alg. 2) through one
eigendecomposition of the symmetric kernel A.

Every iterate is a polynomial in A, so on an eigenpair (λ, u) the T-step iterate acts as
the filter v_T(λ) (``_spectral_filter``), and Y·Z = U·diag(v_T(Λ))·Uᵀ·Z is applied to the
thin Z without forming Y. A float64 kernel is decomposed in float64; a float32 one, in
inference, in float32 where a first-order error bound allows it, its Perron eigenpair
split off in float64 first, and in float64 elsewhere (``_mixed_spectral_factors``); in a
training step in float64 (``spectral_factors``). ``spectral_apply`` is the variant
'spectral', with the gradients of paper Eq. 16 (NeurIPS 2021).

Without gradients the same filter can be applied through A's tridiagonal form instead
of its eigenvectors (``tridiagonal_apply``, the variant 'tridiagonal': about half an
eigendecomposition, through SciPy's LAPACK; the CPU's plan above 448 landmarks).
Shapes: ... leading batch dimensions, m landmarks.
"""
import functools
import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from .newton import Variant, newton_alpha

__all__ = ['MIXED_ESTIMATE_LIMIT', 'PERRON_STEPS', 'RESOLVENT_NODES', 'TRIDIAGONAL_MIN_ITERS',
           'Spectral', 'Tridiagonal', 'apply_factors', 'resolvent_quadrature', 'spectral_apply',
           'tridiagonal_apply']

# Power-iteration steps for the Perron eigenpair, and the largest first-order error
# estimate a float32 decomposition may have (``_mixed_spectral_factors``).
PERRON_STEPS = 12
MIXED_ESTIMATE_LIMIT = 4e-4
# The tridiagonal application: the contour nodes of its resolvent sum
# (``resolvent_quadrature``), and the fewest steps T for which its filter
# 1 - exp(-2^T·αλ²) stands for the iterate's 1 - (1 - αλ²)^(2^T) (they differ by at most
# 0.27·2^-T: 2.6e-7 at T = 20; below, ``tridiagonal_apply`` takes the eigenvectors).
RESOLVENT_NODES = 18
TRIDIAGONAL_MIN_ITERS = 20


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
    # Row vectors: xᵀ·A (= (A·x)ᵀ, A symmetric) runs as a matrix product, faster on the
    # CPU than A·x as a batched product with one column (docs/en/notes/changelog.md).
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
    about est = u·√m·max|λ|·max|v_T'(λ)| / max|v_T| over the computed eigenvalues. The
    deviation of Y·Z from the float64 iterate was measured to stay within a small
    multiple of est on the hard kernels and SOFT-S's (docs/en/notes/numerics.md has the
    factor and SOFT-S's estimates), so a matrix whose est exceeds
    ``MIXED_ESTIMATE_LIMIT`` (the 1e-3 hard-kernel bound over that factor, with margin)
    is decomposed in float64 instead.

    ||A|| is mostly the Perron eigenvalue μ of a Gaussian kernel (λ₁/λ₂ ≈ 10 on SOFT's
    kernels; far more on near-duplicate landmarks, where float32 eigh alone misses the
    hard-kernel bound). So μ and its vector x come first, in float64 (``_perron_pair``); where
    they have converged (residual ≤ u·μ/16) the float32 decomposition is of
    A - μ·x·xᵀ (formed in float64, then rounded), whose norm is λ₂, and x joins U with
    v_T(μ). A and A - μ·x·xᵀ have the same eigenvectors, and x's eigenvalue 0 there has
    v_T(0) = 0, so the iterate is the same.

    One kernel at a time (``_mixed_factors_into``): its float64 copy (m² values) and the
    power steps stay in cache, no float64 copy of the whole batch is held, and
    eigh writes the eigenvectors straight into the result.

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
    anyway, and a float64 copy of the whole batch costs more)."""
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


def apply_factors(U, v, Z):
    """Y·Z for Y = U·diag(v)·Uᵀ (the factors of ``_spectral_factors`` or
    ``_mixed_spectral_factors``; Y is symmetric), in Z's dtype."""
    W = U @ (v.unsqueeze(-1) * (U.transpose(-1, -2) @ Z.to(U.dtype)))
    return W.to(Z.dtype)


def spectral_factors(A, iters, nonnegative=False, training=False):
    """(U, v) in A's dtype with Y = U·diag(v)·Uᵀ the T-step iterate of a symmetric A
    (..., m, m): a float32 A in inference through ``_mixed_spectral_factors``; in a
    training step, and a float64 A, decomposed in float64.

    Why float64 in training: the float32 decomposition moves Y by about its first-order
    estimate (``_mixed_spectral_factors``: u·√m·max|λ|·max|v'| / max|v|, ≈ 1.4e-4·√m·λ₂/μ
    on a Gaussian kernel), which a forward dilutes into the maps but a training step
    passes undiluted into parameter gradients: ∇A = -Yᵀ·∇Y·Yᵀ reaches the landmarks' and
    queries' weights, whose floor is 1e-4. Admitted only where the estimate stays below
    that floor over the estimate's measured factor, with margin, a float32 decomposition
    would pass almost no kernel of SOFT's (near-rank-1 ones only) and cost each a float32
    eigh spent for nothing: every kernel takes float64. The hard kernels, the photos and
    the cost: docs/en/notes/numerics.md, per_device_plans.md."""
    if A.dtype == torch.float32 and not training:
        return _mixed_spectral_factors(A, iters, nonnegative)
    A64 = A.double()  # α and the decomposition from the one float64 copy
    U, v = _spectral_factors(A64, newton_alpha(A64, nonnegative=nonnegative), iters)
    return U.to(A.dtype), v.to(A.dtype)


class _SpectralApply(torch.autograd.Function):
    """W = Y·Z from Y's factors (``spectral_factors``), Y never formed; backward as
    Eq. 16 (Y an exact, symmetric inverse): ∇Z = Y·∇W, ∇A = -∇Z·Wᵀ."""

    @staticmethod
    def forward(ctx, A, Z, iters, nonnegative, training):
        U, v = spectral_factors(A, iters, nonnegative, training)
        W = apply_factors(U, v, Z)
        ctx.save_for_backward(W, U, v)
        return W

    @staticmethod
    def backward(ctx, grad_W):
        W, U, v = ctx.saved_tensors
        grad_Z = apply_factors(U, v, grad_W)
        return -grad_Z @ W.transpose(-1, -2), grad_Z, None, None, None


def spectral_apply(A, Z, iters=20, nonnegative=False):
    """Y·Z for the T-step iterate Y of a symmetric A (..., m, m) and Z (..., m, n) in A's
    dtype, through one eigendecomposition (module docstring): the variant 'spectral'.
    Where gradients are needed, a float32 A is decomposed in float64
    (``spectral_factors``)."""
    training = torch.is_grad_enabled() and (A.requires_grad or Z.requires_grad)
    return _SpectralApply.apply(A, Z, iters, nonnegative, training)


@functools.lru_cache(maxsize=None)
def resolvent_quadrature(nodes=RESOLVENT_NODES):
    """Poles and weights of a rational approximation of φ(x) = (1 - e^(-x)) / x on x ≥ 0:
    φ(x) ≈ 2·Re Σ_k w_k / (z_k + x), k < nodes / 2 (complex128 tensors z, w).

    φ(x) = (1/2πi)·∮ e^z / (z·(z + x)) dz around z = 0 and z = -x (residues 1/x and
    -e^(-x)/x). The sum is the midpoint rule on Talbot's cotangent contour
    z(θ) = n·(-0.6122 + 0.5017·θ·cot(0.6407·θ) + 0.2645i·θ), θ ∈ (-π, π), with the
    parameters of Trefethen, Weideman & Schmelzer (Talbot quadratures and rational
    approximations, BIT 46, 2006); the nodes come in conjugate pairs, hence 2·Re over
    the upper half. Relative error measured on x = 0 and 1e-12 ≤ x ≤ 1e12 (where φ is
    1/x to rounding): 5.7e-9 at 18 nodes, ×~13 per node pair fewer
    (tests/models/attention/test_attention.py). Every |z_k + x| ≥ 3.1: well conditioned.
    """
    h = 2 * math.pi / nodes
    theta = (torch.arange(nodes // 2, dtype=torch.float64) + 0.5) * h
    a, b, c, n = 0.6407, 0.5017, 0.2645, float(nodes)
    cot = 1 / torch.tan(a * theta)
    z = torch.complex(n * (-0.6122 + b * theta * cot), n * c * theta)
    dz = torch.complex(n * b * (cot - a * theta * cot**2 - a * theta),
                       torch.full_like(theta, n * c))  # z'(θ); 1 + cot² = 1/sin²
    w = h / (2j * math.pi) * torch.exp(z) * dz / z
    return z, w


def tridiagonal_apply(A, Z, iters, nonnegative):
    """Y·Z for the T-step iterate Y of a float32 symmetric A (..., m, m) and Z (..., m, n),
    without eigenvectors (inference; needs SciPy): A = Q·T·Qᵀ with T tridiagonal
    (LAPACK's sytrd: Householder reflectors, the cost of eigh's first half), and
    Y·Z = Q·v(T)·Qᵀ·Z with v(λ) = (1 - e^(-sλ²)) / λ = sλ·φ(sλ²), s = α·2^T, from the
    resolvents of the pentadiagonal sT² (``resolvent_quadrature``): one banded complex
    solve per node pair, on the thin Qᵀ·Z. v is the iterate's filter (1 - (1 - αλ²)^(2^T))
    / λ (``_spectral_filter``) within 0.27·2^-T for αλ² ≤ 1, hence
    ``TRIDIAGONAL_MIN_ITERS``: with fewer steps the eigenvectors apply the filter. A is
    a CPU tensor (SciPy's LAPACK), eager code, no gradients (the variant 'tridiagonal'
    declares so).

    As in ``_mixed_spectral_factors``, the Perron pair (μ, x) is split off in float64
    first where it has converged, and T is of A - μ·x·xᵀ. A kernel whose first-order
    error estimate (u·√m·||T||·max|v'| / max|v|, from bounds on T's spectrum: ||T||∞
    above, T's largest diagonal entry below) exceeds ``MIXED_ESTIMATE_LIMIT``, or with
    αλ² possibly above 1, goes through ``_mixed_spectral_factors`` instead. The float32
    decomposition's error then enters only through T and the reflectors, not through
    eigenvectors, and stays below 'mixed' eigh's on SOFT's kernels
    (docs/en/notes/numerics.md).
    """
    if iters < TRIDIAGONAL_MIN_ITERS:
        return apply_factors(*_mixed_spectral_factors(A, iters, nonnegative), Z)
    m, n = A.shape[-1], Z.shape[-1]
    out = torch.empty(*Z.shape, dtype=Z.dtype)
    with _one_blas_thread():
        for a, z, o in zip(A.reshape(-1, m, m), Z.reshape(-1, m, n), out.view(-1, m, n)):
            w = _tridiagonal_apply_one(a, z, iters, nonnegative)
            if w is None:
                w = apply_factors(*_mixed_spectral_factors(a[None], iters, nonnegative),
                                  z[None])[0]
            o.copy_(w)
    return out


def _one_blas_thread():
    """A context in which OpenBLAS (SciPy's LAPACK) runs on the calling thread, where
    threadpoolctl (≥ 3.5, which finds SciPy's own OpenBLAS) is installed; else no change.

    OpenBLAS keeps worker threads of its own beside torch's OpenMP threads, and they
    spin for a while after each call. On a 2-core machine the workers that ``ssytrd``
    left spinning took a core from the torch operators between the calls (the Perron
    split and ``ormqr`` ran slower), and the torch threads still spinning slowed
    ``ssytrd``; on the calling thread it starts no worker, and SOFT-S's forward takes
    less (docs/en/notes/per_device_plans.md; the figures: changelog.md beside it). Other
    BLAS libraries (MKL, which torch may use) are left as they are."""
    controller = _openblas_controller()
    return nullcontext() if controller is None else controller.limit(limits=1)


@functools.lru_cache(maxsize=None)
def _openblas_controller():
    """threadpoolctl's controller of the OpenBLAS libraries loaded once SciPy's LAPACK
    is (made once), or None without threadpoolctl."""
    import scipy.linalg  # noqa: F401  (loads SciPy's OpenBLAS, for threadpoolctl to find)
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController().select(internal_api='openblas')


def _tridiagonal_apply_one(a, z, iters, nonnegative):
    """``tridiagonal_apply`` of one kernel a (m, m) and z (m, n); None where it defers
    to ``_mixed_spectral_factors``."""
    from scipy.linalg import lapack, solve_banded
    u = torch.finfo(torch.float32).eps / 2
    m = a.shape[-1]
    a64, alpha, mu, x, split = _perron_split(a, nonnegative)
    # symmetric: the row-major matrix is its own column-major transpose
    lwork = int(lapack.ssytrd_lwork(m, lower=1)[0])
    refl, d, e, tau, info = lapack.ssytrd(a64.float().numpy().T, lower=1, lwork=lwork,
                                          overwrite_a=1)
    if info:
        return None
    d, e = torch.from_numpy(d).double(), torch.from_numpy(e).double()
    s = alpha.item() * 2.0**iters
    # T's spectrum lies in [λ_min, ||T||∞] and reaches max(d) or above
    norm = (d.abs() + F.pad(e.abs(), (1, 0)) + F.pad(e.abs(), (0, 1))).max().item()
    if alpha.item() * norm**2 > 1:
        return None
    # v is unimodal on λ ≥ 0, largest at sλ² ≈ 1.26: an eigenvalue with 0.5 ≤ sλ² ≤ 3
    # (Sturm counts) has v ≥ 0.55·√s; else one lies in [max(d), ||T||∞]
    window = [(0.5 / s)**0.5, (3 / s)**0.5]
    dl, el = d.tolist(), e.tolist()
    if _eigenvalues_below(dl, el, window[1]) == _eigenvalues_below(dl, el, window[0]):
        window = [d.max().item(), norm]
    ends = _spectral_filter(torch.tensor(window, dtype=torch.float64), alpha, iters)
    v_mu = _spectral_filter(mu[0], alpha, iters).item() if split else 0.0
    peak = max(v_mu, ends.abs().min().item())
    if peak <= 0 or u * m**0.5 * norm * s / peak > MIXED_ESTIMATE_LIMIT:  # max|v'| = s
        return None
    R = torch.from_numpy(refl)[1:, :-1]  # the reflectors, as geqrf stores them
    tau = torch.from_numpy(tau)
    y = z.clone()
    y[1:] = torch.ormqr(R, tau, z[1:], left=True, transpose=True)  # Qᵀ·z
    y = y.double()
    ty = d[:, None] * y  # s·T·y
    ty[:-1] += e[:, None] * y[1:]
    ty[1:] += e[:, None] * y[:-1]
    ty = (s * ty).numpy().astype(complex, order='F')
    band = torch.zeros(5, m, dtype=torch.float64)  # s·T², LAPACK's band storage
    band[2] = d**2
    band[2, 1:] += e**2
    band[2, :-1] += e**2
    band[1, 1:] = band[3, :-1] = e * (d[:-1] + d[1:])
    band[0, 2:] = band[4, :-2] = e[:-1] * e[1:]
    band = (s * band).numpy().astype(complex)
    diagonal = band[2].copy()
    acc = 0
    for zk, wk in zip(*(t.numpy() for t in resolvent_quadrature())):
        band[2] = diagonal + zk
        acc = acc + (wk * solve_banded((2, 2), band, ty, check_finite=False)).real
    W = torch.from_numpy(2 * acc).to(z.dtype)
    W[1:] = torch.ormqr(R, tau, W[1:].contiguous(), left=True, transpose=False)  # Q·
    if split:
        xf = x.to(z.dtype)
        W += v_mu * (xf @ (xf.T @ z))
    return W


def _eigenvalues_below(d, e, sigma):
    """How many eigenvalues of the symmetric tridiagonal T (diagonal d, off-diagonal e,
    lists of floats) are below sigma: the negative pivots of T - σI's LDLᵀ (Sylvester's
    law of inertia; a zero pivot is nudged to -tiny, as LAPACK's bisection does)."""
    count, q, tiny = 0, 1.0, 1e-300
    for i, di in enumerate(d):
        q = di - sigma - (e[i - 1]**2 / q if i else 0.0)
        if q == 0:
            q = -tiny
        count += q < 0
    return count


class Spectral(Variant):
    """The same iterate through one eigendecomposition of A (``spectral_apply``):
    LAPACK / cuSOLVER, so the CPU and CUDA; reads values on the host."""
    name = 'spectral'
    devices = ('cpu', 'cuda')
    traceable = False  # its host reads would become constants of a traced graph
    capturable = False

    def apply(self, A, Z, iters):
        return spectral_apply(A, Z, iters, nonnegative=True)


class Tridiagonal(Variant):
    """'spectral''s filter through A's tridiagonal form (``tridiagonal_apply``,
    SciPy's LAPACK): inference on the CPU, float32, eager code."""
    name = 'tridiagonal'
    devices = ('cpu', )
    dtypes = (torch.float32, )
    gradients = False
    compilable = False
    traceable = False
    requires = ('scipy', )

    def apply(self, A, Z, iters):
        return tridiagonal_apply(A, Z, iters, nonnegative=True)
