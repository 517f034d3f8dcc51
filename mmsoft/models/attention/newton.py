"""The Newton–Raphson pseudo-inverse of SOFT's landmark kernel (SOFT, IJCV 2024, Alg. 2).

V₀ = αA with a step size α chosen per matrix (``newton_alpha``), then T = 20 steps
V_{k+1} = 2V_k - V_k·A·V_k. The backward pass treats the iterate Y as an exact inverse
(NeurIPS 2021 paper, Eq. 16: ∇A = -Yᵀ·∇Y·Yᵀ) instead of differentiating the 20 steps.

- ``newton_pinv`` / ``newton_iterate``: **the reference**, the official iterate formed in
  float32 (float64 for a float64 kernel), unpadded, one step at a time; the variant
  'iterative' (``Iterative``). Every other variant and the fidelity floor are held to it
  or to its float64 run.
- ``TF32``: the same iterate with TF32 tensor-core products between float32 steps,
  optionally on a zero-padded kernel and with its last float32 steps applied to the thin
  matrix (``_NewtonPinvThin``: one m×m product a step instead of two). Why each option
  and where the figures behind CUDA's values live: docs/en/notes/per_device_plans.md.
- ``Regularized``: the fast mode, a Tikhonov solve standing in for the iterate.

A ``Variant`` computes W = A⁺·Z with its own options and declares where it can run;
which one runs where is the dispatch's (``plan.py``). Shapes: ... leading batch
dimensions, m landmarks.
"""
import importlib.util
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .dtypes import compute_dtype, device_type, is_compiling, new_tf32_flags

__all__ = [
    'ALPHA_BOUND', 'Iterative', 'Regularized', 'TF32', 'Variant', 'first_step_bound',
    'horner_sum', 'newton_alpha', 'newton_iterate', 'newton_pinv', 'newton_pinv_error',
    'normalize_inverse', 'regularized_apply', 'round_tf32'
]

# newton_alpha halves α while ||I - α·A·A||₁ exceeds this
ALPHA_BOUND = 1.01
# ``_thin_costs``: the least cost it counts for one product, in flops: about what an H100
# computes in float32 products in the time an eager operator takes to launch
# (docs/en/notes/per_device_plans.md). Below it, operators cost launches.
LAUNCH_FLOPS = 4e8


# ------------------------------------------------------------------------ a variant
_INSTALLED = {}


def _installed(module):
    """Whether ``module`` can be imported (found once per process)."""
    if module not in _INSTALLED:
        _INSTALLED[module] = importlib.util.find_spec(module) is not None
    return _INSTALLED[module]


class Variant:
    """One way to compute W = A⁺·Z for the symmetric nonnegative landmark kernel A
    (..., m, m) and Z (..., m, n) in A's dtype (float32 or float64), and where it can run.

    Class attributes declare the support (``None``: no restriction); a subclass may add
    reasons in ``not_supported_reasons``.
    """
    name: str = ''
    devices: Optional[Tuple[str, ...]] = None  # device types
    dtypes: Tuple[torch.dtype, ...] = (torch.float32, torch.float64)
    gradients: bool = True  # runs where gradients are needed
    compilable: bool = True  # runs under torch.compile (graph breaks allowed)
    traceable: bool = True  # runs under torch.jit.trace
    capturable: bool = True  # runs inside a CUDA graph capture
    requires: Tuple[str, ...] = ()  # modules it imports

    def apply(self, A, Z, iters):
        """W (..., m, n) for the ``iters``-step iterate A⁺."""
        raise NotImplementedError

    def not_supported_reasons(self, inputs):
        """Why this variant cannot run on ``inputs`` (an ``Inputs``): [] where it can."""
        reasons = []
        if self.devices is not None and inputs.device not in self.devices:
            reasons.append(f'runs on {", ".join(self.devices)}, not {inputs.device}')
        if inputs.dtype not in self.dtypes:
            names = ', '.join(str(d).replace('torch.', '') for d in self.dtypes)
            reasons.append(f'takes {names} kernels, not '
                           f'{str(inputs.dtype).replace("torch.", "")}')
        if inputs.grad and not self.gradients:
            reasons.append('computes no gradients')
        if inputs.compiling and not self.compilable:
            reasons.append('runs eagerly only, not under torch.compile')
        if inputs.tracing and not self.traceable:
            reasons.append('cannot be traced by torch.jit.trace')
        if inputs.capturing and not self.capturable:
            reasons.append('reads values on the host, which a CUDA graph capture cannot')
        reasons += [f'needs {module}, which is not installed' for module in self.requires
                    if not _installed(module)]
        return reasons

    def __repr__(self):
        return f'{type(self).__name__}({self.name!r})'


