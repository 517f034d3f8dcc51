"""The attention math of both backbone families, as plain functions.

SOFT (SPEC 1.1, TPAMI paper Eq. 5, Alg. 2, Eq. 16, Eq. 25):
    ``gaussian_kernel``      κ(a, b) = exp(-||a - b||² / 2) between two token sets
    ``newton_pinv``          Moore–Penrose inverse by Newton–Raphson iteration, per matrix
    ``regularized_apply``    fast mode: a Tikhonov solve standing in for the iterate
    ``normalize_inverse``    attention normalization D^-1/2 A⁺ D^-1/2
    ``soft_attention``       P·Â·(Pᵀ·V) computed as P·(Â·(Pᵀ·V))

SimA (SPEC 2.1):
    ``sima_attention``       L1-normalized q, k over tokens, no softmax

Shapes use B batch, h heads, N tokens, m landmarks, d head dim. Every function works on
any leading batch dimensions (``...``).
"""
import torch
import torch.nn.functional as F

__all__ = [
    'gaussian_kernel', 'newton_alpha', 'newton_pinv', 'newton_pinv_error',
    'normalize_inverse', 'regularized_apply', 'soft_attention', 'sima_attention'
]


def _device_type(t):
    """The autocast device type of a tensor (autocast knows cpu, cuda, xpu, ...)."""
    return t.device.type if t.device.type in ('cuda', 'cpu', 'xpu', 'mps') else 'cpu'


# ---------------------------------------------------------------------------------------
# SOFT
# ---------------------------------------------------------------------------------------


