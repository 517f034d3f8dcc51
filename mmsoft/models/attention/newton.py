"""The Newton–Raphson pseudo-inverse of SOFT's landmark kernel.

Paper Alg. 2 ("alternative form"): V₀ = αA, V_{k+1} = 2V_k - V_k·A·V_k for T = 20 steps,
α chosen per matrix (``step_size.py``); paper Eq. 16 for the backward pass. Each method
below computes that same T-step iterate Y (``EXACT_PINV_METHODS``); they differ in cost
per device:

    'iterative'  the matrix iteration in float32: 2T products of m×m matrices (formed,
                 as training keeps it for backward). The reference: the official code's
                 iteration.
    'spectral'   one eigendecomposition of A, the iterate's filter on its eigenvalues,
                 applied to the thin matrix (``spectral.py``): for a float32 A in
                 float32 where a first-order error bound allows it, the Perron eigenpair
                 split off in float64 first, float64 elsewhere; a float64 A in float64.
    'tf32'       the iteration with TF32 tensor-core products (CUDA) between float32
                 steps: ``tf32_float32_steps`` = (first, last) float32 steps. The first
                 float32 step keeps eigenvalues on the step size's boundary (αλ² ≈ 2,
                 near-identity kernels) from being pushed over it by TF32 rounding,
                 where the iterate diverges; the last ones correct the TF32 rounding in
                 the converged directions (``_schedule``). Off CUDA the TF32 rounding is
                 emulated (``round_tf32``, to nearest, as an H200's tensor cores were
                 measured to round; slow, for checking numerics). Float32 kernels only.

The functions here take every choice as an argument and read no plan; which method runs
where is the dispatch's (``dispatch.py``) and the device's plan's (``plan.py``).

The iterations can run on A zero-padded to a multiple of ``pad_to`` landmarks (aligned
sizes for tensor cores): A's block never mixes with the zero block and α is unchanged,
so the iterate is the same. The last ``thin_steps`` float32 steps of 'iterative' or
'tf32' can be applied to the thin matrix instead of forming the iterate
(``_NewtonPinvThin``: the same steps, one m×m product each instead of two, and thin
products); with gradients too where that costs less, and there, on large kernels, with
one m×m product for all of them (Horner's rule on their sum).

How the m×m products are made is a ``Products`` object (``newton_pinv_apply``'s
``products``): the library's by default; a variant outside the library can hand in its
own (``projects/``).

Accuracy is judged on the network's outputs (docs/en/notes/numerics.md): each output
map of a default path within 1e-5 of the float64 computation in the official order, on
real images, and a training step's gradients within 1e-4
(``tests/models/backbones/test_fidelity.py``). On landmark kernels that are hard for
float32 (clustered, pooled, duplicated, near-rank-1 and near-identity landmarks) every
path stays finite and within 1e-3 of the float64 iterate, or within 2× the official
float32 iteration's deviation where that itself misses 1e-3
(``tests/models/attention/test_attention.py``).

'regularized' (``regularized_apply``) is a fast mode that is *not* the iterate.
Shapes: ... leading batch dimensions, m landmarks.
"""
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from .dtypes import compute_dtype, device_type, is_compiling, new_tf32_flags
from .spectral import _mixed_spectral_factors, _spectral_factors, apply_factors
from .step_size import newton_alpha

__all__ = [
    'EXACT_PINV_METHODS', 'Products', 'check_pinv_options', 'check_thin_steps', 'newton_pinv',
    'newton_pinv_apply', 'newton_pinv_error', 'normalize_inverse', 'regularized_apply',
    'round_tf32'
]

# The ways to compute the same T-step iterate (module docstring).
EXACT_PINV_METHODS = ('iterative', 'spectral', 'tf32')
# Those whose iteration ends in float32 steps, which ``thin_steps`` can apply thin
THIN_STEP_METHODS = ('iterative', 'tf32')
# 'tf32''s float32 steps (first, last) where a caller gives none (every plan's too,
# unless it says otherwise; the measurements behind them are beside the plans in
# ``plan.py``).
TF32_FLOAT32_STEPS = (1, 8)