# ------------------------------------------------------------------------ the step size
def newton_alpha(A, max_halvings=10, nonnegative=False):
    """Initial step α of the Newton–Raphson inverse, chosen per matrix (Alg. 2).

    α = 2 / (max row sum of |A|)², halved while ||I - α·A·A||₁ > ``ALPHA_BOUND`` (at most
    ``max_halvings`` times; ||·||₁ the max column sum of absolute values).

    Args:
        A (Tensor): (..., m, m)
        max_halvings (int): at most this many halvings.
        nonnegative (bool): A is symmetric with nonnegative entries (a Gaussian kernel
            is). Column j of I - α·A² then has the diagonal entry 1 - α·a_j with a_j =
            Σ_k A_jk² and off-diagonal entries of total size α·(s_j - a_j) with s_j =
            (A·(A·1))_j: O(m²) per α instead of forming A·A, every candidate at once,
            decided in float64 (a kernel can sit within float32 rounding of the bound,
            where float32 sums in another order would take one halving more or fewer,
            and α would differ by 2).
    Returns:
        Tensor: (..., 1, 1), one α per matrix (the official code takes one for the whole
        batch, which makes an image's output depend on the others in its batch).
    """
    if nonnegative:
        A64 = A if A.device.type == 'mps' else A.double()  # MPS has no float64
        row_sums = A64.sum(-1, keepdim=True)
        alpha = 2 * row_sums.amax(-2, keepdim=True).pow(-2)  # (..., 1, 1)
        diag = torch.linalg.vector_norm(A64, dim=-1).pow(2)[..., None, :]  # a_j, (..., 1, m)
        off = (A64 @ row_sums).transpose(-1, -2) - diag  # s_j - a_j
        # the candidates α/2^j along a new last dim (powers of two made on A's device: a
        # list would be a host-to-device copy) and ||I - α/2^j·A²||₁ of all but the last
        cand = alpha[..., None] * 0.5**torch.arange(max_halvings + 1, dtype=A64.dtype,
                                                      device=A.device)
        c = cand[..., :-1]
        norms = ((1 - c * diag[..., None]).abs() + c * off[..., None]).amax(-2)
        # the norm is convex in α and 1 at α = 0: the bound holds below any α that meets
        # it, so the halvings are the candidates that miss it
        halvings = (norms > ALPHA_BOUND).sum(-1, keepdim=True)  # (..., 1, 1)
        return cand.gather(-1, halvings[..., None]).squeeze(-1).to(A.dtype)
    alpha = 2 * A.abs().sum(-1, keepdim=True).amax(-2, keepdim=True).pow(-2)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    AA = A @ A
    # a fixed number of steps with torch.where: no data-dependent break, traceable
    for _ in range(max_halvings):
        norm = (eye - alpha * AA).abs().sum(-2).amax(-1)[..., None, None]
        alpha = torch.where(norm > ALPHA_BOUND, alpha / 2, alpha)
    return alpha


def first_step_bound(A, alpha, nonnegative=False):
    """An upper bound on αλ² over the eigenvalues λ of each symmetric matrix of A
    (..., m, m): α·max_j (|A|·(|A|·1))_j, (...,), two matrix–vector products. Below 2 the
    official step size keeps every eigenvalue inside the iterate's region of convergence
    (tools/analysis_tools/newton_convergence.py reports it)."""
    a = A if nonnegative else A.abs()
    s = (a @ a.sum(-1, keepdim=True)).amax((-2, -1))
    return alpha.reshape(s.shape) * s


# ------------------------------------------------------------------------ the steps
def round_tf32(x):
    """float32 values rounded to TF32 (10 mantissa bits, to nearest, ties to even), still
    float32: what a TF32 product of them sees. Tensor cores were measured to round so
    (docs/en/notes/numerics.md); the emulation of 'tf32' off CUDA uses it."""
    if x.dtype != torch.float32:
        raise TypeError(f'round_tf32 rounds float32 tensors, got {x.dtype}')
    bits = x.contiguous().view(torch.int32)
    bias = ((bits >> 13) & 1) + 0x0FFF
    return ((bits + bias) & -0x2000).view(torch.float32)


