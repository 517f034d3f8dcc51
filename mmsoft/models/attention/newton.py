"""The Newton–Raphson pseudo-inverse of SOFT's landmark kernel (SPEC 1.1 step 5).

Paper Alg. 2 ("alternative form"): V₀ = αA, V_{k+1} = 2V_k - V_k·A·V_k for T = 20 steps,
α chosen per matrix; paper Eq. 16 for the backward pass. Every way below computes that
same T-step iterate Y (``PINV_METHODS``); they differ in cost per device:

    'iterative'  the matrix iteration in float32: 2T products of m×m matrices, also
                 without gradients (applying steps to the thin Z instead is cheaper but
                 does not correct its own rounding: docs/en/notes/numerics.md).
    'spectral'   one eigendecomposition of A, the iterate's filter on its eigenvalues; in
                 float64 also for a float32 A (``_spectral_factors``).
    'tf32'       the iteration with TF32 tensor-core products (CUDA) for the first
                 T - ``TF32_FP32_STEPS`` steps and float32 for the last ones, which
                 correct the early rounding in the converged directions only (see
                 ``TF32_FP32_STEPS``). Off CUDA the TF32 rounding is emulated (slow; for
                 checking numerics). Below the accuracy floor on hard kernels.
    'tf32x3'     the iteration with every float32 product made of three TF32 products of
                 split operands, x = hi + lo with hi = x rounded to TF32:
                 hi·hi + hi·lo + lo·hi (``_split_bmm``), which keeps float32 accuracy on
                 tensor cores. Emulated off CUDA, like 'tf32'.
    'auto'       per device type and size, from measurements (``plan.py``).

Accuracy (float32 A): the reference is the float64 T-step iterate of the same A; the
floor is the official code's float32 iteration, 2V - (V·A)·V. On kernels that are hard
for it (clustered, pooled, duplicated, near-rank-1 and near-identity landmarks, m = 32 to
300) 'iterative' and 'spectral' stay within 1.6× and 0.2× of that floor's output
deviation, in inference and training, over seeds and thread / SIMD settings
(``tests/models/attention/test_attention.py``,
``test_default_paths_meet_the_official_float32_floor``).

'regularized' (``regularized_apply``) is a fast mode that is *not* the iterate.
Shapes: ... leading batch dimensions, m landmarks.
"""
from contextlib import contextmanager, nullcontext

import torch

from .plan import EXACT_PINV_METHODS, compute_dtype, device_type, plan_for

__all__ = [
    'PINV_METHODS', 'TF32_FP32_STEPS', 'newton_alpha', 'newton_pinv',
    'newton_pinv_apply', 'newton_pinv_error', 'normalize_inverse', 'regularized_apply',
    'resolve_pinv_method', 'round_tf32'
]

# 'auto': the device's plan (``plan.py``); 'regularized' is a fast mode: not the T-step
# iterate (see ``regularized_apply``).
PINV_METHODS = ('auto', ) + EXACT_PINV_METHODS + ('regularized', )

# Float32 steps that end the 'tf32' schedule. Measured on the 84 landmark kernels of
# SOFT-S on a photo at 800×1344 (H100), relative to the float64 iterate: 20 TF32 steps
# 5.6e-4, 18 TF32 + 2 float32 2.1e-5, 15 TF32 + 5 float32 4.4e-6. The float32 steps do
# not repair the TF32 rounding in directions that are still converging (small
# eigenvalues, where the iterate doubles errors instead of squaring them): on the hard
# kernels of ``tests/models/attention/test_attention.py`` (emulated TF32) 15 + 5 steps
# were up to 47× the official float32 iteration's deviation, and near-identity kernels
# (αλ² ≈ 2) can diverge once A's entries are rounded to TF32. So 'tf32' is opt-in, never 'auto'.
TF32_FP32_STEPS = 5