def gaussian_kernel(a, b):
    """Gaussian kernel exp(-||a_i - b_j||² / 2) (paper Eq. 5 on d^(1/4)-scaled vectors).

    Args:
        a (Tensor): (..., N, d)
        b (Tensor): (..., M, d)
    Returns:
        Tensor: (..., N, M)
    """
    a_sq = a.pow(2).sum(-1, keepdim=True)  # (..., N, 1)
    b_sq = b.pow(2).sum(-1).unsqueeze(-2)  # (..., 1, M)
    # -||a - b||²/2 = a·b - |a|²/2 - |b|²/2; clamp at 0 against rounding above 0. The
    # (N, M) product is updated in place: at detection sizes it is the largest tensor of
    # the layer, and every extra copy of it costs memory traffic.
    logits = a @ b.transpose(-1, -2)
    return logits.sub_(0.5 * a_sq).sub_(0.5 * b_sq).clamp_(max=0).exp_()


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
            O(m²) per α instead of forming A·A (O(m³)) and an m×m residual per halving.
    Returns:
        Tensor: (..., 1, 1) α for every matrix of the batch (not one α for the whole batch,
        which would make one image's output depend on the others in its batch).
    """
    alpha = 2.0 / A.abs().sum(-1).amax(-1).pow(2)  # (...)
    alpha = alpha[..., None, None]
    if nonnegative:
        diag = A.pow(2).sum(-1)[..., None, :]  # a_j, (..., 1, m)
        off = (A @ A.sum(-1, keepdim=True)).transpose(-1, -2) - diag  # s_j - a_j

        def residual_norm(alpha):
            return ((1 - alpha * diag).abs() + alpha * off).amax(-1, keepdim=True)
    else:
        eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        AA = A @ A

        def residual_norm(alpha):
            return (eye - alpha * AA).abs().sum(-2).amax(-1)[..., None, None]

    # A fixed number of steps with torch.where (no data-dependent break): the result is
    # the same (α stops halving once the bound holds) and the graph stays traceable.
    for _ in range(max_halvings):
        alpha = torch.where(residual_norm(alpha) > 1.01, alpha / 2, alpha)
    return alpha


def _iterate(A, alpha, iters):
    """V₀ = αA; V_{k+1} = 2V_k - V_k·A·V_k (paper Alg. 2, alternative form)."""
    V = alpha * A
    for _ in range(iters):
        V = 2 * V - V @ (A @ V)
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


class _NewtonInverse:
    """The T-step Newton–Raphson iterate Y of A, kept in whichever form is cheaper.

    'iterative' keeps Y itself (2T matrix products); 'spectral' keeps A's eigenvectors U
    and v_T of its eigenvalues, Y = U·diag(v)·Uᵀ, which can be applied to a thin matrix
    without ever forming Y.
    """

    def __init__(self, A, iters, method, nonnegative):
        alpha = newton_alpha(A, nonnegative=nonnegative)
        self.method = method
        if method == 'iterative':
            self.Y = _iterate(A, alpha, iters)
        else:
            lam, self.U = torch.linalg.eigh(A)
            self.v = _spectral_filter(lam, alpha, iters)

    def matrix(self):
        if self.method == 'iterative':
            return self.Y
        return (self.U * self.v.unsqueeze(-2)) @ self.U.transpose(-1, -2)

    def apply(self, Z, transpose=False):
        """Y·Z (or Yᵀ·Z) for Z of shape (..., m, n)."""
        if self.method == 'iterative':
            return (self.Y.transpose(-1, -2) if transpose else self.Y) @ Z
        return self.U @ (self.v.unsqueeze(-1) * (self.U.transpose(-1, -2) @ Z))


class _NewtonPinv(torch.autograd.Function):
    """Y = A⁺ by Newton–Raphson; backward treats Y as an exact inverse (paper Eq. 16)."""

    @staticmethod
    def forward(ctx, A, iters, method, nonnegative):
        Y = _NewtonInverse(A, iters, method, nonnegative).matrix()
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
        inv = _NewtonInverse(A, iters, method, nonnegative)
        W = inv.apply(Z)
        ctx.inv = inv
        ctx.save_for_backward(W)
        return W

    @staticmethod
    def backward(ctx, grad_W):
        W, = ctx.saved_tensors
        grad_Z = ctx.inv.apply(grad_W, transpose=True)
        del ctx.inv
        return -grad_Z @ W.transpose(-1, -2), grad_Z, None, None, None


# Above this many landmarks one eigendecomposition beats 2T = 40 batched matrix products
# (measured on CPU with tools/benchmark.py --sections pinv).
SPECTRAL_MIN_SIZE = 128
# 'regularized' is a fast mode: not the T-step iterate (see ``regularized_apply``).
PINV_METHODS = ('auto', 'iterative', 'spectral', 'regularized')


def _resolve_method(method, m, iters):
    if method not in PINV_METHODS:
        raise ValueError(f'method must be one of {PINV_METHODS}, got {method!r}')
    if iters < 0:
        raise ValueError(f'iters must be >= 0, got {iters}')
    if method == 'auto':
        method = 'spectral' if m > SPECTRAL_MIN_SIZE else 'iterative'
    return method


def _float_dtype(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def newton_pinv(A, iters=20, method='auto', nonnegative=False):
    """Moore–Penrose inverse of (batched) square matrices by Newton–Raphson iteration.

    The result equals ``iters`` steps of V_{k+1} = 2V_k - V_k·A·V_k from V₀ = αA with a
    per-matrix α (``newton_alpha``). Gradients follow paper Eq. 16 (∇A = -Yᵀ·∇Y·Yᵀ)
    rather than back-propagating through the iterations. Always computed in float32 (or
    float64 if A is float64), also under autocast.

    Args:
        A (Tensor): (..., m, m)
        iters (int): number of Newton–Raphson steps T (20 in SOFT).
        method (str): 'iterative' runs the T matrix iterations; 'spectral' evaluates the
            same T-step iterate through ``torch.linalg.eigh`` (A must be symmetric, as the
            Gaussian kernel of landmarks is). Both give the same value up to rounding;
            'spectral' costs one eigendecomposition instead of 2T matrix products, much
            less for large m. 'auto' takes 'spectral' when m > ``SPECTRAL_MIN_SIZE``.
            ('regularized' exists only for ``soft_attention``.)
        nonnegative (bool): A is symmetric with nonnegative entries; α is then found in
            O(m²) (same value, see ``newton_alpha``).
    Returns:
        Tensor: (..., m, m) in A's floating dtype promoted to at least float32.
    """
    method = _resolve_method(method, A.shape[-1], iters)
    if method == 'regularized':
        raise ValueError("method='regularized' never forms the inverse; it is only "
                         'available in soft_attention')
    with torch.autocast(device_type=_device_type(A), enabled=False):
        return _NewtonPinv.apply(A.to(_float_dtype(A)), iters, method, nonnegative)


def regularized_apply(A, Z, iters=20):
    """Fast mode: (A² + μI)⁻¹·A·Z with μ = 1 / (α·2^T), by one Cholesky factorization.

    T Newton steps filter an eigenvalue λ of A to (1 - (1 - αλ²)^(2^T)) / λ ≈
    (1 - exp(-λ²/μ)) / λ: the exact inverse for λ² ≫ μ, α·2^T·λ for λ² ≪ μ. The
    Tikhonov filter λ / (λ² + μ) has the same two limits, so with this μ it is a close
    stand-in (it deviates most, by up to ~20 % on that eigen-component, where λ² ≈ μ);
    ``tools/benchmark.py --sections modes`` reports the resulting output deviation.
    One m×m product and one Cholesky factorization replace the eigendecomposition;
    gradients are exact for this filter (autograd through the solve).
    """
    alpha = newton_alpha(A.detach(), nonnegative=True)
    mu = 1.0 / (alpha * float(2**iters))  # (..., 1, 1)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    L = torch.linalg.cholesky(A @ A + mu * eye)
    return torch.cholesky_solve(A @ Z, L)


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


def soft_attention(q, landmarks, v, iters=20, normalize=True, pinv_method='auto'):
    """Softmax-free attention P·Â·(Pᵀ·V) with the symmetric Gaussian kernel (K = Q).

    Computed as P·(Â·(Pᵀ·V)): O(N·m·d + m²·d) instead of the O(N·m²) of forming P·Â.
    Â = D^-1/2·A⁺·D^-1/2 is never formed either: D^-1/2 scales the thin m×d matrices and
    A⁺ is applied to them (through A's eigenvectors for the spectral method).

    Args:
        q (Tensor): (..., N, d) queries (= keys), already scaled by d^(-1/4)
        landmarks (Tensor): (..., m, d) bottleneck tokens Q̃
        v (Tensor): (..., N, d) values
        iters (int): Newton–Raphson steps.
        normalize (bool): apply D^-1/2 A⁺ D^-1/2 (TPAMI Eq. 25); off reproduces the
            un-normalized SOFT of the NeurIPS paper (Table 10 ablation).
        pinv_method (str): 'auto', 'iterative' or 'spectral' (the T-step iterate, see
            ``newton_pinv``) or the fast mode 'regularized' (see ``regularized_apply``).
    Returns:
        Tensor: (..., N, d)
    """
    method = _resolve_method(pinv_method, landmarks.shape[-2], iters)
    P = gaussian_kernel(q, landmarks)  # (..., N, m), computed once per layer
    Z = P.transpose(-1, -2) @ v  # (..., m, d)
    # The small m×m landmark kernel and its inverse always stay in float32.
    with torch.autocast(device_type=_device_type(q), enabled=False):
        dtype = _float_dtype(landmarks)
        lm = landmarks.to(dtype)
        A = gaussian_kernel(lm, lm)  # (..., m, m)
        Z = Z.to(dtype)
        if normalize:
            d_inv_sqrt = A.sum(-1, keepdim=True).rsqrt()  # (..., m, 1)
            Z = d_inv_sqrt * Z
        if method == 'regularized':
            W = regularized_apply(A, Z, iters)
        else:
            W = _NewtonPinvApply.apply(A, Z, iters, method, True)
        if normalize:
            W = d_inv_sqrt * W
    return P @ W.to(P.dtype)


# ---------------------------------------------------------------------------------------
# SimA
# ---------------------------------------------------------------------------------------


def sima_attention(q, k, v, order='auto'):
    """SimA: L1-normalize q and k over the token axis, then (q̂·k̂ᵀ)·v without softmax.

    The products always run in (at least) float32, also under autocast, and the result
    stays float32: its magnitude shrinks like d/N and would underflow half precision at
    detection resolutions.

    Args:
        q, k, v (Tensor): (..., N, d)
        order (str): 'auto' picks the cheaper product — (q̂·k̂ᵀ)·v if N < d, else
            q̂·(k̂ᵀ·v) — as the official code does; 'qk_first' / 'kv_first' force one.
    Returns:
        Tensor: (..., N, d), float32 (float64 for float64 inputs).
    """
    if order not in ('auto', 'qk_first', 'kv_first'):
        raise ValueError(f"order must be 'auto', 'qk_first' or 'kv_first', got {order!r}")
    with torch.autocast(device_type=_device_type(q), enabled=False):
        dtype = _float_dtype(q)
        q = F.normalize(q.to(dtype), p=1, dim=-2)
        k = F.normalize(k.to(dtype), p=1, dim=-2)
        v = v.to(dtype)
        N, d = q.shape[-2], q.shape[-1]
        if order == 'qk_first' or (order == 'auto' and N < d):
            out = (q @ k.transpose(-1, -2)) @ v
        else:
            out = q @ (k.transpose(-1, -2) @ v)
    return out

