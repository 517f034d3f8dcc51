"""The candidates as mmsoft variants (``mmsoft.models.attention.dispatch``): each a small
declared unit, registered when this package is imported, none in any device's plan.

    'tf32-fp16'      CUDA's 'tf32' with its products on fp16 tensor cores: the TF32 steps
                     with TF32's rounding ('fp16'), the float32 steps and the thin
                     steps' X_k as three products of split operands ('fp16x3'), operands
                     converted once and multiplied by cuBLAS (``fp16_products.py``);
                     emulated off CUDA (for checking numerics)
    'tf32-guarded'   'tf32' whose first float32 steps run only for a batch of kernels
                     with one that may sit near the step size's boundary
                     (``first_steps_needed``); one value read on the host per call
    'tf32-horner'    'tf32' whose thin steps run by Horner's rule in inference too (one
                     m×m product for CUDA's 4 thin steps at m = 1056 instead of 4)
    'triton_chunks'  P's chunks, and G = ∇P ⊙ P in backward, each written by one Triton
                     kernel (``triton_chunks.py``): kernel products, not an inverse
"""
import torch
from mmsoft.models.attention import (KernelProducts, Products, newton_alpha, newton_pinv_apply,
                                     register_kernel_products, register_variant)
from mmsoft.models.attention.dispatch import TF32
from mmsoft.models.attention.dtypes import is_compiling
from mmsoft.models.attention.newton import (_NewtonPinvThin, check_pinv_options,
                                            cuda_tf32_matmuls, horner_sum)
from mmsoft.models.attention.step_size import first_step_bound

__all__ = [
    'FIRST_STEP_BOUND', 'FP16_PRODUCTS', 'Fp16Products', 'Fp16TF32', 'GuardedTF32',
    'HornerTF32', 'TritonChunks', 'first_steps_needed', 'register', 'round_fp16_scaled',
    'split_fp16'
]

# 'tf32-guarded' lets a kernel off the first float32 steps where αλ² ≤ FIRST_STEP_BOUND is
# proven for all its eigenvalues, half the boundary's 2
FIRST_STEP_BOUND = 1.


def first_steps_needed(A, alpha, nonnegative=False):
    """Whether a kernel may need 'tf32''s first float32 steps: for each matrix of A
    (..., m, m), symmetric, with step α (``newton_alpha``, (..., 1, 1)), False where
    every eigenvalue λ of A is proven to have αλ² ≤ ``FIRST_STEP_BOUND``
    (``step_size.first_step_bound``).

    TF32 rounding of the first step's operands moves αλ² by about 2^-10 of itself. That
    matters only near the boundary αλ² = 2 of the official step size (1 - αλ² ≈ -1),
    where it can cross 2 and the iterate diverges; from αλ² ≤ 1 the step maps every
    eigenvalue into [0, 1] as float32 does. The bound's rounding, m·2^-24 of the sum at
    most, is far inside the margin to 2. SOFT-S's kernels on real images sit at
    0.006-0.011 (random weights, 384×640); near-identity and near-rank-1 kernels, whose
    λ_max nears the largest row sum, are not let off.

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


class GuardedTF32(TF32):
    """'tf32' with its first float32 steps only where ``first_steps_needed`` says a
    kernel of the batch may need them (where the host cannot read it, they run)."""
    name = 'tf32-guarded'

    def apply(self, A, Z, iters, plan):
        first, last = plan.tf32_float32_steps
        if first and _can_synchronize(A):
            alpha = newton_alpha(A.detach(), nonnegative=True)
            if not bool(first_steps_needed(A.detach(), alpha, True).any()):
                first = 0
        return newton_pinv_apply(A, Z, iters, 'tf32', nonnegative=True,
                                 tf32_float32_steps=(first, last), pad_to=plan.pinv_pad,
                                 thin_steps=plan.thin_steps_for('tf32', iters))


class HornerTF32(TF32):
    """'tf32' with its thin steps by Horner's rule in inference too, where that costs
    less than one by one (``newton._horner_steps``)."""
    name = 'tf32-horner'

    def apply(self, A, Z, iters, plan):
        steps = plan.thin_steps_for('tf32', iters)
        grad = torch.is_grad_enabled() and (A.requires_grad or Z.requires_grad)
        if not steps or grad:
            return super().apply(A, Z, iters, plan)
        options = check_pinv_options(plan.tf32_float32_steps, plan.pinv_pad)
        return _NewtonPinvThin.apply(A, Z, iters, 'tf32', True, options, steps, True)


# --------------------------------------------------------------------- fp16 products
def _fp16_scale(x):
    """Each matrix's power of two that puts its largest |entry| in [2^14, 2^15),
    (..., 1, 1): as ``fp16_products._fp16_scale`` computes it."""
    amax = x.abs().amax((-2, -1), keepdim=True)
    k = (15 - torch.frexp(amax).exponent).clamp(-126, 127)
    return torch.ldexp(torch.ones_like(amax), k)


def round_fp16_scaled(x):
    """float32 values as the 'fp16' products round them: each matrix scaled by the power
    of two that puts its largest |entry| in [2^14, 2^15), rounded to fp16 (to nearest,
    ties to even) and scaled back, still float32: ``round_tf32``'s rounding for every
    entry down to 2^-28 of the matrix's largest; smaller ones within 2^-39 of it."""
    if x.dtype != torch.float32:
        raise TypeError(f'round_fp16_scaled rounds float32 tensors, got {x.dtype}')
    scale = _fp16_scale(x)
    return (x * scale).half().float() / scale