def resolve_pinv_method(method, m, device_type='cpu', iters=20):
    """The concrete method ('iterative', 'spectral', 'tf32', 'tf32x3', 'regularized').

    Args:
        method (str): one of ``PINV_METHODS``; 'auto' is the device's plan
            (``plan_for(device_type).pinv``).
        m (int): landmarks (the size of A).
        device_type (str): where A lives ('cpu', 'cuda', ...).
    """
    if method not in PINV_METHODS:
        raise ValueError(f'method must be one of {PINV_METHODS}, got {method!r}')
    if iters < 0:
        raise ValueError(f'iters must be >= 0, got {iters}')
    if method != 'auto':
        return method
    return plan_for(device_type).pinv_method(m)


def newton_alpha(A, max_halvings=10, nonnegative=False):
    """Initial step α of the Newton–Raphson inverse, chosen per matrix (SPEC 1.1 step 5).

    α = 2 / (max row sum of |A|)², halved while ||I - α·A·A||₁ > 1.01 (at most
    ``max_halvings`` times). ||·||₁ is the max column sum of absolute values.

    Args:
        A (Tensor): (..., m, m)
        max_halvings (int): at most this many halvings.
        nonnegative (bool): A is symmetric with nonnegative entries (a Gaussian kernel
            matrix is). Then column j of I - α·A² has the diagonal entry 1 - α·a_j with
            a_j = Σ_k A_jk² and off-diagonal entries of total size α·(s_j - a_j) with
            s_j = (A·(A·1))_j, so ||I - α·A²||₁ = max_j |1 - α·a_j| + α·(s_j - a_j) costs
            O(m²) per α instead of forming A·A (O(m³)), and all candidate α are tested
            at once (a few launches instead of a loop of small ones).
    Returns:
        Tensor: (..., 1, 1) α for every matrix of the batch (not one α for the whole batch,
        which would make one image's output depend on the others in its batch).
    """
    # (|A| is A itself when nonnegative: no m×m temporary, the same sums.)
    row_sums = A.sum(-1, keepdim=True) if nonnegative else A.abs().sum(-1, keepdim=True)
    alpha = 2 * row_sums.amax(-2, keepdim=True).pow(-2)  # (..., 1, 1); pow(-2) is 1/x²
    if nonnegative:
        # a_j = ||A_j||², without an m×m temporary (it only decides the halvings)
        diag = torch.linalg.vector_norm(A, dim=-1).pow(2)[..., None, :]  # (..., 1, m)
        off = (A @ row_sums).transpose(-1, -2) - diag  # s_j - a_j
        # Candidates α/2^j, j = 0 … max_halvings, along a new last dim: powers of two
        # (exact) made on A's device (a tensor from a Python list would be a host-to-
        # device copy, which synchronizes with a GPU in every call).
        scales = 0.5**torch.arange(max_halvings + 1, dtype=A.dtype, device=A.device)
        cand = alpha[..., None] * scales  # (..., 1, 1, J + 1)
        c = cand[..., :-1]
        norms = ((1 - c * diag[..., None]).abs() + c * off[..., None]).amax(-2)
        # The bound holds for every α below one that meets it (the norm is convex in α
        # and 1 at α = 0; the margins dwarf rounding), so the halvings of the sequential
        # loop below are the candidates that miss it, at most max_halvings.
        halvings = (norms > 1.01).sum(-1, keepdim=True)  # (..., 1, 1)
        return cand.gather(-1, halvings[..., None]).squeeze(-1)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    AA = A @ A
    # A fixed number of steps with torch.where (no data-dependent break): the result is
    # the same (α stops halving once the bound holds) and the graph stays traceable.
    for _ in range(max_halvings):
        norm = (eye - alpha * AA).abs().sum(-2).amax(-1)[..., None, None]
        alpha = torch.where(norm > 1.01, alpha / 2, alpha)
    return alpha