def check_pinv_options(tf32_float32_steps, pad_to, pad_name='pad_to', products=None):
    """The options of how an iterate is computed besides its method (``newton_pinv``'s
    arguments, a plan's fields), checked: {tf32_float32_steps (a tuple), pad_to,
    products (a ``Products``; None: the library's)}. ``pad_name`` names the padding in
    the error (the argument or the plan's field)."""
    steps = tf32_float32_steps
    if (not isinstance(steps, (tuple, list)) or len(steps) != 2
            or any(not isinstance(n, int) or n < 0 for n in steps)):
        raise ValueError(f'tf32_float32_steps must be two ints >= 0 (float32 steps before '
                         f'and after the TF32 ones), got {steps!r}')
    if not isinstance(pad_to, int) or pad_to < 1:
        raise ValueError(f'{pad_name} must be an int >= 1, got {pad_to!r}')
    if products is None:
        products = LIBRARY_PRODUCTS
    elif not isinstance(products, Products):
        raise TypeError(f'products must be a newton.Products, got {type(products).__name__}')
    return dict(tf32_float32_steps=tuple(steps), pad_to=pad_to, products=products)


def check_thin_steps(thin_steps, method, tf32_float32_steps, iters=None):
    """``thin_steps`` checked for ``method``: an int >= 0, and at most the float32 steps
    the iteration ends with (all of 'iterative''s ``iters``, the last of 'tf32''s
    ``tf32_float32_steps``); the other methods (``THIN_STEP_METHODS``) take none."""
    if not isinstance(thin_steps, int) or thin_steps < 0:
        raise ValueError(f'thin_steps must be an int >= 0, got {thin_steps!r}')
    if not thin_steps:
        return thin_steps
    if method not in THIN_STEP_METHODS:
        raise ValueError(f"thin_steps: {method!r} has no float32 steps to apply to the thin "
                         f'matrix, got {thin_steps}')
    if method == 'tf32' and thin_steps > tf32_float32_steps[1]:
        raise ValueError(f"thin_steps: 'tf32' ends with {tf32_float32_steps[1]} float32 "
                         f'steps (tf32_float32_steps={tuple(tf32_float32_steps)}), got '
                         f'{thin_steps} (a plan with fewer last steps needs thin_steps lowered '
                         f'with them)')
    if iters is not None and thin_steps > iters:
        raise ValueError(f'thin_steps: the iteration has {iters} steps, got {thin_steps}')
    return thin_steps


def _check_method(method, iters, allowed=EXACT_PINV_METHODS):
    if method not in allowed:
        raise ValueError(f'method must be one of {allowed}, got {method!r}')
    if iters < 0:
        raise ValueError(f'iters must be >= 0, got {iters}')


# ``_horner_steps``: the least cost it counts for one product, in flops: about what an
# H100 computes in float32 products (~40 TFLOP/s reached, docs/en/notes/per_device_plans.md)
# in the ~10 µs an eager operator takes to launch. Below it, operators cost launches.
LAUNCH_FLOPS = 4e8

def round_tf32(x):
    """float32 values rounded to TF32 (10 mantissa bits, round to nearest, ties to even),
    still stored as float32: exact in a TF32 product, whatever conversion it applies. On
    an H200 a TF32 product matched the product of operands rounded so (2.8e-6-3.2e-6 of
    its largest entry, float32's own summation) and not that of operands cut to TF32
    (8e-4-9e-4; docs/benchmark/cuda_h200/report.md): the emulation of 'tf32' rounds."""
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


def _newton_steps(A, V, steps, precision='float32'):
    """``steps`` steps V ← 2V - V·(A·V) (Alg. 2) with products in ``precision``:
    'float32' (A's dtype) or 'tf32' (TF32 tensor-core products on CUDA; elsewhere
    emulated, the operands rounded to TF32 by ``round_tf32``, float32 sums). Tensor cores
    round float32 operands only: a float64 A runs every step in float64. A, V: (b, m, m)
    with one flat batch dimension (baddbmm: one launch for 2V - V·AV)."""
    if steps <= 0:
        return V
    if precision == 'float32' or A.dtype != torch.float32:
        for _ in range(steps):
            V = torch.baddbmm(V, V, A @ V, beta=2, alpha=-1)
        return V
    if A.device.type in ('cuda', 'meta'):  # meta: what CUDA runs (operator counts)
        with cuda_tf32_matmuls():
            return _newton_steps(A, V, steps)
    A = round_tf32(A)
    for _ in range(steps):
        Vt = round_tf32(V)
        V = torch.baddbmm(V, Vt, round_tf32(A @ Vt), beta=2, alpha=-1)
    return V