@contextmanager
def cuda_tf32_matmuls():
    """Let cuBLAS use TF32 for float32 products inside the block (restored after)."""
    mm = torch.backends.cuda.matmul
    if new_tf32_flags():  # torch >= 2.9; mixing fp32_precision with allow_tf32 raises
        old = mm.fp32_precision
        mm.fp32_precision = 'tf32'
        try:
            yield
        finally:
            mm.fp32_precision = old
    else:
        old = mm.allow_tf32
        mm.allow_tf32 = True
        try:
            yield
        finally:
            mm.allow_tf32 = old


def _newton_steps(A, V, schedule):
    """The Newton steps V ← 2V - V·(A·V) of ``schedule``, ((count, precision), ...), on A,
    V (b, m, m), one baddbmm a step, the products in ``precision``: 'float32' (A's dtype)
    or 'tf32' (tensor cores on CUDA and, for operator counts, on the meta device;
    elsewhere emulated by ``round_tf32``; a float64 A runs float64 steps)."""
    for count, precision in schedule:
        if count <= 0:
            continue
        tf32 = precision == 'tf32' and A.dtype == torch.float32
        if tf32 and A.device.type not in ('cuda', 'meta'):  # emulated
            At = round_tf32(A)
            for _ in range(count):
                Vt = round_tf32(V)
                V = torch.baddbmm(V, Vt, round_tf32(At @ Vt), beta=2, alpha=-1)
            continue
        with cuda_tf32_matmuls() if tf32 else nullcontext():
            for _ in range(count):
                V = torch.baddbmm(V, V, A @ V, beta=2, alpha=-1)
    return V


def _flat_padded(A, pad_to=1, *thin):
    """A (..., m, m) with one flat batch dimension, zero-padded to a multiple of
    ``pad_to`` landmarks, and each of ``thin`` (..., m, n) padded with it: (b, m', m'),
    (b, m', n)... A's block never mixes with the zero block, and α is A's, so the
    iterate's leading m×m block is A's iterate."""
    pad = -A.shape[-1] % pad_to
    out = [t.reshape(-1, *t.shape[-2:]) for t in (A, ) + thin]
    if pad:
        out = [F.pad(out[0], (0, pad, 0, pad))] + [F.pad(t, (0, 0, 0, pad)) for t in out[1:]]
    return out


def newton_iterate(A, iters=20, nonnegative=False):
    """The reference iterate Y (..., m, m) of A (..., m, m), formed, in A's dtype: T
    float32 (or float64) steps from V₀ = αA. No autograd (``newton_pinv`` has Eq. 16)."""
    A3 = A.reshape(-1, *A.shape[-2:])
    V = newton_alpha(A, nonnegative=nonnegative).reshape(-1, 1, 1) * A3
    return _newton_steps(A3, V, ((iters, 'float32'), )).reshape(A.shape)


def _check_iters(iters):
    if not isinstance(iters, int) or iters < 0:
        raise ValueError(f'iters must be an int >= 0, got {iters!r}')


class _Pinv(torch.autograd.Function):
    """Y = the reference iterate of A; backward as Eq. 16, ∇A = -Yᵀ·∇Y·Yᵀ."""

    @staticmethod
    def forward(ctx, A, iters, nonnegative):
        Y = newton_iterate(A, iters, nonnegative)
        ctx.save_for_backward(Y)
        return Y

    @staticmethod
    def backward(ctx, grad_Y):
        Yt = ctx.saved_tensors[0].transpose(-1, -2)
        return -Yt @ grad_Y @ Yt, None, None


def newton_pinv(A, iters=20, nonnegative=False):
    """Moore–Penrose inverse of (batched) square matrices by Newton–Raphson iteration:
    the reference (module docstring), with Eq. 16's gradient.

    Args:
        A (Tensor): (..., m, m); run in float32 (float64 for float64), also under
            autocast.
        iters (int): Newton–Raphson steps T (20 in SOFT).
        nonnegative (bool): A is symmetric with nonnegative entries (``newton_alpha``).
    Returns:
        Tensor: (..., m, m)
    """
    _check_iters(iters)
    with torch.autocast(device_type=device_type(A), enabled=False):
        return _Pinv.apply(A.to(compute_dtype(A)), iters, nonnegative)