# ---------------------------------------------------------------------------------------
# Precision: TF32 products
# ---------------------------------------------------------------------------------------


def round_tf32(x):
    """float32 values rounded to TF32 (10 mantissa bits, round to nearest, ties to even),
    still stored as float32: what tensor cores do to the operands of a TF32 product."""
    if x.dtype != torch.float32:
        raise TypeError(f'round_tf32 rounds float32 tensors, got {x.dtype}')
    bits = x.contiguous().view(torch.int32)
    bias = ((bits >> 13) & 1) + 0x0FFF
    return ((bits + bias) & -0x2000).view(torch.float32)


@contextmanager
def _cuda_tf32_matmuls():
    """Let cuBLAS use TF32 for float32 products inside the block (restored after)."""
    mm = torch.backends.cuda.matmul
    if hasattr(mm, 'fp32_precision'):  # torch >= 2.9; mixing it with allow_tf32 raises
        old = mm.fp32_precision
        if old != 'tf32':
            mm.fp32_precision = 'tf32'
        try:
            yield
        finally:
            if old != 'tf32':
                mm.fp32_precision = old
    else:
        old = mm.allow_tf32
        mm.allow_tf32 = True
        try:
            yield
        finally:
            mm.allow_tf32 = old


def _split_tf32(x, emulate):
    """x = hi + lo with hi = x rounded to TF32 (exact in a TF32 product) and lo = x - hi
    (exact in float32; rounded to TF32 here when ``emulate``, by the tensor cores on CUDA).
    """
    hi = round_tf32(x)
    lo = x - hi
    return hi, round_tf32(lo) if emulate else lo


def _split_bmm(a, b):
    """a·b in float32 accuracy from three TF32 products, small terms first:
    lo_a·hi_b + hi_a·lo_b + hi_a·hi_b (the dropped lo_a·lo_b is ~2^-22 of a·b). ``a`` and
    ``b`` are pairs (hi, lo) from ``_split_tf32``; (b, m, k) and (b, k, n)."""
    (a_hi, a_lo), (b_hi, b_lo) = a, b
    acc = torch.bmm(a_lo, b_hi).baddbmm_(a_hi, b_lo)
    return acc.baddbmm_(a_hi, b_hi)


def _newton_steps_split(A, V, steps):
    """``steps`` steps V ← 2V - V·(A·V) with every product from ``_split_bmm`` (TF32
    tensor-core products on CUDA, emulated elsewhere). A, V: (b, m, m), float32."""
    emulate = not A.is_cuda
    A2 = _split_tf32(A, emulate)
    for _ in range(steps):
        V2 = _split_tf32(V, emulate)  # split once, used in both products
        VAV = _split_bmm(V2, _split_tf32(_split_bmm(A2, V2), emulate))
        V = torch.add(V, V).sub_(VAV)
    return V


def _newton_steps(A, V, steps, tf32=False, split=False):
    """``steps`` steps V ← 2V - V·(A·V) (Alg. 2), in TF32 products if ``tf32``, in split
    TF32 products of float32 accuracy if ``split`` ('tf32x3').

    A, V: (b, m, m) with one flat batch dimension (baddbmm: one launch for 2V - V·AV).
    """
    if steps <= 0:
        return V
    if split and A.dtype == torch.float32:
        with _cuda_tf32_matmuls() if A.is_cuda else nullcontext():
            return _newton_steps_split(A, V, steps)
    if not tf32 or A.dtype != torch.float32:  # TF32 rounds float32 operands only
        for _ in range(steps):
            V = torch.baddbmm(V, V, A @ V, beta=2, alpha=-1)
        return V
    if A.is_cuda:
        with _cuda_tf32_matmuls():
            return _newton_steps(A, V, steps)
    # Emulation: the operands of every product rounded to TF32, float32 accumulation.
    A = round_tf32(A)
    for _ in range(steps):
        AV = A @ round_tf32(V)
        V = torch.baddbmm(V, round_tf32(V), round_tf32(AV), beta=2, alpha=-1)
    return V