def _schedule(method, iters, tf32_float32_steps):
    """The iteration's steps as [(count, precision), ...] (``_newton_steps``).

    'tf32': (first, last) = ``tf32_float32_steps`` float32 steps around T - first - last
    TF32 steps. Why float32 at both ends (hard kernels, emulated TF32;
    docs/en/notes/numerics.md):

    - first: on near-identity kernels (landmarks far apart) the top eigenvalues sit on
      the boundary of the official step size, αλ² ≈ 2 (1 - αλ² ≈ -1). Rounding V₀ = αA to
      TF32 can push αλ² over 2, after which the step squares |1 - λv| > 1 and the iterate
      diverges (to inf within 20 steps). One float32 step maps them to 1 - λv ≈ +1,
      from where TF32 rounding no longer diverges.
    - last: Newton's step squares the error in converged directions (E → -E·A·E), so
      float32 steps at the end remove most TF32 rounding there; with none, hard kernels
      end 1.5e-3–2.6e-3 from the float64 iterate with operands cut to TF32, with two,
      within 3.1e-4 (on an H200's tensor cores, with one, within 2.7e-4). CUDA's plan
      takes 4, the fewest that keep SOFT-S's output floor on CUDA; elsewhere, where
      TF32 is emulated, the default is 8 (``plan.py``).
    """
    if method == 'iterative':
        return [(iters, 'float32')]
    first = min(tf32_float32_steps[0], iters)
    last = min(tf32_float32_steps[1], iters - first)
    return [(first, 'float32'), (iters - first - last, 'tf32'), (last, 'float32')]


def _padded(A, pad_to):
    """A (..., m, m) zero-padded to a multiple of ``pad_to`` landmarks. The iterations from
    V₀ = αA (α of the unpadded A) give the same iterate in the leading m×m block: A's
    block never mixes with the zero block, which stays zero."""
    pad = -A.shape[-1] % pad_to
    return F.pad(A, (0, pad, 0, pad)) if pad else A


class _NewtonInverse:
    """The T-step iterate Y of A (..., m, m), kept in whichever form is cheaper to apply.

    'iterative' / 'tf32' keep Y itself (``factors`` = (Y,)); 'spectral' keeps
    A's eigenvectors U and v_T of its eigenvalues (``factors`` = (U, v), Y = U·diag(v)·Uᵀ,
    ``_spectral_factors``), which is applied to a thin matrix without forming Y. The
    factors are plain tensors, so an autograd Function can save them for backward
    (``save_for_backward``).
    """

    def __init__(self, method, *factors):
        self.method, self.factors = method, factors

    @classmethod
    def of(cls, A, iters, method, nonnegative, options):
        if method == 'spectral' and A.dtype == torch.float32:  # α from its float64 copy
            return cls(method, *_mixed_spectral_factors(A, iters, nonnegative))
        alpha = newton_alpha(A, nonnegative=nonnegative)
        if method == 'spectral':  # a float64 A: in float64
            return cls(method, *_spectral_factors(A, alpha, iters))
        m = A.shape[-1]
        A3 = _padded(A, options['pad_to'])
        A3 = A3.reshape(-1, *A3.shape[-2:])  # (b, m', m')
        V = alpha.reshape(-1, 1, 1) * A3
        for steps, precision in _schedule(method, iters, options['tf32_float32_steps']):
            V = options['products'].steps(A3, V, steps, precision)
        return cls(method, V[:, :m, :m].reshape(A.shape))

    def matrix(self, dtype):
        """Y in ``dtype`` (A's)."""
        if self.method == 'spectral':
            U, v = self.factors
            return ((U * v.unsqueeze(-2)) @ U.transpose(-1, -2)).to(dtype)
        return self.factors[0]

    def apply(self, Z, transpose=False):
        """Y·Z (or Yᵀ·Z) for Z of shape (..., m, n), in Z's dtype."""
        if self.method == 'spectral':
            return apply_factors(*self.factors, Z)  # Y is symmetric
        Y = self.factors[0]
        return (Y.transpose(-1, -2) if transpose else Y) @ Z