def split_fp16(x):
    """x = hi + lo as the 'fp16x3' products split it, in float32 values: hi =
    ``round_fp16_scaled(x)``, lo = the remainder scaled by 2^11 more, rounded to fp16 and
    scaled back: both exact in a float32 product of two such values."""
    hi = round_fp16_scaled(x)
    scale = _fp16_scale(x) * 2048.
    return hi, ((x - hi) * scale).half().float() / scale


def _split_product(a, b):
    """a·b from split operands (``split_fp16``), small terms first, float32 sums: the
    emulation of an 'fp16x3' product (a (b, m, k), b (b, k, n))."""
    (a_hi, a_lo), (b_hi, b_lo) = split_fp16(a), split_fp16(b)
    return torch.bmm(a_lo, b_hi).baddbmm_(a_hi, b_lo).baddbmm_(a_hi, b_hi)


class Fp16Products(Products):
    """The iterate's products on fp16 tensor cores (module docstring): on CUDA cuBLAS's
    products of operands converted once (``fp16_products.py``), elsewhere emulated."""

    def steps(self, A, V, count, precision):
        if count <= 0 or A.dtype != torch.float32:
            return super().steps(A, V, count, precision)
        kind = 'fp16' if precision == 'tf32' else 'fp16x3'
        if A.is_cuda:
            from .fp16_products import amax, fp16_operand, fp16_product
            A16 = fp16_operand(A, amax(A), kind, right=False)
            v_amax = amax(V)
            for _ in range(count):
                V16 = fp16_operand(V, v_amax, kind)
                X, x_amax = fp16_product(None, A16, V16, precision=kind)
                X16 = fp16_operand(X, x_amax, kind, left=False)
                V, v_amax = fp16_product(V, V16, X16, beta=2, alpha=-1, precision=kind)
            return V
        if A.device.type == 'meta':  # what CUDA runs, in operator counts: TF32's
            with cuda_tf32_matmuls():
                return super().steps(A, V, count, precision)
        for _ in range(count):
            if kind == 'fp16':
                Vt = round_fp16_scaled(V)
                X = round_fp16_scaled(round_fp16_scaled(A) @ Vt)
                V = torch.baddbmm(V, Vt, X, beta=2, alpha=-1)
            else:
                V = torch.add(V, V).sub_(_split_product(V, _split_product(A, V)))
        return V

    def thin_apply(self, left, right, steps, W, h, transpose=False):
        if left.dtype != torch.float32 or not (left.is_cuda or left.device.type == 'cpu'):
            return super().thin_apply(left, right, steps, W, h, transpose)

        def t(x):
            return x.transpose(-1, -2) if transpose else x

        if left.is_cuda:
            from .fp16_products import product
            X, x_max = product(None, left, right)
        else:
            X = _split_product(left, right)
        for k in range(steps - h):
            W = torch.baddbmm(W, t(X), W, beta=2, alpha=-1)  # (2I - X_k)·W
            if k + 1 < steps and left.is_cuda:
                X, x_max = product(X, X, X, beta=2, alpha=-1, amaxes=(x_max, x_max))
            elif k + 1 < steps:
                X = torch.add(X, X).sub_(_split_product(X, X))
        return horner_sum(W, X, h, transpose)


FP16_PRODUCTS = Fp16Products()


class Fp16TF32(TF32):
    """'tf32' with the fp16 products (``Fp16Products``). On CUDA it needs Triton (the
    conversion passes) and torch 2.8 or later (cuBLAS's fp16 products with float32
    results), eagerly; elsewhere emulated."""
    name = 'tf32-fp16'

    def not_supported_reasons(self, inputs):
        reasons = super().not_supported_reasons(inputs)
        if inputs.device == 'cuda':
            if not hasattr(torch.ops.aten.bmm, 'dtype'):  # fp16_products.cublas_fp16
                reasons.append("needs torch.bmm's out_dtype (torch 2.8 or later)")
            if inputs.compiling or inputs.tracing or inputs.capturing:
                reasons.append('runs eagerly only (its conversion passes are Triton '
                               'kernels)')
        return reasons

    def apply(self, A, Z, iters, plan):
        return newton_pinv_apply(A, Z, iters, 'tf32', nonnegative=True,
                                 tf32_float32_steps=plan.tf32_float32_steps,
                                 pad_to=plan.pinv_pad,
                                 thin_steps=plan.thin_steps_for('tf32', iters),
                                 products=FP16_PRODUCTS)


# --------------------------------------------------------------------- P's chunks
class TritonChunks(KernelProducts):
    """P's chunks (and G) from one Triton kernel each (``triton_chunks.py``): float32,
    on CUDA, or on the CPU in Triton's interpreter; eager code only."""
    name = 'triton_chunks'
    dtypes = (torch.float32, )
    compilable = False
    traceable = False
    capturable = False
    requires = ('triton', )

    def not_supported_reasons(self, inputs):
        reasons = super().not_supported_reasons(inputs)
        if not reasons and inputs.device != 'cuda':
            from .triton_chunks import interpreting
            if not interpreting():
                reasons.append("runs on CUDA, elsewhere only in Triton's interpreter "
                               '(TRITON_INTERPRET=1)')
        return reasons

    def form(self, fq, fl):
        from .triton_chunks import kernel
        return kernel(fq, fl)

    def form_with_grad(self, fq, fl, left, right, keep_p):
        from .triton_chunks import kernel_and_grad
        return kernel_and_grad(fq, fl, left, right, keep_p=keep_p)


def register():
    """Register the candidates with mmsoft's dispatch (once; this package's import does)."""
    from mmsoft.models.attention import KERNEL_PRODUCTS, VARIANTS
    for variant in (Fp16TF32(), GuardedTF32(), HornerTF32()):
        if variant.name not in VARIANTS:
            register_variant(variant)
    if 'triton_chunks' not in KERNEL_PRODUCTS:
        register_kernel_products(TritonChunks())