class _FormedApply(torch.autograd.Function):
    """W = Y·Z for the formed iterate Y = ``form(A)``; backward as Eq. 16 with
    ∇Y = ∇W·Zᵀ: ∇Z = Yᵀ·∇W and ∇A = -Yᵀ·∇Y·Yᵀ = -∇Z·Wᵀ (two thin products)."""

    @staticmethod
    def forward(ctx, A, Z, form):
        Y = form(A)
        W = Y @ Z
        ctx.save_for_backward(Y, W)
        return W

    @staticmethod
    def backward(ctx, grad_W):
        Y, W = ctx.saved_tensors
        grad_Z = Y.transpose(-1, -2) @ grad_W
        return -grad_Z @ W.transpose(-1, -2), grad_Z, None


class Iterative(Variant):
    """The reference as a variant, 'iterative': W = Y·Z for the formed reference iterate Y
    (2T m×m products), Eq. 16's gradients."""
    name = 'iterative'

    def apply(self, A, Z, iters):
        return _FormedApply.apply(A, Z, lambda a: newton_iterate(a, iters, nonnegative=True))


# ------------------------------------------------------------------------ TF32
@dataclass(frozen=True, repr=False)
class TF32(Variant):
    """'tf32': the iterate with TF32 tensor-core products between float32 steps. Native on
    CUDA; elsewhere TF32's rounding is emulated (slow: for checking numerics). Tensor
    cores round float32 operands: float32 kernels only.

    The first float32 steps keep eigenvalues on the step size's boundary (αλ² ≈ 2, the
    near-identity kernels) from being pushed over it by TF32's rounding of V₀, where the
    iterate diverges; the last ones remove TF32's rounding where Newton's step converges
    (it squares the error there). docs/en/notes/numerics.md has the measurements.

    Args:
        float32_steps (tuple[int, int]): float32 steps before and after the TF32 ones
            (the defaults keep the floor with TF32 emulated; CUDA's plan takes its own).
        pad_to (int): run the steps on the kernel zero-padded to a multiple of this
            many landmarks (aligned sizes for tensor cores; the same iterate).
        thin_steps (int): this many of the last float32 steps applied to the thin
            matrix, at most ``float32_steps[1]``.
    """
    float32_steps: Tuple[int, int] = (1, 8)
    pad_to: int = 1
    thin_steps: int = 0
    name = 'tf32'
    dtypes = (torch.float32, )

    def __post_init__(self):
        steps = self.float32_steps
        if (not isinstance(steps, (tuple, list)) or len(steps) != 2
                or any(not isinstance(n, int) or n < 0 for n in steps)):
            raise ValueError(f'float32_steps must be two ints >= 0 (float32 steps before '
                             f'and after the TF32 ones), got {steps!r}')
        object.__setattr__(self, 'float32_steps', tuple(steps))
        if not isinstance(self.pad_to, int) or self.pad_to < 1:
            raise ValueError(f'pad_to must be an int >= 1, got {self.pad_to!r}')
        thin = self.thin_steps
        if not isinstance(thin, int) or not 0 <= thin <= steps[1]:
            raise ValueError(f'thin_steps must be an int from 0 to the last float32 steps '
                             f'({steps[1]}), got {thin!r}')

    def apply(self, A, Z, iters):
        """W = Y·Z, Eq. 16's gradients; the last ``thin_steps`` float32 steps, after at
        least one formed step, applied to Z (``_NewtonPinvThin``), with gradients only
        where that costs less than forming them (``_thin_pays_in_training``)."""
        first = min(self.float32_steps[0], iters)
        last = min(self.float32_steps[1], iters - first)
        schedule = ((first, 'float32'), (iters - first - last, 'tf32'), (last, 'float32'))
        steps = min(self.thin_steps, last, max(iters - 1, 0))
        pad_to = self.pad_to
        grad = torch.is_grad_enabled() and (A.requires_grad or Z.requires_grad)
        if steps and (not grad or _thin_pays_in_training(
                steps, -A.shape[-1] // -pad_to * pad_to, Z.shape[-1], A[..., 0, 0].numel())):
            return _NewtonPinvThin.apply(A, Z, schedule, pad_to, steps, grad, True)

        def form(a):
            m = a.shape[-1]
            A3, = _flat_padded(a, pad_to)
            V = newton_alpha(a, nonnegative=True).reshape(-1, 1, 1) * A3
            return _newton_steps(A3, V, schedule)[:, :m, :m].reshape(a.shape)

        return _FormedApply.apply(A, Z, form)

    def __repr__(self):
        return (f'TF32(float32_steps={self.float32_steps}, pad_to={self.pad_to}, '
                f'thin_steps={self.thin_steps})')


# ------------------------------------------------------------------------ thin steps
def _product_cost(flops):
    """A product's cost in the thin steps' model: its flops, at least ``LAUNCH_FLOPS``."""
    return max(flops, LAUNCH_FLOPS)


def _thin_costs(steps, m, n, b=1):
    """The L thin steps' costs for b kernels m×m and thin matrices of n columns:
    (h, cost of the steps after X_0 with the last h by Horner's rule, cost of an m×m
    product, cost of a thin product). The last h steps' factor Σ_{j<2^h} R^j takes
    2^h - 1 thin products by Horner's rule instead of h m×m and h thin products: flops
    decide on large kernels (m = 1056: all 4 of CUDA's steps), launches on small ones."""
    square, thin = _product_cost(2 * b * m**3), _product_cost(2 * b * m * m * n)

    def cost(h):
        squarings = steps - h - (h == 0)  # X_0 is formed either way
        return squarings * square + (steps - h + 2**h - 1) * thin
    h = min(range(steps + 1), key=cost)
    return h, cost(h), square, thin


def _horner_steps(steps, m, n, b=1):
    """How many of the L thin steps (the last) ``_thin_apply`` applies by Horner's rule."""
    return _thin_costs(steps, m, n, b)[0]


def _thin_pays_in_training(steps, m, n, b=1):
    """Whether L thin steps cost less than forming them where backward is needed (thin:
    X_0, the steps and V's product in each pass; formed: 2L m×m products and Y's thin
    product in each): at SOFT-S's m = 1056 (800×1344) about half; not at m = 256."""
    _, steps_cost, square, thin = _thin_costs(steps, m, n, b)
    return 2 * (square + steps_cost + thin) < 2 * steps * square + 2 * thin


def _thin_apply(left, right, steps, W, h, transpose=False):
    """S·W (Sᵀ·W) for the factor S of the L = ``steps`` thin steps: S = (2I - X_0)···
    (2I - X_{L-h-1})·Σ_{j<2^h} R^j with X_0 = left·right, X_{k+1} = 2X_k - X_k², R =
    I - X_{L-h}; each factor applied as soon as it is formed. The steps stay in X's form:
    where X_k is small its rounding stays one product's, where squaring R would double
    R's rounding at every step. left, right (b, m, m); W (b, m, n)."""
    X = left @ right
    for k in range(steps - h):
        W = torch.baddbmm(W, X.transpose(-1, -2) if transpose else X, W, beta=2, alpha=-1)
        if k + 1 < steps:
            X = torch.baddbmm(X, X, X, beta=2, alpha=-1)
    return horner_sum(W, X, h, transpose)


def horner_sum(W, X, h, transpose=False):
    """Σ_{j<2^h} R^j·W (Rᵀ where ``transpose``) with R = I - X, by Horner's rule: 2^h - 1
    thin products; W for h = 0. X (b, m, m), W (b, m, n)."""
    if not h:
        return W
    R = torch.eye(X.shape[-1], dtype=X.dtype, device=X.device) - X
    R = R.transpose(-1, -2) if transpose else R
    T = W
    for _ in range(2**h - 1):
        T = torch.baddbmm(W, R, T)
    return T


class _NewtonPinvThin(torch.autograd.Function):
    """W = Y·Z with the last L = ``steps`` float32 steps applied to the thin Z.

    With V the iterate L steps before the end and X_0 = A·V, each further step is
    V_{k+1} = V_k·(2I - X_k) with X_{k+1} = 2X_k - X_k² (associativity alone), and
    V·(A·V)^j = (V·A)^j·V, so Y·Z = (2I - X'_0)···(2I - X'_{L-1})·V·Z with X'_0 = V·A:
    V is applied first, then the factors (``_thin_apply``; with gradients the last ones
    by Horner's rule where cheaper, ``_horner_steps``). V first: Horner's sums grow to
    2^h times their input in unconverged directions, and nothing amplifies their
    rounding after them (applied before V, V did).

    Backward as Eq. 16 (Y an exact inverse): ∇Z = Yᵀ·∇W = Sᵀ·(Vᵀ·∇W), ∇A = -∇Z·Wᵀ,
    recomputing X_0 from the saved A and V; Y is never formed. The steps correct the
    formed iterate's rounding as formed steps would, but not their own factors': with
    every step thin (V = αA) the first factor 2I - αA² is near 0 on the step size's
    boundary and its rounding stays, hence at least one formed step first.
    """

    @staticmethod
    def forward(ctx, A, Z, schedule, pad_to, steps, horner, nonnegative):
        m = A.shape[-1]
        alpha = newton_alpha(A, nonnegative=nonnegative)
        A3, Z3 = _flat_padded(A, pad_to, Z)
        V = alpha.reshape(-1, 1, 1) * A3
        (first, _), (middle, _), (last, _) = schedule  # the last ``steps`` applied thin
        V = _newton_steps(A3, V, ((first, 'float32'), (middle, 'tf32'),
                                  (last - steps, 'float32')))
        h = _horner_steps(steps, A3.shape[-1], Z3.shape[-1], A3.shape[0]) if horner else 0
        W = _thin_apply(V, A3, steps, V @ Z3, h)[:, :m].reshape(Z.shape)
        ctx.steps, ctx.pad_to, ctx.h = steps, pad_to, h
        ctx.save_for_backward(A, V, W)
        return W

    @staticmethod
    def backward(ctx, grad_W):
        A, V, W = ctx.saved_tensors
        m = A.shape[-1]
        A3, G3 = _flat_padded(A, ctx.pad_to, grad_W)
        grad_Z = _thin_apply(A3, V, ctx.steps, V.transpose(-1, -2) @ G3, ctx.h,
                             transpose=True)
        grad_Z = grad_Z[:, :m].reshape(grad_W.shape)
        return -grad_Z @ W.transpose(-1, -2), grad_Z, None, None, None, None, None


# ------------------------------------------------------------------------ the rest
def regularized_apply(A, Z, iters=20):
    """Fast mode: (A² + μI)⁻¹·A·Z with μ = 1 / (α·2^T), by one Cholesky factorization.

    T Newton steps filter an eigenvalue λ to (1 - (1 - αλ²)^(2^T)) / λ ≈
    (1 - exp(-λ²/μ)) / λ; the Tikhonov filter λ / (λ² + μ) has the same two limits (the
    inverse for λ² ≫ μ, α·2^T·λ for λ² ≪ μ) and deviates most where λ² ≈ μ: their ratio
    x / ((1 + x)·(1 - e^-x)), x = λ²/μ, is least, 0.77, near x = 1.8
    (``tools/analysis_tools/benchmark.py --sections modes`` reports the outputs'
    deviation: docs/en/benchmarks.md). Gradients by autograd through the solve. A
    factorization that fails in floating point raises on the CPU; elsewhere checking would
    synchronize with the host in every call, so that matrix's output is NaN instead.
    """
    alpha = newton_alpha(A.detach(), nonnegative=True)
    mu = 1.0 / (alpha * float(2**iters))  # (..., 1, 1)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    L, info = torch.linalg.cholesky_ex(A @ A + mu * eye)
    if A.device.type == 'cpu' and not (torch.jit.is_tracing() or is_compiling()):
        if bool(info.any()):
            raise torch.linalg.LinAlgError(
                f"pinv_method='regularized': the Cholesky factorization of A² + μI "
                f'failed for {int((info > 0).sum())} of {info.numel()} landmark kernels')
    Y = torch.linalg.solve_triangular(L, A @ Z, upper=False)
    W = torch.linalg.solve_triangular(L.transpose(-1, -2), Y, upper=True)
    return torch.where((info == 0)[..., None, None], W, float('nan'))


class Regularized(Variant):
    """Fast mode, not the iterate, 'regularized': ``regularized_apply``."""
    name = 'regularized'

    def apply(self, A, Z, iters):
        return regularized_apply(A, Z, iters)


def newton_pinv_error(A, Y):
    """The paper's convergence metric ||A·Y·A - A||₂ / ||A||₂ (spectral norms), per
    matrix: A, Y (..., m, m) -> (...)."""
    num = torch.linalg.matrix_norm(A @ Y @ A - A, ord=2)
    return num / torch.linalg.matrix_norm(A, ord=2)


def normalize_inverse(A, A_pinv):
    """Attention normalization D^-1/2·A⁺·D^-1/2 with D = diag(A·1) (IJCV 2024, Eq. 25):
    A, A_pinv (..., m, m) -> (..., m, m)."""
    d_inv_sqrt = A.sum(-1).to(A_pinv.dtype).rsqrt()
    return d_inv_sqrt.unsqueeze(-1) * A_pinv * d_inv_sqrt.unsqueeze(-2)