def _product_cost(flops):
    """A product's cost in the thin steps' model: its flops, at least ``LAUNCH_FLOPS``."""
    return max(flops, LAUNCH_FLOPS)


def _thin_costs(steps, m, n, b=1):
    """The L thin steps' costs for b kernels m×m and thin matrices of n columns:
    (h, cost of the steps after X_0 with the last h of them by Horner's rule, cost of one
    m×m product, cost of one thin product), each product counted by ``_product_cost``.

    The factor of the last h steps is Σ_{j<2^h} R^j (``_NewtonPinvThin``): 2^h - 1 thin
    products by Horner's rule, against the h steps X_{k+1} = 2X_k - X_k² (m×m products)
    and h thin products that apply them one by one. Where the kernels are large, flops
    decide (CUDA's 4 steps at SOFT-S's m = 1056 and n = 32: all 4 by Horner's rule, 15 thin
    products with the flops of half an m×m product, instead of 3 m×m and 4 thin
    products); where they are small (m = 256 at 512×512), launches do, and the fewest
    products (the steps one by one) win."""
    square, thin = _product_cost(2 * b * m**3), _product_cost(2 * b * m * m * n)

    def cost(h):
        squarings = steps - h - (h == 0)  # X_0 is formed either way
        return squarings * square + (steps - h + 2**h - 1) * thin
    h = min(range(steps + 1), key=cost)
    return h, cost(h), square, thin


def _horner_steps(steps, m, n, b=1):
    """How many of the L thin steps (the last ones) ``_thin_apply`` applies as one
    polynomial by Horner's rule (``_thin_costs``)."""
    return _thin_costs(steps, m, n, b)[0]


def _thin_pays_in_training(steps, m, n, b=1):
    """Whether the L thin steps cost less than forming them when backward is needed:
    thin, X_0, the steps and V's thin product in forward, and again in backward
    (``_NewtonPinvThin``); formed, 2L m×m products and A⁺'s thin product in each pass
    (``_NewtonPinvApply``). At SOFT-S's m = 1056 (800×1344) about half; at m = 256
    (512×512), where the products cost launches more than flops, the formed steps take
    fewer, and at m = 416 (640×640) for fewer than 20 kernels at once."""
    _, steps_cost, square, thin = _thin_costs(steps, m, n, b)
    return 2 * (square + steps_cost + thin) < 2 * steps * square + 2 * thin


def _flat_padded(A, Z, pad_to):
    """A (..., m, m) and Z (..., m, n) with one flat batch dimension, zero-padded to a
    multiple of ``pad_to`` landmarks (``_padded``): (b, m', m'), (b, m', n)."""
    m = A.shape[-1]
    A3 = _padded(A, pad_to)
    A3 = A3.reshape(-1, *A3.shape[-2:])
    Z3 = Z.reshape(-1, *Z.shape[-2:])
    if A3.shape[-1] != m:
        Z3 = F.pad(Z3, (0, 0, 0, A3.shape[-1] - m))
    return A3, Z3


def _thin_start(A, Z, iters, method, nonnegative, options, steps):
    """The iterate ``steps`` steps before the end, formed by ``method``'s schedule, on A
    padded to ``pad_to``: (A3, V, Z3), flat batch (b, m', m'), (b, m', m'), (b, m', n)."""
    alpha = newton_alpha(A, nonnegative=nonnegative).reshape(-1, 1, 1)
    A3, Z3 = _flat_padded(A, Z, options['pad_to'])
    V = alpha * A3
    left = steps  # the float32 steps at the schedule's end that are applied thin
    formed = []
    for count, precision in reversed(_schedule(method, iters, options['tf32_float32_steps'])):
        cut = min(left, count)  # check_thin_steps: float32 steps only
        left -= cut
        formed.insert(0, (count - cut, precision))
    for count, precision in formed:
        V = options['products'].steps(A3, V, count, precision)
    return A3, V, Z3