def _spectral_filter(lam, alpha, iters):
    """v_T(λ): what T Newton–Raphson steps from V₀ = αA do to an eigenvalue λ of A.

    Every iterate is a polynomial in A, so on an eigenpair (λ, u) it acts as
    v_T(λ) = (1 - (1 - αλ²)^(2^T)) / λ, with v_T(λ) → α·λ·2^T as λ → 0 (SPEC 1.1).
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
    """(U, v) with Y = U·diag(v)·Uᵀ the T-step iterate of symmetric A (..., m, m).

    A = U·Λ·Uᵀ by eigh in float64, also for a float32 A. A float32 decomposition is exact
    only to ~eps·||A||, which moves the filter of eigenvalues near where it turns over
    (αλ²·2^T ≈ 1) and mixes eigenvectors of close eigenvalues: up to 400× the official
    float32 iteration's deviation on hard kernels, 222× on a SOFT-S stage-1 kernel at
    800×1344. Correcting it to first order from Uᵀ·A·U in float64 met the floor but cost
    more than a float64 eigh (1.03 s against 0.77 s for 10 kernels of m = 1050 on a 2-core
    CPU; float32 eigh 0.45 s); docs/en/notes/numerics.md.

    Returns:
        (Tensor, Tensor): U (..., m, m) and v (..., m), float64 for a float32 A (applied
        to the thin Z in float64 too), else in A's dtype.
    """
    wide = torch.float64 if A.dtype == torch.float32 else A.dtype
    lam, U = torch.linalg.eigh(A.to(wide))
    return U, _spectral_filter(lam, alpha.to(wide), iters)


def _iteration_start(A, iters, method, nonnegative):
    """Where the float32 steps of 'iterative' / 'tf32' / 'tf32x3' begin: (A3, V, steps)
    with A as (b, m, m), V = V₀ = αA ('iterative', 'tf32x3') or V after the TF32 steps
    ('tf32'), and the number of float32 steps still to run."""
    alpha = newton_alpha(A, nonnegative=nonnegative)
    m = A.shape[-1]
    A3 = A.reshape(-1, m, m)
    V = alpha.reshape(-1, 1, 1) * A3
    low = max(iters - TF32_FP32_STEPS, 0) if method == 'tf32' else 0
    return A3, _newton_steps(A3, V, low, tf32=True), iters - low


class _NewtonInverse:
    """The T-step iterate Y of A (..., m, m), kept in whichever form is cheaper to apply.

    'iterative' / 'tf32' / 'tf32x3' keep Y itself (``factors`` = (Y,)); 'spectral' keeps
    A's eigenvectors U and v_T of its eigenvalues (``factors`` = (U, v), Y = U·diag(v)·Uᵀ,
    ``_spectral_factors``), which is applied to a thin matrix without forming Y. The
    factors are plain tensors, so an autograd Function can save them for backward
    (``save_for_backward``).
    """

    def __init__(self, method, *factors):
        self.method, self.factors = method, factors

    @classmethod
    def of(cls, A, iters, method, nonnegative):
        if method == 'spectral':
            alpha = newton_alpha(A, nonnegative=nonnegative)
            return cls(method, *_spectral_factors(A, alpha, iters))
        A3, V, steps = _iteration_start(A, iters, method, nonnegative)
        V = _newton_steps(A3, V, steps, split=method == 'tf32x3')
        return cls(method, V.reshape(A.shape))

    def matrix(self, dtype):
        """Y in ``dtype`` (A's)."""
        if self.method == 'spectral':
            U, v = self.factors
            return ((U * v.unsqueeze(-2)) @ U.transpose(-1, -2)).to(dtype)
        return self.factors[0]

    def apply(self, Z, transpose=False):
        """Y·Z (or Yᵀ·Z) for Z of shape (..., m, n), in Z's dtype."""
        if self.method == 'spectral':
            U, v = self.factors  # Y is symmetric
            W = U @ (v.unsqueeze(-1) * (U.transpose(-1, -2) @ Z.to(U.dtype)))
            return W.to(Z.dtype)
        Y = self.factors[0]
        return (Y.transpose(-1, -2) if transpose else Y) @ Z


class _NewtonPinv(torch.autograd.Function):
    """Y = A⁺ by Newton–Raphson; backward treats Y as an exact inverse (paper Eq. 16)."""

    @staticmethod
    def forward(ctx, A, iters, method, nonnegative):
        Y = _NewtonInverse.of(A, iters, method, nonnegative).matrix(A.dtype)
        ctx.save_for_backward(Y)
        return Y

    @staticmethod
    def backward(ctx, grad_Y):
        Y, = ctx.saved_tensors
        Yt = Y.transpose(-1, -2)
        return -Yt @ grad_Y @ Yt, None, None, None


class _NewtonPinvApply(torch.autograd.Function):
    """W = A⁺·Z without forming A⁺ when the spectral form is used.

    Backward as paper Eq. 16 (A⁺ treated as an exact inverse): with ∇Y = ∇W·Zᵀ,
    ∇A = -Yᵀ·∇Y·Yᵀ = -(Yᵀ·∇W)·Wᵀ and ∇Z = Yᵀ·∇W, so the same two thin products serve
    both and the gradient equals that of ``newton_pinv(A) @ Z``.
    """

    @staticmethod
    def forward(ctx, A, Z, iters, method, nonnegative):
        inv = _NewtonInverse.of(A, iters, method, nonnegative)
        W = inv.apply(Z)
        ctx.method = method
        ctx.save_for_backward(W, *inv.factors)
        return W

    @staticmethod
    def backward(ctx, grad_W):
        W, *factors = ctx.saved_tensors
        grad_Z = _NewtonInverse(ctx.method, *factors).apply(grad_W, transpose=True)
        return -grad_Z @ W.transpose(-1, -2), grad_Z, None, None, None


def newton_pinv(A, iters=20, method='auto', nonnegative=False):
    """Moore–Penrose inverse of (batched) square matrices by Newton–Raphson iteration.

    The result equals ``iters`` steps of V_{k+1} = 2V_k - V_k·A·V_k from V₀ = αA with a
    per-matrix α (``newton_alpha``). Gradients follow paper Eq. 16 (∇A = -Yᵀ·∇Y·Yᵀ)
    rather than back-propagating through the iterations. Always computed in float32 (or
    float64 if A is float64), also under autocast.

    Args:
        A (Tensor): (..., m, m)
        iters (int): number of Newton–Raphson steps T (20 in SOFT).
        method (str): 'iterative', 'spectral' (A must be symmetric, as the Gaussian kernel
            of landmarks is), 'tf32', 'tf32x3' or 'auto' (module docstring). All give the
            same value up to rounding. ('regularized' exists only for ``soft_attention``.)
        nonnegative (bool): A is symmetric with nonnegative entries; α is then found in
            O(m²) (same value, see ``newton_alpha``).
    Returns:
        Tensor: (..., m, m) in A's floating dtype promoted to at least float32.
    """
    method = resolve_pinv_method(method, A.shape[-1], A.device.type, iters)
    if method == 'regularized':
        raise ValueError("method='regularized' never forms the inverse; it is only "
                         'available in soft_attention')
    with torch.autocast(device_type=device_type(A), enabled=False):
        return _NewtonPinv.apply(A.to(compute_dtype(A)), iters, method, nonnegative)


def newton_pinv_apply(A, Z, iters=20, method='auto', nonnegative=False):
    """A⁺·Z for the T-step iterate A⁺ of A, without forming A⁺ where that is cheaper.

    Same value and (Eq. 16) gradients as ``newton_pinv(A, ...) @ Z``. 'iterative',
    'tf32' and 'tf32x3' form A⁺ (with or without gradients: see the module docstring);
    'spectral' never forms it.

    Args:
        A (Tensor): (..., m, m), float32 or float64.
        Z (Tensor): (..., m, n), A's dtype.
        method (str): a method of ``PINV_METHODS`` other than 'auto' or 'regularized'.
    Returns:
        Tensor: (..., m, n)
    """
    if method in ('auto', 'regularized'):
        raise ValueError(f'newton_pinv_apply needs a concrete iterate method, got '
                         f'{method!r} (see resolve_pinv_method)')
    return _NewtonPinvApply.apply(A, Z, iters, method, nonnegative)


def regularized_apply(A, Z, iters=20):
    """Fast mode: (A² + μI)⁻¹·A·Z with μ = 1 / (α·2^T), by one Cholesky factorization.

    T Newton steps filter an eigenvalue λ of A to (1 - (1 - αλ²)^(2^T)) / λ ≈
    (1 - exp(-λ²/μ)) / λ: the exact inverse for λ² ≫ μ, α·2^T·λ for λ² ≪ μ. The
    Tikhonov filter λ / (λ² + μ) has the same two limits, so with this μ it is a close
    stand-in (it deviates most, by up to ~20 % on that eigen-component, where λ² ≈ μ);
    ``tools/analysis_tools/benchmark.py --sections modes`` reports the resulting output
    deviation.
    One m×m product and one Cholesky factorization replace the eigendecomposition;
    gradients are exact for this filter (autograd through the solve).

    A factorization that fails in floating point (A² + μI is positive definite, but μ is
    ~5e-7·||A||² at T = 20) raises on the CPU; elsewhere checking would synchronize the
    device with the host in every call, so that matrix's output is NaN instead.
    """
    alpha = newton_alpha(A.detach(), nonnegative=True)
    mu = 1.0 / (alpha * float(2**iters))  # (..., 1, 1)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    L, info = torch.linalg.cholesky_ex(A @ A + mu * eye)
    if A.device.type == 'cpu' and not (torch.jit.is_tracing()
                                       or torch.compiler.is_compiling()):
        if bool(info.any()):
            raise torch.linalg.LinAlgError(
                f"pinv_method='regularized': the Cholesky factorization of A² + μI "
                f'failed for {int((info > 0).sum())} of {info.numel()} landmark kernels')
    # L·Lᵀ·W = A·Z by two triangular solves (cuBLAS trsm: nothing to check on the host)
    Y = torch.linalg.solve_triangular(L, A @ Z, upper=False)
    W = torch.linalg.solve_triangular(L.transpose(-1, -2), Y, upper=True)
    return torch.where((info == 0)[..., None, None], W, float('nan'))


def newton_pinv_error(A, Y):
    """The paper's convergence metric ||A·Y·A - A||₂ / ||A||₂ (spectral norms), per matrix.

    Args:
        A (Tensor): (..., m, m)
        Y (Tensor): (..., m, m) an approximate pseudo-inverse
    Returns:
        Tensor: (...)
    """
    num = torch.linalg.matrix_norm(A @ Y @ A - A, ord=2)
    return num / torch.linalg.matrix_norm(A, ord=2)


def normalize_inverse(A, A_pinv):
    """Attention normalization D^-1/2 · A⁺ · D^-1/2 with D = diag(A·1) (TPAMI Eq. 25).

    Args:
        A (Tensor): (..., m, m) the landmark kernel
        A_pinv (Tensor): (..., m, m) its pseudo-inverse
    Returns:
        Tensor: (..., m, m)
    """
    d_inv_sqrt = A.sum(-1).to(A_pinv.dtype).rsqrt()
    return d_inv_sqrt.unsqueeze(-1) * A_pinv * d_inv_sqrt.unsqueeze(-2)
