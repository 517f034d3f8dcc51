"""The Newton–Raphson pseudo-inverse of SOFT's landmark kernel.

Paper Alg. 2 ("alternative form"): V₀ = αA, V_{k+1} = 2V_k - V_k·A·V_k for T = 20 steps,
α chosen per matrix; paper Eq. 16 for the backward pass. Every way below computes that
same T-step iterate Y (``PINV_METHODS``); they differ in cost per device:

    'iterative'  the matrix iteration in float32: 2T products of m×m matrices (formed,
                 as training keeps it for backward).
    'spectral'   one eigendecomposition of A, the iterate's filter on its eigenvalues,
                 applied to the thin matrix (``_spectral_factors``; ``eigh_dtype``
                 float64, float32 or 'mixed' for a float32 A: float32 where a first-order
                 error bound allows it, the Perron eigenpair split off in float64
                 first, ``_mixed_spectral_factors``). Without gradients,
                 ``spectral_inference='tridiagonal'`` applies the same filter through
                 A's tridiagonal form instead of eigenvectors (``_tridiagonal_apply``).
    'tf32'       the iteration with TF32 tensor-core products (CUDA) between float32
                 steps: ``tf32_float32_steps`` = (first, last) float32 steps. The first
                 float32 step keeps eigenvalues on the step size's boundary (αλ² ≈ 2,
                 near-identity kernels) from being pushed over it by TF32 rounding,
                 where the iterate diverges (``tf32_first_steps='guarded'``: only for
                 batches with a kernel that may sit there, ``first_steps_needed``); the
                 last ones correct the TF32 rounding in the converged directions
                 (``_schedule``). Off CUDA the TF32 rounding is
                 emulated (``round_tf32``, to nearest, as an H200's tensor cores were
                 measured to round; slow, for checking numerics).
    'tf32x3'     the iteration with every float32 product made of three TF32 products of
                 split operands, x = hi + lo with hi = x rounded to TF32:
                 hi·hi + hi·lo + lo·hi, which keeps float32 accuracy on tensor cores
                 (``_matmul``: on CUDA one Triton kernel per product,
                 ``iterate_matmul.py``; without Triton 3 three library products,
                 ``_split_bmm``). Emulated off CUDA, like 'tf32'.

``float32_products='tf32x3'`` makes the float32 m×m products of the other iterations the
same way: 'iterative''s and 'tf32''s float32 steps and the thin steps' X_k;
``float32_products='fp16x3'`` makes them of three fp16 products of split operands, each
operand matrix scaled by a power of two (``_split_fp16``: the same 2^-22 at twice the
tensor-core rate; on CUDA cuBLAS's fp16 products of operands converted once, or one
Triton kernel per product: ``iterate_matmul.py``).
``tf32_products='fp16'`` makes 'tf32''s TF32 products on fp16 tensor cores (twice
TF32's rate) with TF32's rounding: each operand matrix scaled by a power of two before
it is rounded to fp16 (``round_fp16_scaled``; on CUDA made as 'fp16x3' makes its
products, ``iterate_matmul.py``).

Which method runs where, and with which options, is the device's plan (``plan.py``): the
functions here take every choice as an argument and read no plan.

The iterations can run on A zero-padded to a multiple of ``pad_to`` landmarks (aligned
sizes for tensor cores): A's block never mixes with the zero block and α is unchanged,
so the iterate is the same. The last ``thin_steps`` float32 steps of 'iterative' or
'tf32' can be applied to the thin matrix instead of forming the iterate
(``_NewtonPinvThin``: the same steps, one m×m product each instead of two, and thin
products); with gradients too where that costs less, and there, on large kernels, with
one m×m product for all of them (Horner's rule on their sum; in inference too with
``thin_horner='always'``).

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
import functools
import math
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F

from .dtypes import (compute_dtype, device_type, is_compiling, new_tf32_flags, triton_available,
                     widest_dtype)

__all__ = [
    'EXACT_PINV_METHODS', 'check_pinv_options', 'check_spectral_inference',
    'check_thin_steps', 'newton_alpha',
    'newton_pinv', 'newton_pinv_apply', 'newton_pinv_error', 'normalize_inverse',
    'regularized_apply', 'round_fp16_scaled', 'round_tf32', 'truncate_tf32'
]

# The ways to compute the same T-step iterate (module docstring).
EXACT_PINV_METHODS = ('iterative', 'spectral', 'tf32', 'tf32x3')
# How the float32 m×m products of the iterations are made (``_matmul``), and the TF32
# steps' products ('tf32''s; ``_newton_steps``)
FLOAT32_PRODUCTS = ('float32', 'tf32x3', 'fp16x3')
TF32_PRODUCTS = ('tf32', 'fp16')
# Those whose iteration ends in float32 steps, which ``thin_steps`` can apply thin
THIN_STEP_METHODS = ('iterative', 'tf32')
# The options' values when a caller gives none (every plan's too, unless it says
# otherwise; the measurements behind them are beside the plans in ``plan.py``).
EIGH_DTYPE = 'float64'
TF32_FLOAT32_STEPS = (1, 8)
# Whether 'tf32''s first float32 steps run for every batch of kernels ('always') or only
# where a kernel of the batch may sit near the step size's boundary ('guarded',
# ``first_steps_needed``): a kernel is let off them where αλ² ≤ FIRST_STEP_BOUND is
# proven for all its eigenvalues, half the boundary's 2.
TF32_FIRST_STEPS = 'always'
TF32_FIRST_STEPS_CHOICES = ('always', 'guarded')
FIRST_STEP_BOUND = 1.
# Where the thin steps' factors may be applied as one sum by Horner's rule (where that
# costs less, ``_horner_steps``): with gradients only ('training'), or in inference too
# ('always'; ``_NewtonPinvThin``).
THIN_HORNER = 'training'
THIN_HORNER_CHOICES = ('training', 'always')
EIGH_DTYPES = ('float64', 'float32', 'mixed')
# 'mixed' (``_mixed_spectral_factors``): power-iteration steps for the Perron eigenpair,
# and the largest first-order error estimate a float32 decomposition may have.
PERRON_STEPS = 12
MIXED_ESTIMATE_LIMIT = 4e-4
# How 'spectral' applies its filter without gradients: through A's eigenvectors, or
# through its tridiagonal form (``_tridiagonal_apply``: needs SciPy's LAPACK).
SPECTRAL_INFERENCES = ('eigh', 'tridiagonal')
# 'tridiagonal': the contour nodes of its resolvent sum (``resolvent_quadrature``), and
# the fewest steps T for which its filter 1 - exp(-2^T·αλ²) stands for the iterate's
# 1 - (1 - αλ²)^(2^T) (they differ by at most 0.27·2^-T: 2.6e-7 at T = 20).
RESOLVENT_NODES = 18
TRIDIAGONAL_MIN_ITERS = 20


def check_pinv_options(eigh_dtype, tf32_float32_steps, pad_to, pad_name='pad_to',
                       float32_products='float32', tf32_products='tf32', symmetric_blocks=1,
                       tf32_first_steps=TF32_FIRST_STEPS):
    """The options of how an iterate is computed besides its method (``newton_pinv``'s
    arguments, a plan's fields), checked: {eigh_dtype, tf32_float32_steps (a tuple),
    pad_to, float32_products, tf32_products, symmetric_blocks, tf32_first_steps}.
    ``pad_name`` names the padding in the error (the argument or the plan's field)."""
    if float32_products not in FLOAT32_PRODUCTS:
        raise ValueError(f'float32_products must be one of {FLOAT32_PRODUCTS}, got '
                         f'{float32_products!r}')
    if tf32_products not in TF32_PRODUCTS:
        raise ValueError(f'tf32_products must be one of {TF32_PRODUCTS}, got '
                         f'{tf32_products!r}')
    if eigh_dtype not in EIGH_DTYPES:
        raise ValueError(f'eigh_dtype must be one of {EIGH_DTYPES}, got {eigh_dtype!r}')
    steps = tf32_float32_steps
    if (not isinstance(steps, (tuple, list)) or len(steps) != 2
            or any(not isinstance(n, int) or n < 0 for n in steps)):
        raise ValueError(f'tf32_float32_steps must be two ints >= 0 (float32 steps before '
                         f'and after the TF32 ones), got {steps!r}')
    if tf32_first_steps not in TF32_FIRST_STEPS_CHOICES:
        raise ValueError(f'tf32_first_steps must be one of {TF32_FIRST_STEPS_CHOICES}, got '
                         f'{tf32_first_steps!r}')
    if tf32_first_steps == 'guarded' and not steps[0]:
        raise ValueError("tf32_first_steps='guarded' decides where 'tf32''s first float32 "
                         f'steps run, and tf32_float32_steps={tuple(steps)} has none')
    if not isinstance(pad_to, int) or pad_to < 1:
        raise ValueError(f'{pad_name} must be an int >= 1, got {pad_to!r}')
    if (not isinstance(symmetric_blocks, int) or isinstance(symmetric_blocks, bool)
            or symmetric_blocks < 1):
        raise ValueError(f'symmetric_blocks must be an int >= 1 (1: whole products), got '
                         f'{symmetric_blocks!r}')
    if symmetric_blocks > 1 and (float32_products, tf32_products) != ('float32', 'tf32'):
        raise ValueError("symmetric_blocks > 1 takes the library's products "
                         "(float32_products='float32', tf32_products='tf32'), got "
                         f'{float32_products!r} and {tf32_products!r}')
    return dict(eigh_dtype=eigh_dtype, tf32_float32_steps=tuple(steps), pad_to=pad_to,
                float32_products=float32_products, tf32_products=tf32_products,
                symmetric_blocks=symmetric_blocks, tf32_first_steps=tf32_first_steps)


def check_spectral_inference(spectral_inference):
    """``spectral_inference`` checked: one of ``SPECTRAL_INFERENCES``; 'tridiagonal' needs
    SciPy (LAPACK's Householder tridiagonalization, which torch does not expose)."""
    if spectral_inference not in SPECTRAL_INFERENCES:
        raise ValueError(f'spectral_inference must be one of {SPECTRAL_INFERENCES}, got '
                         f'{spectral_inference!r}')
    if spectral_inference == 'tridiagonal':
        try:
            import scipy.linalg  # noqa: F401
        except ImportError as e:
            raise ValueError("spectral_inference='tridiagonal' needs SciPy (pip install "
                             "scipy); 'eigh' does not") from e
    return spectral_inference


def check_thin_steps(thin_steps, method, tf32_float32_steps, iters=None,
                     thin_horner=THIN_HORNER):
    """``thin_steps`` checked for ``method``: an int >= 0, and at most the float32 steps
    the iteration ends with (all of 'iterative''s ``iters``, the last of 'tf32''s
    ``tf32_float32_steps``); the other methods (``THIN_STEP_METHODS``) take none.
    ``thin_horner``: one of ``THIN_HORNER_CHOICES``."""
    if thin_horner not in THIN_HORNER_CHOICES:
        raise ValueError(f'thin_horner must be one of {THIN_HORNER_CHOICES}, got '
                         f'{thin_horner!r}')
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

# newton_alpha halves α while ||I - α·A·A||₁ exceeds this
ALPHA_BOUND = 1.01


def newton_alpha(A, max_halvings=10, nonnegative=False):
    """Initial step α of the Newton–Raphson inverse, chosen per matrix (paper Alg. 2).

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
    if nonnegative:
        # Decided in float64 (A's values, exact products and sums): which candidate meets
        # the bound is a threshold, and a kernel can sit within float32 rounding of it
        # (one of the cat photo's at 640×640: 1.3e-7 from 1.01), where another order of
        # float32 sums (CUDA's) took one halving more or fewer. α then differs by 2, and
        # so does the iterate on A's small eigenvalues (v_T(λ) ≈ α·λ·2^T there): the
        # output maps moved 5e-5 from the float64 computation whatever computed the
        # iterate. In float64 the decision is the reference's, and the same on every
        # device, up to ties within float64 rounding (MPS has no float64: A's dtype).
        cand, norms = alpha_candidates(A.to(widest_dtype(A)), max_halvings)
        # The bound holds for every α below one that meets it (the norm is convex in α
        # and 1 at α = 0), so the halvings of the sequential loop below are the
        # candidates that miss it, at most max_halvings.
        halvings = (norms > ALPHA_BOUND).sum(-1, keepdim=True)  # (..., 1, 1)
        return cand.gather(-1, halvings[..., None]).squeeze(-1).to(A.dtype)
    alpha = 2 * A.abs().sum(-1, keepdim=True).amax(-2, keepdim=True).pow(-2)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    AA = A @ A
    # A fixed number of steps with torch.where (no data-dependent break): the result is
    # the same (α stops halving once the bound holds) and the graph stays traceable.
    for _ in range(max_halvings):
        norm = (eye - alpha * AA).abs().sum(-2).amax(-1)[..., None, None]
        alpha = torch.where(norm > ALPHA_BOUND, alpha / 2, alpha)
    return alpha


def alpha_candidates(A, max_halvings=10):
    """``newton_alpha``'s candidates for a nonnegative symmetric A (..., m, m) and the
    norms they are tested by, computed in A's dtype.

    Returns:
        (Tensor, Tensor): α/2^j, j = 0 … ``max_halvings``, (..., 1, 1, J + 1), and
        ||I - α/2^j·A²||₁ for j < J, (..., 1, J).
    """
    row_sums = A.sum(-1, keepdim=True)  # |A| = A: no m×m temporary
    alpha = 2 * row_sums.amax(-2, keepdim=True).pow(-2)  # (..., 1, 1); pow(-2) is 1/x²
    # a_j = ||A_j||², without an m×m temporary (it only decides the halvings)
    diag = torch.linalg.vector_norm(A, dim=-1).pow(2)[..., None, :]  # (..., 1, m)
    off = (A @ row_sums).transpose(-1, -2) - diag  # s_j - a_j
    # Candidates along a new last dim: powers of two (exact) made on A's device (a tensor
    # from a Python list would be a host-to-device copy, which synchronizes with a GPU
    # in every call).
    scales = 0.5**torch.arange(max_halvings + 1, dtype=A.dtype, device=A.device)
    cand = alpha[..., None] * scales  # (..., 1, 1, J + 1)
    c = cand[..., :-1]
    norms = ((1 - c * diag[..., None]).abs() + c * off[..., None]).amax(-2)
    return cand, norms


def first_step_bound(A, alpha, nonnegative=False):
    """A bound on αλ² over the eigenvalues λ of each matrix of A (..., m, m), symmetric,
    with step α (``newton_alpha``, (..., 1, 1)): α·max_j (|A|·(|A|·1))_j, (...,)
    (``first_steps_needed``)."""
    a = A if nonnegative else A.abs()
    s = (a @ a.sum(-1, keepdim=True)).amax((-2, -1))
    return alpha.reshape(s.shape) * s


def first_steps_needed(A, alpha, nonnegative=False):
    """Whether a kernel may need 'tf32''s first float32 steps: for each matrix of A
    (..., m, m), symmetric, with step α (``newton_alpha``, (..., 1, 1)), False where
    every eigenvalue λ of A is proven to have αλ² ≤ ``FIRST_STEP_BOUND``
    (``first_step_bound``).

    TF32 rounding of the first step's operands moves αλ² by about 2^-10 of itself. That
    matters only near the boundary αλ² = 2 of the official step size (1 - αλ² ≈ -1),
    where it can cross 2 and the iterate diverges (``_schedule``); from αλ² ≤ 1 the
    step maps every eigenvalue into [0, 1] as float32 does. The proof: λ_max(A)² =
    λ_max(A²) is at most A²'s largest absolute row sum, at most max_j (|A|·(|A|·1))_j,
    so α times that bounds every αλ² (O(m²): two matrix–vector products). Its rounding,
    m·2^-24 of the sum at most, is far inside the margin to 2. α = 2/r² (r: A's largest
    absolute row sum) without halvings: a kernel is let off only where its largest
    row sum of |A|² is at most half of r² (near-identity and near-rank-1 kernels, whose
    λ_max nears r, are not); α halved once or more (SOFT's kernels on real images: αλ²
    ≤ 0.008) always is.

    Returns:
        Tensor: (...,) bool.
    """
    return first_step_bound(A, alpha, nonnegative) > FIRST_STEP_BOUND


def _can_synchronize(A):
    """Whether the caller may read a value of A's device on the host: not while
    torch.compile or the JIT traces, a CUDA graph is captured, or on the meta device."""
    if is_compiling() or torch.jit.is_tracing() or A.device.type == 'meta':
        return False
    return not (A.is_cuda and torch.cuda.is_current_stream_capturing())


def _float32_steps(A, alpha, method, nonnegative, options):
    """The (first, last) float32 steps ``_schedule`` takes for ``method`` on the batch of
    kernels A (..., m, m) with steps α: ``tf32_float32_steps``, for 'tf32' with
    ``tf32_first_steps='guarded'`` its first steps only where a kernel of the batch may
    need them (``first_steps_needed``; one value read on the host, which waits for A's
    device; where it cannot be read, ``_can_synchronize``, they run)."""
    first, last = options['tf32_float32_steps']
    if (method != 'tf32' or options['tf32_first_steps'] == 'always'
            or not _can_synchronize(A)
            or bool(first_steps_needed(A, alpha, nonnegative).any())):
        return first, last
    return 0, last


# ---------------------------------------------------------------------------------------
# Precision: TF32 products
# ---------------------------------------------------------------------------------------


def round_tf32(x):
    """float32 values rounded to TF32 (10 mantissa bits, round to nearest, ties to even),
    still stored as float32: exact in a TF32 product, whatever conversion it applies."""
    if x.dtype != torch.float32:
        raise TypeError(f'round_tf32 rounds float32 tensors, got {x.dtype}')
    bits = x.contiguous().view(torch.int32)
    bias = ((bits >> 13) & 1) + 0x0FFF
    return ((bits + bias) & -0x2000).view(torch.float32)


def truncate_tf32(x):
    """float32 values cut to TF32 (the low 13 mantissa bits dropped, rounding toward
    zero), still stored as float32: twice the error bound of ``round_tf32`` and biased
    toward zero. Not what tensor cores do: on an H200 a TF32 product matched the product
    of operands rounded to nearest (2.8e-6-3.2e-6 of its largest entry, float32's own
    summation) and not that of cut ones (8e-4-9e-4; docs/benchmark/cuda_h200/report.md),
    so the emulation of 'tf32' rounds (``round_tf32``)."""
    if x.dtype != torch.float32:
        raise TypeError(f'truncate_tf32 cuts float32 tensors, got {x.dtype}')
    return (x.contiguous().view(torch.int32) & -0x2000).view(torch.float32)


def _fp16_scale(x):
    """Each matrix's (the last two dimensions) power of two that puts its largest |entry|
    in [2^14, 2^15), (..., 1, 1): as ``iterate_matmul._fp16_scale`` computes it."""
    amax = x.abs().amax((-2, -1), keepdim=True)
    k = (15 - torch.frexp(amax).exponent).clamp(-126, 127)
    return torch.ldexp(torch.ones_like(amax), k)


def round_fp16_scaled(x):
    """float32 values as the 'fp16' TF32 products round them (``iterate_matmul``): each
    matrix (the last two dimensions) scaled by the power of two that puts its largest
    |entry| in [2^14, 2^15), rounded to fp16 (to nearest, ties to even) and scaled
    back, still float32. That is ``round_tf32``'s rounding for every entry down to 2^-28
    of the matrix's largest; smaller ones (fp16's subnormals) within 2^-39 of it."""
    if x.dtype != torch.float32:
        raise TypeError(f'round_fp16_scaled rounds float32 tensors, got {x.dtype}')
    scale = _fp16_scale(x)
    return (x * scale).half().float() / scale


@contextmanager
def _cuda_tf32_matmuls():
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


def _split_tf32(x, emulate):
    """x = hi + lo with hi = x rounded to TF32 (exact in a TF32 product) and lo = x - hi
    (exact in float32; rounded to TF32 here when ``emulate``, by the tensor cores on
    CUDA).
    """
    hi = round_tf32(x)
    lo = x - hi
    return hi, round_tf32(lo) if emulate else lo


def _split_fp16(x):
    """x = hi + lo as the 'fp16x3' products split it (``iterate_matmul``), in float32
    values: with s the power of two of ``round_fp16_scaled``, hi = fp16(x·s)/s and
    lo = fp16((x·s - fp16(x·s))·2^11)/(2^11·s), both exact in a float32 product of two
    such values (11 significant bits each)."""
    hi = round_fp16_scaled(x)
    scale = _fp16_scale(x) * 2048.
    return hi, ((x - hi) * scale).half().float() / scale


def _split_bmm(a, b):
    """a·b in float32 accuracy from three TF32 products, small terms first:
    lo_a·hi_b + hi_a·lo_b + hi_a·hi_b (the dropped lo_a·lo_b is ~2^-22 of a·b). ``a`` and
    ``b`` are pairs (hi, lo) from ``_split_tf32`` (or ``_split_fp16``, emulated); (b, m,
    k) and (b, k, n)."""
    (a_hi, a_lo), (b_hi, b_lo) = a, b
    acc = torch.bmm(a_lo, b_hi).baddbmm_(a_hi, b_lo)
    return acc.baddbmm_(a_hi, b_hi)


def _split_kernel(a):
    """Whether the products of ``a`` in 'tf32x3', 'fp16x3' (``_matmul``) and 'fp16'
    (``_newton_steps``) run through ``iterate_matmul`` (its Triton kernel, or for the
    fp16 ones cuBLAS's fp16 products between Triton passes): a CUDA tensor, Triton 3,
    eager code (compiled and traced code keeps the library products)."""
    return (a.is_cuda and triton_available() and not is_compiling()
            and not torch.jit.is_tracing())


# ``symmetric_blocks`` > 1 (``_symmetric_baddbmm``): the row blocks start at multiples of
# this many rows where each block has at least twice as many (the tiles of tensor-core
# products are 64 to 256 wide)
SYMMETRIC_ALIGN = 64


def _row_blocks(m, blocks):
    """[(r0, r1), ...]: m rows in at most ``blocks`` blocks of about equal height, each
    starting at a multiple of ``SYMMETRIC_ALIGN`` where m has twice that many rows per
    block (else anywhere)."""
    align = SYMMETRIC_ALIGN if m >= 2 * SYMMETRIC_ALIGN * blocks else 1
    cuts = sorted({i * m // blocks // align * align for i in range(blocks)} | {m})
    return list(zip(cuts[:-1], cuts[1:]))


def _symmetric_baddbmm(c, a, b, beta=1., alpha=1., blocks=1):
    """β·c + α·(a·b) (α·(a·b) for c None) for a (B, m, k), b (B, k, m) whose result is
    symmetric in exact arithmetic, made by the library's products on or above the
    diagonal's blocks only (``symmetric_blocks``; a measured alternative, in no plan).

    Every product of the iteration is symmetric in exact arithmetic: A and V_k are
    symmetric and polynomials in A, so A·V_k = V_k·A is, and so are V_k·(A·V_k)
    (Alg. 2's step), 2V - V·X and X_k². With the m rows in ``blocks`` row blocks
    [r0, r1) (``_row_blocks``), each block is one product from column r0 on,
    (blocks + 1)/(2·blocks) of the flops (3/4 for 2 blocks), and the blocks below the
    diagonal are copies of those above it, transposed. ``blocks`` = 1, and compiled or
    traced code: the whole product. c is read on or above the diagonal's blocks only.

    Why no plan takes it: in floating point the two triangles of such a product are
    different sums (entry (i, j) of A·V sums A[i, l]·V[l, j], entry (j, i) A[j, l]·V[l, i]),
    and copying one of them breaks what whole products keep exactly. Where two landmarks
    coincide, whole products keep their rows and columns of every iterate equal to the
    bit, so the iterate never moves in the kernel's null direction between them; the
    copied triangle puts a rounding error there, which each later step doubles (a
    Newton step doubles what lies in A's null space). On duplicated landmarks
    (``mmsoft.testing.hard_landmarks``, m = 64), CUDA's 'tf32' schedule ends 2.7e-3 from
    the float64 iterate with every product made so, against 1.2e-6 with whole ones
    (bound 1e-3); the float32 iterate 5.1e-6 against 4.8e-7; 2 row blocks
    (docs/en/notes/numerics.md).
    """
    if blocks == 1 or is_compiling() or torch.jit.is_tracing():  # whole (graphs: no views)
        if c is None:
            return a @ b if alpha == 1 else (a @ b).mul_(alpha)
        return torch.baddbmm(c, a, b, beta=beta, alpha=alpha)
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[-1])
    cuts = _row_blocks(a.shape[1], blocks)
    for r0, r1 in cuts:
        view = out[:, r0:r1, r0:]
        if c is None:
            torch.bmm(a[:, r0:r1], b[:, :, r0:], out=view)
            if alpha != 1:
                view.mul_(alpha)
        else:
            torch.baddbmm(c[:, r0:r1, r0:], a[:, r0:r1], b[:, :, r0:], beta=beta,
                          alpha=alpha, out=view)
    for r0, r1 in cuts[:-1]:
        out[:, r1:, r0:r1].copy_(out[:, r0:r1, r1:].transpose(-1, -2))
    return out


def _matmul(c, a, b, beta=1., alpha=1., precision='float32', blocks=1):
    """β·c + α·(a·b) (α·(a·b) for c None), a (B, m, k), b (B, k, n), with the product in
    ``precision``: 'float32' (the library's product in a's dtype), 'tf32x3' (three TF32
    products of split operands: on CUDA one Triton kernel, ``iterate_matmul.baddbmm``, or
    without Triton three library products, ``_split_bmm``; elsewhere emulated, the
    operands and their remainders rounded by ``round_tf32``) or 'fp16x3' (three fp16
    products of split, scaled operands: on CUDA ``iterate_matmul``, without it as
    'tf32x3'; elsewhere emulated, ``_split_fp16``). Tensor cores round float32 operands
    only: float64 runs in float64. ``blocks`` > 1 (the library's products only): a
    product symmetric in exact arithmetic made on or above the diagonal's blocks only
    (``_symmetric_baddbmm``)."""
    if precision not in ('tf32x3', 'fp16x3') or a.dtype != torch.float32:
        return _symmetric_baddbmm(c, a, b, beta, alpha, blocks)
    if _split_kernel(a):
        from .iterate_matmul import baddbmm
        out = baddbmm(c, a, b, beta=beta, alpha=alpha, precision=precision)
        return out if precision == 'tf32x3' else out[0]
    emulate = not a.is_cuda
    with _cuda_tf32_matmuls() if a.is_cuda else nullcontext():
        if precision == 'fp16x3' and emulate:
            ab = _split_bmm(_split_fp16(a), _split_fp16(b))
        else:
            ab = _split_bmm(_split_tf32(a, emulate), _split_tf32(b, emulate))
    ab = ab if alpha == 1 else ab.mul_(alpha)
    return ab if c is None else ab.add_(c, alpha=beta)


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


def _newton_steps_fp16(A, V, steps, precision='fp16', gemm=None):
    """``steps`` steps V ← 2V - V·(A·V) on fp16 tensor cores (``iterate_matmul``:
    'fp16', TF32's rounding, or 'fp16x3', float32's accuracy), the operands converted
    once each (A for every step, V for both of its products) and the products made the
    ``gemm`` way (None: ``iterate_matmul.fp16_gemm()``): each product gives its result's
    max |entry| for the next conversion's scale; the steps' maxima in one buffer (one
    launch to zero it). A, V: (b, m, m), float32, CUDA."""
    from .iterate_matmul import amax, fp16_operand, fp16_product
    maxima = A.new_zeros(steps, 2, A.shape[0])
    A16 = fp16_operand(A, amax(A), precision, right=False)
    v_amax = amax(V)
    for k in range(steps):
        V16 = fp16_operand(V, v_amax, precision)
        X, x_amax = fp16_product(None, A16, V16, precision=precision, out_amax=maxima[k, 0],
                                 gemm=gemm)
        X16 = fp16_operand(X, x_amax, precision, left=False)
        V, v_amax = fp16_product(V, V16, X16, beta=2, alpha=-1, precision=precision,
                                 out_amax=maxima[k, 1], gemm=gemm)
    return V


def _newton_steps(A, V, steps, precision='float32', blocks=1):
    """``steps`` steps V ← 2V - V·(A·V) (Alg. 2) with products in ``precision``:
    'float32' (A's dtype), 'tf32' (TF32 tensor-core products on CUDA; elsewhere emulated,
    the operands rounded to TF32 by ``round_tf32``), 'fp16' (TF32's rounding from fp16
    tensor cores: on CUDA ``_newton_steps_fp16``, or without Triton cuBLAS's TF32
    products; elsewhere emulated, the operands rounded by ``round_fp16_scaled``),
    'tf32x3' (three TF32 products of split operands: float32 accuracy, ``_split_bmm``)
    or 'fp16x3' (three fp16 products of split, scaled operands: float32 accuracy; on
    CUDA ``_newton_steps_fp16``, without Triton as 'tf32x3'; elsewhere emulated,
    ``_split_fp16``). Tensor cores round float32 operands only: a float64 A
    runs every step in float64.

    ``blocks`` > 1 ('float32' and 'tf32' only): every product made on or above the
    diagonal's blocks only, the rest copied (``_symmetric_baddbmm``): A symmetric,
    V₀ = αA. A, V: (b, m, m) with one flat batch dimension (baddbmm: one launch for
    2V - V·AV).
    """
    if steps <= 0:
        return V
    if precision == 'float32' or A.dtype != torch.float32:
        for _ in range(steps):
            X = _symmetric_baddbmm(None, A, V, blocks=blocks)
            V = _symmetric_baddbmm(V, V, X, beta=2, alpha=-1, blocks=blocks)
        return V
    if precision in ('fp16', 'fp16x3') and _split_kernel(A):
        return _newton_steps_fp16(A, V, steps, precision)
    if ((precision == 'tf32x3' and _split_kernel(A))
            or (precision == 'fp16x3' and A.device.type not in ('cuda', 'meta'))):
        # each product one Triton kernel, the step's sum its epilogue; or emulated
        for _ in range(steps):
            V = _matmul(V, V, _matmul(None, A, V, precision=precision), beta=2, alpha=-1,
                        precision=precision)
        return V
    if precision in ('tf32x3', 'fp16x3'):  # library products ('fp16x3' as 'tf32x3')
        with _cuda_tf32_matmuls() if A.is_cuda else nullcontext():
            return _newton_steps_split(A, V, steps)
    if A.device.type in ('cuda', 'meta'):  # meta: what CUDA runs (operator counts)
        with _cuda_tf32_matmuls():  # 'fp16' without the kernel: the same rounding
            return _newton_steps(A, V, steps, blocks=blocks)
    # Emulation: the operands of every product rounded to TF32 (``round_tf32``, as the
    # tensor cores do; or as the fp16 products do, ``round_fp16_scaled``), float32
    # accumulation.
    rounded = round_fp16_scaled if precision == 'fp16' else round_tf32
    A = rounded(A)
    for _ in range(steps):
        Vt = rounded(V)
        X = rounded(_symmetric_baddbmm(None, A, Vt, blocks=blocks))
        V = _symmetric_baddbmm(V, Vt, X, beta=2, alpha=-1, blocks=blocks)
    return V


def _schedule(method, iters, tf32_float32_steps, float32='float32', tf32='tf32'):
    """The iteration's steps as [(count, precision), ...] (``_newton_steps``), its float32
    steps with products in ``float32`` (``FLOAT32_PRODUCTS``), its
    TF32 steps in ``tf32`` ('tf32' or 'fp16', ``TF32_PRODUCTS``).

    'tf32': (first, last) = ``tf32_float32_steps`` float32 steps around T - first - last
    TF32 steps. Why float32 at both ends (hard kernels, emulated TF32, rounding to
    nearest and truncation alike; docs/en/notes/numerics.md):

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
        return [(iters, float32)]
    if method == 'tf32x3':
        return [(iters, 'tf32x3')]
    first = min(tf32_float32_steps[0], iters)
    last = min(tf32_float32_steps[1], iters - first)
    return [(first, float32), (iters - first - last, tf32), (last, float32)]


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


def _spectral_factors(A, alpha, iters, eigh_dtype=torch.float64):
    """(U, v) with Y = U·diag(v)·Uᵀ the T-step iterate of symmetric A (..., m, m).

    A = U·Λ·Uᵀ by eigh in ``eigh_dtype`` (float64 or float32; never below A's dtype). A
    float32 decomposition is exact only to ~eps·||A||, which moves the filter of
    eigenvalues near where it turns over (αλ²·2^T ≈ 1) and mixes eigenvectors of close
    eigenvalues: up to 400× the official float32 iteration's deviation on hard
    kernels, yet within 1e-6 of the float64 computation on SOFT-S's output maps
    (docs/en/notes/numerics.md).

    Returns:
        (Tensor, Tensor): U (..., m, m) and v (..., m) in the decomposition's dtype, in
        which they are applied to the thin Z too.
    """
    wide = torch.promote_types(A.dtype, eigh_dtype)
    lam, U = torch.linalg.eigh(A.to(wide))
    return U, _spectral_filter(lam, alpha.to(wide), iters)


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


def _tridiagonal_apply(A, Z, iters, nonnegative):
    """Y·Z for the T-step iterate Y of a float32 symmetric A (..., m, m) and Z (..., m, n),
    without eigenvectors (inference; needs SciPy): A = Q·T·Qᵀ with T tridiagonal
    (LAPACK's sytrd: Householder reflectors, the cost of eigh's first half), and
    Y·Z = Q·v(T)·Qᵀ·Z with v(λ) = (1 - e^(-sλ²)) / λ = sλ·φ(sλ²), s = α·2^T, from the
    resolvents of the pentadiagonal sT² (``resolvent_quadrature``): one banded complex
    solve per node pair, on the thin Qᵀ·Z. v is the iterate's filter (1 - (1 - αλ²)^(2^T))
    / λ (``_spectral_filter``) within 0.27·2^-T for αλ² ≤ 1, hence
    ``TRIDIAGONAL_MIN_ITERS``.

    As in ``_mixed_spectral_factors``, the Perron pair (μ, x) is split off in float64
    first where it has converged, and T is of A - μ·x·xᵀ. A kernel whose first-order
    error estimate (u·√m·||T||·max|v'| / max|v|, from bounds on T's spectrum: ||T||∞
    above, T's largest diagonal entry below) exceeds ``MIXED_ESTIMATE_LIMIT``, or with
    αλ² possibly above 1, goes through ``_mixed_spectral_factors`` instead. The float32
    decomposition's error then enters only through T and the reflectors, not through
    eigenvectors: on SOFT-S's kernels at 800×1344 it deviated 3e-6-4e-5 from the
    float64 iterate where 'mixed' eigh deviated 8e-6-2.2e-4 (docs/en/notes/numerics.md).
    """
    m, n = A.shape[-1], Z.shape[-1]
    out = torch.empty(*Z.shape, dtype=Z.dtype)
    with _one_blas_thread():
        for a, z, o in zip(A.reshape(-1, m, m), Z.reshape(-1, m, n), out.view(-1, m, n)):
            w = _tridiagonal_apply_one(a, z, iters, nonnegative)
            if w is None:
                w = _NewtonInverse('spectral', *_mixed_spectral_factors(
                    a[None], iters, nonnegative)).apply(z[None])[0]
            o.copy_(w)
    return out


def _one_blas_thread():
    """A context in which OpenBLAS (SciPy's LAPACK) runs on the calling thread, where
    threadpoolctl (≥ 3.5, which finds SciPy's own OpenBLAS) is installed; else no change.

    OpenBLAS keeps worker threads of its own beside torch's OpenMP threads, and they
    spin for a while after each call. On a 2-core machine the workers that ``ssytrd``
    left spinning took a core from the torch operators between the calls (the Perron
    split and ``ormqr`` ran 1.4-2× slower), and the torch threads still spinning slowed
    ``ssytrd``; on the calling thread it starts no worker. SOFT-S's 84 kernels at
    800×1344 then took 5.4-7.4 s of a forward instead of 6.8-8.4 s
    (docs/en/notes/per_device_plans.md). Other BLAS libraries (MKL, which torch may
    use) are left as they are."""
    controller = _openblas_controller()
    return nullcontext() if controller is None else controller.limit(limits=1)


@functools.lru_cache(maxsize=None)
def _openblas_controller():
    """threadpoolctl's controller of the OpenBLAS libraries loaded once SciPy's LAPACK
    is (made once: finding them takes ~1.5 ms), or None without threadpoolctl."""
    import scipy.linalg  # noqa: F401  (loads SciPy's OpenBLAS, for threadpoolctl to find)
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController().select(internal_api='openblas')


def _tridiagonal_apply_one(a, z, iters, nonnegative):
    """``_tridiagonal_apply`` of one kernel a (m, m) and z (m, n); None where it defers
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


def _padded(A, pad_to):
    """A (..., m, m) zero-padded to a multiple of ``pad_to`` landmarks. The iterations from
    V₀ = αA (α of the unpadded A) give the same iterate in the leading m×m block: A's
    block never mixes with the zero block, which stays zero."""
    pad = -A.shape[-1] % pad_to
    return F.pad(A, (0, pad, 0, pad)) if pad else A


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
    def of(cls, A, iters, method, nonnegative, options):
        if (method == 'spectral' and options['eigh_dtype'] == 'mixed'
                and A.dtype == torch.float32):  # α per kernel, from its float64 copy
            return cls(method, *_mixed_spectral_factors(A, iters, nonnegative))
        alpha = newton_alpha(A, nonnegative=nonnegative)
        if method == 'spectral':
            # 'mixed' of a float64 A: float64, as never below A's dtype
            dtype = torch.float64 if options['eigh_dtype'] == 'mixed' else getattr(
                torch, options['eigh_dtype'])
            return cls(method, *_spectral_factors(A, alpha, iters, dtype))
        m = A.shape[-1]
        float32_steps = _float32_steps(A, alpha, method, nonnegative, options)
        A3 = _padded(A, options['pad_to'])
        A3 = A3.reshape(-1, *A3.shape[-2:])  # (b, m', m')
        V = alpha.reshape(-1, 1, 1) * A3
        for steps, precision in _schedule(method, iters, float32_steps,
                                          options['float32_products'],
                                          options['tf32_products']):
            V = _newton_steps(A3, V, steps, precision, options['symmetric_blocks'])
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
            U, v = self.factors  # Y is symmetric
            W = U @ (v.unsqueeze(-1) * (U.transpose(-1, -2) @ Z.to(U.dtype)))
            return W.to(Z.dtype)
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
    alpha = newton_alpha(A, nonnegative=nonnegative)
    float32_steps = _float32_steps(A, alpha, method, nonnegative, options)
    alpha = alpha.reshape(-1, 1, 1)
    A3, Z3 = _flat_padded(A, Z, options['pad_to'])
    V = alpha * A3
    left = steps  # the float32 steps at the schedule's end that are applied thin
    formed = []
    for count, precision in reversed(_schedule(method, iters, float32_steps,
                                               options['float32_products'],
                                               options['tf32_products'])):
        cut = min(left, count)  # check_thin_steps: float32 steps only
        left -= cut
        formed.insert(0, (count - cut, precision))
    for count, precision in formed:
        V = _newton_steps(A3, V, count, precision, options['symmetric_blocks'])
    return A3, V, Z3


def _thin_apply(left, right, steps, W, h, transpose=False, precision='float32', blocks=1):
    """S·W, or Sᵀ·W, for the factor S of the L = ``steps`` thin steps
    (``_NewtonPinvThin``): S = (2I - X_0)···(2I - X_{L-h-1})·Σ_{j<2^h} R^j with X_0 =
    left·right (A·V or V·A), X_{k+1} = 2X_k - X_k² and R = I - X_{L-h}; the last h steps
    by Horner's rule, W + R·(W + R·(···)) (h from ``_horner_steps``, or 0). The factors
    are polynomials in X_0, so they commute; each is applied as soon as it is formed, so
    only one X_k exists at a time. left, right: (b, m, m); W: (b, m, n). The m×m products
    (X_0 and the X_k) in ``precision`` (``_matmul``; 'fp16x3' through ``iterate_matmul`` with
    each X_k's max |entry| from the product that made it, its square's scale, and X_k
    converted once for both sides of its square), the thin ones in float32; where
    ``blocks`` > 1 (float32 products) on or above the diagonal's blocks only
    (``_symmetric_baddbmm``).

    The steps stay in X's form: where X_k is small (directions not yet converged) its
    relative rounding stays that of one product per step, where squaring R = I - X_k
    would double R's rounding at every step (2^k·u on x_k's scale: 4e-3 in float32
    after 16)."""
    def t(x):
        return x.transpose(-1, -2) if transpose else x

    fp16 = precision == 'fp16x3' and _split_kernel(left)
    if fp16:
        from .iterate_matmul import baddbmm
        X, x_max = baddbmm(None, left, right, precision=precision)  # X_0, one m×m product
    else:
        X = _matmul(None, left, right, precision=precision, blocks=blocks)
    for k in range(steps - h):
        W = torch.baddbmm(W, t(X), W, beta=2, alpha=-1)  # (2I - X_k)·W
        if k + 1 < steps and fp16:
            X, x_max = baddbmm(X, X, X, beta=2, alpha=-1, precision=precision,
                               amaxes=(x_max, x_max))
        elif k + 1 < steps:
            X = _matmul(X, X, X, beta=2, alpha=-1, precision=precision, blocks=blocks)
    if h:
        R = t(torch.eye(X.shape[-1], dtype=X.dtype, device=X.device) - X)
        T = W
        for _ in range(2**h - 1):
            T = torch.baddbmm(W, R, T)
        W = T
    return W


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
    (``_horner_steps``): with gradients (``horner``), and in inference too with
    ``thin_horner='always'``.

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
        precision, blocks = options['float32_products'], options['symmetric_blocks']
        W = _thin_apply(V, A3, steps, V @ Z3, h, precision=precision, blocks=blocks)
        W = W[:, :m].reshape(Z.shape)
        ctx.steps, ctx.pad_to, ctx.h, ctx.precision = steps, options['pad_to'], h, precision
        ctx.blocks = blocks
        ctx.save_for_backward(A, V, W)
        return W

    @staticmethod
    def backward(ctx, grad_W):
        A, V, W = ctx.saved_tensors
        m = A.shape[-1]
        A3, G3 = _flat_padded(A, grad_W, ctx.pad_to)
        grad_Z = _thin_apply(A3, V, ctx.steps, V.transpose(-1, -2) @ G3, ctx.h,
                             transpose=True, precision=ctx.precision, blocks=ctx.blocks)
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


def newton_pinv(A, iters=20, method='iterative', nonnegative=False, *, eigh_dtype=EIGH_DTYPE,
                tf32_float32_steps=TF32_FLOAT32_STEPS, pad_to=1, float32_products='float32',
                tf32_products='tf32', symmetric_blocks=1, tf32_first_steps=TF32_FIRST_STEPS):
    """Moore–Penrose inverse of (batched) square matrices by Newton–Raphson iteration.

    The result equals ``iters`` steps of V_{k+1} = 2V_k - V_k·A·V_k from V₀ = αA with a
    per-matrix α (``newton_alpha``). Gradients follow paper Eq. 16 (∇A = -Yᵀ·∇Y·Yᵀ)
    rather than back-propagating through the iterations. Always computed in float32 (or
    float64 if A is float64), also under autocast.

    Args:
        A (Tensor): (..., m, m)
        iters (int): number of Newton–Raphson steps T (20 in SOFT).
        method (str): 'iterative', 'spectral' (A must be symmetric, as the Gaussian kernel
            of landmarks is), 'tf32' or 'tf32x3' (module docstring). All give the same
            value up to rounding. (The device's choice, 'auto', is ``plan.py``'s.)
        nonnegative (bool): A is symmetric with nonnegative entries; α is then found in
            O(m²) (same value, see ``newton_alpha``).
        eigh_dtype (str): 'float64', 'float32' or 'mixed' (float32 where a first-order
            error bound allows it, ``_mixed_spectral_factors``): 'spectral''s
            eigendecomposition of a float32 A.
        tf32_float32_steps (tuple[int, int]): 'tf32''s float32 steps before and after
            its TF32 steps (``_schedule``).
        tf32_first_steps (str): 'always' (the first of those for every batch of
            kernels) or 'guarded' (only where a kernel of the batch may sit near the
            step size's boundary, ``first_steps_needed``: one value read on the host,
            which waits for the device; the steps run where it cannot be read, while
            compiling, tracing or capturing a CUDA graph).
        pad_to (int): the iterations run on A zero-padded to a multiple of this many
            landmarks (aligned sizes for tensor cores; same iterate).
        float32_products (str): the float32 m×m products of 'iterative' and 'tf32':
            'float32' (the library's), 'tf32x3' (three TF32 products of split operands,
            as the method 'tf32x3' makes them) or 'fp16x3' (three fp16 products of split
            operands scaled by powers of two: float32's accuracy at twice the rate on
            CUDA; ``_matmul``).
        tf32_products (str): the products of 'tf32''s TF32 steps: 'tf32' (the
            library's TF32 products) or 'fp16' (the same rounding from fp16 tensor
            cores, operands scaled by powers of two: ``iterate_matmul``,
            ``round_fp16_scaled``).
        symmetric_blocks (int): 1 (whole products), or 'iterative''s and 'tf32''s m×m
            products (the library's: ``float32_products='float32'``,
            ``tf32_products='tf32'``) made on or above the diagonal's blocks only, in
            this many row blocks, the rest copied: (k + 1)/(2k) of the flops for k
            blocks. A measured alternative that no plan takes: on duplicated landmarks
            it moves the iterate off the hard-kernel bound (``_symmetric_baddbmm``).
    Returns:
        Tensor: (..., m, m) in A's floating dtype promoted to at least float32.
    """
    _check_method(method, iters)
    options = check_pinv_options(eigh_dtype, tf32_float32_steps, pad_to,
                                 float32_products=float32_products,
                                 tf32_products=tf32_products,
                                 symmetric_blocks=symmetric_blocks,
                                 tf32_first_steps=tf32_first_steps)
    with torch.autocast(device_type=device_type(A), enabled=False):
        return _NewtonPinv.apply(A.to(compute_dtype(A)), iters, method, nonnegative,
                                 options)


def newton_pinv_apply(A, Z, iters=20, method='iterative', nonnegative=False, *,
                      eigh_dtype=EIGH_DTYPE, tf32_float32_steps=TF32_FLOAT32_STEPS, pad_to=1,
                      float32_products='float32', tf32_products='tf32', symmetric_blocks=1,
                      tf32_first_steps=TF32_FIRST_STEPS, thin_steps=0,
                      thin_horner=THIN_HORNER, spectral_inference='eigh'):
    """A⁺·Z for the T-step iterate A⁺ of A, without forming A⁺ where that is cheaper.

    Same value and (Eq. 16) gradients as ``newton_pinv(A, ...) @ Z``. 'iterative',
    'tf32' and 'tf32x3' form A⁺, except the last ``thin_steps`` steps of 'iterative' and
    'tf32', which are applied to Z (``_NewtonPinvThin``; with gradients where that costs
    less than forming them, ``_thin_pays_in_training``); 'spectral' never forms it.

    Args:
        A (Tensor): (..., m, m), float32 or float64.
        Z (Tensor): (..., m, n), A's dtype.
        method (str): one of ``EXACT_PINV_METHODS``.
        eigh_dtype, tf32_float32_steps, pad_to, float32_products, tf32_products,
            symmetric_blocks, tf32_first_steps: as in ``newton_pinv`` (the thin steps'
            X_k in ``float32_products``, and by ``symmetric_blocks``, too).
        thin_steps (int): this many of the float32 steps that end the iteration run on
            the thin Z: one m×m product each instead of two (``_NewtonPinvThin``; at
            most 'tf32''s last float32 steps, every step of 'iterative';
            ``check_thin_steps``). With gradients where that costs less than the formed
            steps (``_thin_pays_in_training``: large kernels).
        thin_horner (str): where the last thin steps run as one sum by Horner's rule
            (one m×m product for all of them) where that costs less than one by one
            (``_horner_steps``: large kernels): 'training' (with gradients only) or
            'always' (in inference too).
        spectral_inference (str): without gradients, how 'spectral' applies its filter to
            a float32 A: 'eigh' (A's eigenvectors, ``eigh_dtype``) or 'tridiagonal'
            (A's tridiagonal form, ``_tridiagonal_apply``; needs SciPy, and T ≥
            ``TRIDIAGONAL_MIN_ITERS``: below, 'eigh'). With gradients, off the CPU, and
            while compiling or tracing (SciPy runs eagerly on CPU tensors), 'eigh'.
    Returns:
        Tensor: (..., m, n)
    """
    _check_method(method, iters)
    options = check_pinv_options(eigh_dtype, tf32_float32_steps, pad_to,
                                 float32_products=float32_products,
                                 tf32_products=tf32_products,
                                 symmetric_blocks=symmetric_blocks,
                                 tf32_first_steps=tf32_first_steps)
    thin_steps = check_thin_steps(thin_steps, method, options['tf32_float32_steps'], iters,
                                  thin_horner)
    check_spectral_inference(spectral_inference)
    grad = torch.is_grad_enabled() and (A.requires_grad or Z.requires_grad)
    if (spectral_inference == 'tridiagonal' and method == 'spectral' and not grad
            and A.dtype == torch.float32 and A.device.type == 'cpu'
            and iters >= TRIDIAGONAL_MIN_ITERS
            and not (is_compiling() or torch.jit.is_tracing())):  # SciPy: eager, CPU
        return _tridiagonal_apply(A, Z.to(A.dtype), iters, nonnegative).to(Z.dtype)
    if thin_steps and (not grad or _thin_pays_in_training(
            thin_steps, -A.shape[-1] // -options['pad_to'] * options['pad_to'], Z.shape[-1],
            A[..., 0, 0].numel())):
        return _NewtonPinvThin.apply(A, Z, iters, method, nonnegative, options, thin_steps,
                                     grad or thin_horner == 'always')
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