def _thin_apply(left, right, steps, W, h, transpose=False):
    """S·W, or Sᵀ·W, for the factor S of the L = ``steps`` thin steps
    (``_NewtonPinvThin``): S = (2I - X_0)···(2I - X_{L-h-1})·Σ_{j<2^h} R^j with X_0 =
    left·right (A·V or V·A), X_{k+1} = 2X_k - X_k² and R = I - X_{L-h}; the last h steps
    by Horner's rule, W + R·(W + R·(···)) (h from ``_horner_steps``, or 0). The factors
    are polynomials in X_0, so they commute; each is applied as soon as it is formed, so
    only one X_k exists at a time. left, right: (b, m, m); W: (b, m, n); every product
    in their dtype.

    The steps stay in X's form: where X_k is small (directions not yet converged) its
    relative rounding stays that of one product per step, where squaring R = I - X_k
    would double R's rounding at every step (2^k·u on x_k's scale: 4e-3 in float32
    after 16)."""
    def t(x):
        return x.transpose(-1, -2) if transpose else x

    X = left @ right
    for k in range(steps - h):
        W = torch.baddbmm(W, t(X), W, beta=2, alpha=-1)  # (2I - X_k)·W
        if k + 1 < steps:
            X = torch.baddbmm(X, X, X, beta=2, alpha=-1)
    return horner_sum(W, X, h, transpose)


def horner_sum(W, X, h, transpose=False):
    """Σ_{j<2^h} R^j·W (Rᵀ where ``transpose``) with R = I - X, by Horner's rule:
    W + R·(W + R·(···)), 2^h - 1 thin products; W itself for h = 0 (``_thin_apply``'s last
    h steps). X: (b, m, m); W: (b, m, n)."""
    if not h:
        return W
    R = torch.eye(X.shape[-1], dtype=X.dtype, device=X.device) - X
    R = R.transpose(-1, -2) if transpose else R
    T = W
    for _ in range(2**h - 1):
        T = torch.baddbmm(W, R, T)
    return T


class Products:
    """How the iterate's m×m products are made: here the library's (float32 steps in A's
    dtype, TF32 steps on CUDA's tensor cores, emulated elsewhere: ``_newton_steps``; the
    thin steps in float32, ``_thin_apply``). A variant outside the library
    (``projects/``) subclasses it and hands an instance to ``newton_pinv_apply``
    (``products``): the algebra stays this module's, the products are its own."""

    def steps(self, A, V, count, precision):
        """``count`` Newton steps V ← 2V - V·(A·V) in ``precision`` ('float32' or 'tf32');
        A, V (b, m, m)."""
        return _newton_steps(A, V, count, precision)

    def thin_apply(self, left, right, steps, W, h, transpose=False):
        """The thin steps' factor applied to W (``_thin_apply``)."""
        return _thin_apply(left, right, steps, W, h, transpose)


LIBRARY_PRODUCTS = Products()


