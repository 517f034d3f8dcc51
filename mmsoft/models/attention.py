"""The attention math of both backbone families, as plain functions.

SOFT (SPEC 1.1, TPAMI paper Eq. 5, Alg. 2, Eq. 16, Eq. 25):
    ``gaussian_kernel``      κ(a, b) = exp(-||a - b||² / 2) between two token sets
    ``newton_pinv``          Moore–Penrose inverse by Newton–Raphson iteration, per matrix
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
    'normalize_inverse', 'soft_attention', 'sima_attention'
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
    # -||a - b||²/2 = a·b - |a|²/2 - |b|²/2; clamp at 0 against rounding above 0.
    logits = (a @ b.transpose(-1, -2) - 0.5 * a_sq - 0.5 * b_sq).clamp(max=0)
    return logits.exp()


def newton_alpha(A, max_halvings=10):
    """Initial step α of the Newton–Raphson inverse, chosen per matrix (SPEC 1.1 step 5).

    α = 2 / (max row sum of |A|)², halved while ||I - α·A·A||₁ > 1.01 (at most
    ``max_halvings`` times). ||·||₁ is the max column sum of absolute values.

    Args:
        A (Tensor): (..., m, m)
    Returns:
        Tensor: (..., 1, 1) α for every matrix of the batch (not one α for the whole batch,
        which would make one image's output depend on the others in its batch).
    """
    m = A.shape[-1]
    alpha = 2.0 / A.abs().sum(-1).amax(-1).pow(2)  # (...)
    alpha = alpha[..., None, None]
    eye = torch.eye(m, dtype=A.dtype, device=A.device)
    AA = A @ A
    # A fixed number of steps with torch.where (no data-dependent break): the result is
    # the same (α stops halving once the bound holds) and the graph stays traceable.
    for _ in range(max_halvings):
        err = (eye - alpha * AA).abs().sum(-2).amax(-1)[..., None, None]
        alpha = torch.where(err > 1.01, alpha / 2, alpha)
    return alpha


def _pinv_iterative(A, alpha, iters):
    """V₀ = αA; V_{k+1} = 2V_k - V_k·A·V_k (paper Alg. 2, alternative form)."""
    V = alpha * A
    for _ in range(iters):
        V = 2 * V - V @ (A @ V)
    return V


def _pinv_spectral(A, alpha, iters):
    """The same T-step iterate, evaluated through the eigendecomposition of symmetric A.

    Every iterate is a polynomial in A, so on an eigenpair (λ, u) of A it acts as
    v_T(λ) = (1 - (1 - αλ²)^(2^T)) / λ, with v_T(λ) → α·λ·2^T as λ → 0 (SPEC 1.1).
    """
    lam, U = torch.linalg.eigh(A)
    a = alpha.squeeze(-1)
    x = a * lam * lam  # αλ², (..., m)
    # (1 - x)^(2^T) = exp(2^T · log|1 - x|) (2^T is even); log1p keeps small x exact.
    tiny = torch.finfo(A.dtype).tiny
    log_base = torch.where(x < 0.5, torch.log1p(-x.clamp(max=0.5)),
                           torch.log((1 - x).abs().clamp_min(tiny)))
    one_minus = -torch.expm1(log_base * float(2**iters))  # 1 - (1 - x)^(2^T)
    nonzero = lam != 0
    v = torch.where(nonzero, one_minus / torch.where(nonzero, lam, torch.ones_like(lam)),
                    a * lam * float(2**iters))
    return (U * v.unsqueeze(-2)) @ U.transpose(-1, -2)


class _NewtonPinv(torch.autograd.Function):
    """A⁺ by Newton–Raphson; backward treats A⁺ as an exact inverse (paper Eq. 16)."""

    @staticmethod
    def forward(ctx, A, iters, method):
        alpha = newton_alpha(A)
        if method == 'iterative':
            Y = _pinv_iterative(A, alpha, iters)
        else:
            Y = _pinv_spectral(A, alpha, iters)
        ctx.save_for_backward(Y)
        return Y

    @staticmethod
    def backward(ctx, grad_Y):
        Y, = ctx.saved_tensors
        Yt = Y.transpose(-1, -2)
        return -Yt @ grad_Y @ Yt, None, None


# Above this many landmarks one eigendecomposition beats 2T = 40 batched matrix products
# (measured on CPU with tools/benchmark.py --sections pinv).
SPECTRAL_MIN_SIZE = 128
PINV_METHODS = ('auto', 'iterative', 'spectral')


def newton_pinv(A, iters=20, method='auto'):
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
    Returns:
        Tensor: (..., m, m) in A's floating dtype promoted to at least float32.
    """
    if method not in PINV_METHODS:
        raise ValueError(f'method must be one of {PINV_METHODS}, got {method!r}')
    if method == 'auto':
        method = 'spectral' if A.shape[-1] > SPECTRAL_MIN_SIZE else 'iterative'
    if iters < 0:
        raise ValueError(f'iters must be >= 0, got {iters}')
    dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=_device_type(A), enabled=False):
        return _NewtonPinv.apply(A.to(dtype), iters, method)


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

    Args:
        q (Tensor): (..., N, d) queries (= keys), already scaled by d^(-1/4)
        landmarks (Tensor): (..., m, d) bottleneck tokens Q̃
        v (Tensor): (..., N, d) values
        iters (int): Newton–Raphson steps.
        normalize (bool): apply D^-1/2 A⁺ D^-1/2 (TPAMI Eq. 25); off reproduces the
            un-normalized SOFT of the NeurIPS paper (Table 10 ablation).
        pinv_method (str): see ``newton_pinv``.
    Returns:
        Tensor: (..., N, d)
    """
    P = gaussian_kernel(q, landmarks)  # (..., N, m), computed once per layer
    # The small m×m landmark kernel and its inverse always stay in float32.
    with torch.autocast(device_type=_device_type(q), enabled=False):
        lm = landmarks.float() if landmarks.dtype != torch.float64 else landmarks
        A = gaussian_kernel(lm, lm)  # (..., m, m)
        A_pinv = newton_pinv(A, iters=iters, method=pinv_method)
        if normalize:
            A_pinv = normalize_inverse(A, A_pinv)
    A_pinv = A_pinv.to(P.dtype)
    return P @ (A_pinv @ (P.transpose(-1, -2) @ v))


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
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        q = F.normalize(q.to(dtype), p=1, dim=-2)
        k = F.normalize(k.to(dtype), p=1, dim=-2)
        v = v.to(dtype)
        N, d = q.shape[-2], q.shape[-1]
        if order == 'qk_first' or (order == 'auto' and N < d):
            out = (q @ k.transpose(-1, -2)) @ v
        else:
            out = q @ (k.transpose(-1, -2) @ v)
    return out