class _NewtonPinvThin(torch.autograd.Function):
    """W = A⁺·Z with the last L = ``steps`` float32 steps of the iteration applied to the
    thin Z instead of forming A⁺, with gradients (where ``_thin_pays_in_training``) or
    without.

    With V the iterate L steps before the end (formed, by ``method``'s schedule) and
    X_0 = A·V, every further step is V_{k+1} = V_k·(2I - X_k) with X_{k+1} = A·V_{k+1} =
    2X_k - X_k² (associativity alone, no commuting), so A⁺ = V·(2I - X_0)···(2I - X_{L-1}).
    By associativity again V·(A·V)^j = (V·A)^j·V, so A⁺ = (2I - X'_0)···(2I - X'_{L-1})·V
    with X'_0 = V·A: forward applies V to Z first, then the factors in X'_0. With R =
    I - X_0 the factors are I - X_k = R^(2^k), and their product is Σ_{j<2^L} R^j:
    ``_thin_apply`` forms the X_k and applies them one by one (L m×m products for the L
    steps, where formed steps take 2L), or applies the last h by Horner's rule (2^h - 1
    thin products, no m×m product after X_0) where that costs less
    (``_horner_steps``): with gradients (``horner``; inference applies them one by one).

    Why V first: Horner's products round a sum that grows to 2^h times its input in the
    directions not yet converged, (2^h - 1)·2^(h-1) times the input's scale against
    2^h - 1 one by one. Applied to Z before V, those roundings reach the converged
    directions, which V then amplifies; applied to V·Z, nothing amplifies them after.
    On SOFT-S's astronaut at 800×1344 (CPU, TF32 emulated, every layer with all 4 steps
    by Horner's rule) the worst map was 8.6e-6 from float64 with V last and 2.0e-6 with
    V first (one by one 1.6e-6 and 2.0e-6).

    Backward as paper Eq. 16 (A⁺ treated as an exact inverse, as ``_NewtonPinvApply``):
    ∇Z = A⁺ᵀ·∇W = Sᵀ·(Vᵀ·∇W) (S the factors' product) and ∇A = -∇Z·Wᵀ: thin products
    after recomputing X_0 (and the X_k after it) from the saved A and V. A⁺ is never
    formed, and the saved V takes the memory the formed iterate took.

    The algebra is that of the formed steps, so the thin steps correct the formed
    iterate's rounding as formed steps would (Newton's step squares the error in the
    converged directions: CUDA's TF32 steps end in float32 steps for that). What they do
    not correct is their own factors' rounding: with every step applied thin (V = V₀ =
    αA, ``thin_steps=iters``, in no plan), the first factor 2I - αA² is near 0 for
    eigenvalues near the step size's boundary (αλ² ≈ 2), and its rounding stays:
    3e-3–1e-2 from the float64 iterate there, where the official float32 iteration is
    within 1.4e-4–8e-6
    (docs/en/notes/numerics.md). A plan applies at most the float32 steps that end
    'tf32''s schedule, after a formed float32 step (``check_thin_steps``).
    """

    @staticmethod
    def forward(ctx, A, Z, iters, method, nonnegative, options, steps, horner):
        m = A.shape[-1]
        A3, V, Z3 = _thin_start(A, Z, iters, method, nonnegative, options, steps)
        h = _horner_steps(steps, A3.shape[-1], Z3.shape[-1], A3.shape[0]) if horner else 0
        products = options['products']
        W = products.thin_apply(V, A3, steps, V @ Z3, h)
        W = W[:, :m].reshape(Z.shape)
        ctx.steps, ctx.pad_to, ctx.h, ctx.products = steps, options['pad_to'], h, products
        ctx.save_for_backward(A, V, W)
        return W

    @staticmethod
    def backward(ctx, grad_W):
        A, V, W = ctx.saved_tensors
        m = A.shape[-1]
        A3, G3 = _flat_padded(A, grad_W, ctx.pad_to)
        grad_Z = ctx.products.thin_apply(A3, V, ctx.steps, V.transpose(-1, -2) @ G3, ctx.h,
                                         transpose=True)
        grad_Z = grad_Z[:, :m].reshape(grad_W.shape)
        return -grad_Z @ W.transpose(-1, -2), grad_Z, None, None, None, None, None, None


class _NewtonPinv(torch.autograd.Function):
    """Y = A⁺ by Newton–Raphson; backward treats Y as an exact inverse (paper Eq. 16)."""

    @staticmethod
    def forward(ctx, A, iters, method, nonnegative, options):
        Y = _NewtonInverse.of(A, iters, method, nonnegative, options).matrix(A.dtype)
        ctx.save_for_backward(Y)
        return Y

    @staticmethod
    def backward(ctx, grad_Y):
        Y, = ctx.saved_tensors
        Yt = Y.transpose(-1, -2)
        return -Yt @ grad_Y @ Yt, None, None, None, None


class _NewtonPinvApply(torch.autograd.Function):
    """W = A⁺·Z without forming A⁺ when the spectral form is used.

    Backward as paper Eq. 16 (A⁺ treated as an exact inverse): with ∇Y = ∇W·Zᵀ,
    ∇A = -Yᵀ·∇Y·Yᵀ = -(Yᵀ·∇W)·Wᵀ and ∇Z = Yᵀ·∇W, so the same two thin products serve
    both and the gradient equals that of ``newton_pinv(A) @ Z``.
    """

    @staticmethod
    def forward(ctx, A, Z, iters, method, nonnegative, options):
        inv = _NewtonInverse.of(A, iters, method, nonnegative, options)
        W = inv.apply(Z)
        ctx.method = method
        ctx.save_for_backward(W, *inv.factors)
        return W

    @staticmethod
    def backward(ctx, grad_W):
        W, *factors = ctx.saved_tensors
        grad_Z = _NewtonInverse(ctx.method, *factors).apply(grad_W, transpose=True)
        return -grad_Z @ W.transpose(-1, -2), grad_Z, None, None, None, None


def newton_pinv(A, iters=20, method='iterative', nonnegative=False, *,
                tf32_float32_steps=TF32_FLOAT32_STEPS, pad_to=1, products=None):
    """Moore–Penrose inverse of (batched) square matrices by Newton–Raphson iteration.

    The result equals ``iters`` steps of V_{k+1} = 2V_k - V_k·A·V_k from V₀ = αA with a
    per-matrix α (``newton_alpha``). Gradients follow paper Eq. 16 (∇A = -Yᵀ·∇Y·Yᵀ)
    rather than back-propagating through the iterations. Always computed in float32 (or
    float64 if A is float64), also under autocast.

    Args:
        A (Tensor): (..., m, m)
        iters (int): number of Newton–Raphson steps T (20 in SOFT).
        method (str): 'iterative', 'spectral' (A must be symmetric, as the Gaussian kernel
            of landmarks is) or 'tf32' (module docstring). All give the same value up to
            rounding. (Which runs where is the dispatch's, ``dispatch.py``.)
        nonnegative (bool): A is symmetric with nonnegative entries; α is then found in
            O(m²) (same value, see ``newton_alpha``).
        tf32_float32_steps (tuple[int, int]): 'tf32''s float32 steps before and after
            its TF32 steps (``_schedule``).
        pad_to (int): the iterations run on A zero-padded to a multiple of this many
            landmarks (aligned sizes for tensor cores; same iterate).
        products (Products, optional): how the m×m products are made; None: the
            library's.
    Returns:
        Tensor: (..., m, m) in A's floating dtype promoted to at least float32.
    """
    _check_method(method, iters)
    options = check_pinv_options(tf32_float32_steps, pad_to, products=products)
    with torch.autocast(device_type=device_type(A), enabled=False):
        return _NewtonPinv.apply(A.to(compute_dtype(A)), iters, method, nonnegative,
                                 options)


def newton_pinv_apply(A, Z, iters=20, method='iterative', nonnegative=False, *,
                      tf32_float32_steps=TF32_FLOAT32_STEPS, pad_to=1, thin_steps=0,
                      products=None):
    """A⁺·Z for the T-step iterate A⁺ of A, without forming A⁺ where that is cheaper.

    Same value and (Eq. 16) gradients as ``newton_pinv(A, ...) @ Z``. 'iterative' and
    'tf32' form A⁺, except their last ``thin_steps`` steps, which are applied to Z
    (``_NewtonPinvThin``; with gradients where that costs less than forming them,
    ``_thin_pays_in_training``); 'spectral' never forms it.

    Args:
        A (Tensor): (..., m, m), float32 or float64.
        Z (Tensor): (..., m, n), A's dtype.
        method (str): one of ``EXACT_PINV_METHODS``.
        tf32_float32_steps, pad_to, products: as in ``newton_pinv``.
        thin_steps (int): this many of the float32 steps that end the iteration run on
            the thin Z: one m×m product each instead of two (``_NewtonPinvThin``; at
            most 'tf32''s last float32 steps, every step of 'iterative';
            ``check_thin_steps``). With gradients where that costs less than the formed
            steps (``_thin_pays_in_training``: large kernels).
    Returns:
        Tensor: (..., m, n)
    """
    _check_method(method, iters)
    options = check_pinv_options(tf32_float32_steps, pad_to, products=products)
    thin_steps = check_thin_steps(thin_steps, method, options['tf32_float32_steps'], iters)
    grad = torch.is_grad_enabled() and (A.requires_grad or Z.requires_grad)
    if thin_steps and (not grad or _thin_pays_in_training(
            thin_steps, -A.shape[-1] // -options['pad_to'] * options['pad_to'], Z.shape[-1],
            A[..., 0, 0].numel())):
        return _NewtonPinvThin.apply(A, Z, iters, method, nonnegative, options, thin_steps,
                                     grad)
    return _NewtonPinvApply.apply(A, Z, iters, method, nonnegative, options)


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
                                       or is_compiling()):
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
