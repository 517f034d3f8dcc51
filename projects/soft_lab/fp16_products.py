"""The fp16 tensor-core products of the candidate 'tf32-fp16' (``variants.py``): TF32's
rounding, and float32's accuracy from three products of split operands, at twice TF32's
rate, with the operands converted once and multiplied by cuBLAS.

- **TF32 products** (``precision='fp16'``): the TF32 steps' products from fp16 tensor
  cores, which multiply at twice TF32's rate (989 against 495 dense TFLOP/s on an H100
  SXM). fp16 keeps TF32's 10 mantissa bits in a narrower exponent range, so each operand
  matrix is scaled by a power of two (exact) that puts its largest |entry| in
  [2^14, 2^15) (``_fp16_scale``, from the matrix's max |entry|): every entry down to
  2^-28 of the largest then rounds to fp16 exactly as ``round_tf32`` rounds it to TF32
  (to nearest, ties to even), and smaller ones, fp16's subnormals, within 2^-39 of the
  largest. The products accumulate in float32 and are scaled back.
- **float32 products** (``precision='fp16x3'``): with x = hi + lo, hi = x scaled and
  rounded to fp16, lo = the remainder scaled by 2^11 more and rounded (``_fp16_split``),
  a·b ≈ lo_a·hi_b + hi_a·lo_b + hi_a·hi_b keeps float32's 2^-22 (the dropped lo_a·lo_b
  is about 2^-22 of a·b).

The fp16 operands are converted once per matrix, in one pass over memory
(``fp16_operand``: scaled, rounded and, for 'fp16x3', split; fp16 values, half float32's
bytes), so that an operand used in two products is converted once: a Newton step
converts A once for all its steps, V once for A·V and V·X. For 'fp16x3' an operand is
laid out so that the two small terms are one product, [lo_a | hi_a]·[hi_b; lo_b] (inner
size 2K), and the hi halves give the large one (``Fp16Operand``). cuBLAS makes the fp16
products with float32 sums and results (``torch.bmm(..., out_dtype=torch.float32)``,
torch 2.8 on; two for 'fp16x3'), then one pass undoes the scales and adds the epilogue
β·C + α·(a·b) (``_unscale``), writing the result's max |entry| per matrix for the next
conversion's scale. On CPU tensors, in the interpreter's tests, float32 library products
of the fp16 values stand in: exact products of 11-bit significands, float32 sums.

Not measured on a GPU in this form (an H200 measured an earlier Triton product that
converted float32 operand blocks in its loop: 80 TFLOP/s at m = 1056 for 'fp16', against
cuBLAS's 126 with TF32; SOFT-S's forward at 800×1344 then 90.4 ms with both kinds
against 92.6 ms for CUDA's plan, within the rounds' spread).
"""
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from .triton_chunks import interpreting

__all__ = ['PRECISIONS', 'Fp16Operand', 'amax', 'cublas_fp16', 'fp16_operand', 'fp16_product',
           'product']

PRECISIONS = ('fp16', 'fp16x3')
# the passes that convert operands and undo scales (``fp16_operand``, ``fp16_product``):
# blocks of 64×64 entries, 8 warps (16 entries per thread; compiled for sm_90, 48-104
# registers per thread, against 96-187 with 4 warps)
PASS_BLOCK = 64
PASS_WARPS = 8


@triton.jit
def _fp16_scale(amax):
    """2^(15 - e) for a matrix's max |entry| amax = f·2^e, f in [0.5, 1) (frexp's e, from
    the float's exponent bits): the power of two that puts amax·2^(15 - e) in [2^14,
    2^15), within fp16's range (65504). Its exponent stays within float32's normal range
    (a zero matrix: 2^127, whose products are 0 all the same)."""
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 126
    k = tl.minimum(tl.maximum(15 - e, -126), 127)
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _fp16_split(x):
    """(hi, lo) of a scaled float32 block: hi = x rounded to fp16, lo = (x - hi)·2^11
    rounded to fp16 (x - hi is exact in float32)."""
    hi = x.to(tl.float16)
    return hi, ((x - hi.to(tl.float32)) * 2048.).to(tl.float16)


@triton.jit
def _epilogue(acc, small, z, rows, cols, c, out, a_amax, b_amax, out_amax, M, N, alpha,
              beta, s_cb, s_cm, s_cn, s_ob, s_om, s_on, HAS_C: tl.constexpr,
              FP16: tl.constexpr, SPLIT: tl.constexpr):
    """out = β·c + α·(a·b) on the block (rows, cols) of matrix z, from the product's
    float32 sums acc (and where ``SPLIT`` the small terms' apart, 2^11 times their
    value: added first); where ``FP16`` the operands' scales (``_fp16_scale`` of
    a_amax[z] and b_amax[z]) undone one at a time (each a power of two: exact) and
    out_amax[z] raised to the block's max |out| (atomic max). c and out any strides."""
    if SPLIT:
        acc += small / 2048.
    if FP16:
        acc = acc / _fp16_scale(tl.load(a_amax + z)) / _fp16_scale(tl.load(b_amax + z))
    acc = alpha * acc
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    if HAS_C:
        acc += beta * tl.load(c + z * s_cb + rows[:, None] * s_cm + cols[None, :] * s_cn,
                              mask=mask, other=0.)
    tl.store(out + z * s_ob + rows[:, None] * s_om + cols[None, :] * s_on, acc, mask=mask)
    if FP16:
        tl.atomic_max(out_amax + z, tl.max(tl.max(tl.where(mask, tl.abs(acc), 0.), 1), 0))




@triton.jit
def _to_fp16(x, x_amax, left, right, M, K, s_xb, s_xm, s_xk, SPLIT: tl.constexpr,
             LEFT: tl.constexpr, RIGHT: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """Program (row block, column block, batch): x·s rounded to fp16 for the block, s =
    ``_fp16_scale`` of x_amax[z], into ``right`` (B, M, K); where ``SPLIT`` hi and lo =
    (x·s - hi)·2^11 rounded (``_fp16_split``), laid out as ``Fp16Operand``'s: ``left``
    (B, M, 2K) [lo | hi] where ``LEFT``, ``right`` (B, 2M, K) [hi; lo] where ``RIGHT``,
    both contiguous. x (B, M, K) float32, any strides."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    z = tl.program_id(2)
    mask = (rows < M)[:, None] & (cols < K)[None, :]
    v = tl.load(x + z * s_xb + rows[:, None] * s_xm + cols[None, :] * s_xk, mask=mask,
                other=0.) * _fp16_scale(tl.load(x_amax + z))
    if SPLIT:
        v_hi, v_lo = _fp16_split(v)
        if LEFT:
            at = left + z * M * 2 * K + rows[:, None] * 2 * K + cols[None, :]
            tl.store(at + K, v_hi, mask=mask)
            tl.store(at, v_lo, mask=mask)
        if RIGHT:
            at = right + z * 2 * M * K + rows[:, None] * K + cols[None, :]
            tl.store(at, v_hi, mask=mask)
            tl.store(at + M * K, v_lo, mask=mask)
    else:
        tl.store(right + z * M * K + rows[:, None] * K + cols[None, :], v.to(tl.float16),
                 mask=mask)


@triton.jit
def _unscale(acc, small, c, out, a_amax, b_amax, out_amax, M, N, alpha, beta,
             s_cb, s_cm, s_cn, s_ob, s_om, s_on, HAS_C: tl.constexpr, SPLIT: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr):
    """Program (row block, column block, batch): the products' epilogue on its block of
    cuBLAS's results, out = β·c + α·(acc + small/2^11)/(s_a·s_b) (``_epilogue``). acc
    and small: (B, M, N), contiguous (small read only where ``SPLIT``); c and out any
    strides (out may be acc: each entry is read before it is written)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    z = tl.program_id(2)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    at = z * M * N + rows[:, None] * N + cols[None, :]
    v = tl.load(acc + at, mask=mask, other=0.)
    small_terms = v  # unread unless SPLIT
    if SPLIT:
        small_terms = tl.load(small + at, mask=mask, other=0.)
    _epilogue(v, small_terms, z, rows, cols, c, out, a_amax, b_amax, out_amax, M, N, alpha, beta,
              s_cb, s_cm, s_cn, s_ob, s_om, s_on, HAS_C, True, SPLIT)






def amax(x):
    """Each matrix's max |entry|: (B,) for x (B, M, N), float32 (the fp16 scales)."""
    return x.abs().amax((-2, -1))


def cublas_fp16():
    """Whether torch has cuBLAS products of fp16 operands with float32 results
    (``torch.bmm``'s ``out_dtype``, torch 2.8 on)."""
    return hasattr(torch.ops.aten.bmm, 'dtype')


def _check_inputs(what, *tensors):
    """That the kernels can take the tensors: on CUDA, or on the CPU in Triton's
    interpreter; float32 (None skipped)."""
    if not tensors[0].is_cuda and not interpreting():
        raise ValueError(f"{what} run on CUDA tensors, elsewhere only in Triton's "
                         'interpreter (TRITON_INTERPRET=1 when Triton is imported); got a '
                         f'tensor on {tensors[0].device}')
    for t in tensors:
        if t is not None and t.dtype != torch.float32:
            raise ValueError(f'{what} take float32 tensors, got {t.dtype}')


class Fp16Operand(NamedTuple):
    """A float32 matrix batch x (B, M, K) converted for the fp16 products
    (``fp16_operand``): its max |entry| per matrix (B,), which gives the scale, and its
    fp16 values as a left operand (a of a·b) and as a right one (b), None where not
    made. 'fp16': x·s rounded, (B, M, K), the same tensor on both sides. 'fp16x3':
    left [lo | hi] (B, M, 2K), right [hi; lo] (B, 2M, K), so that left_a·right_b is the
    two small terms lo_a·hi_b + hi_a·lo_b, and the hi halves (views) the large one."""
    amax: torch.Tensor
    left: Optional[torch.Tensor]
    right: Optional[torch.Tensor]


def fp16_operand(x, x_amax, precision, left=True, right=True):
    """x (B, M, K) float32 as the fp16 products take it (``Fp16Operand``), with
    ``x_amax`` its max |entry| per matrix (B,) (``amax``, or the product that made x):
    one pass over x, which writes every layout asked for."""
    if precision not in PRECISIONS:
        raise ValueError(f"fp16 operands are made for 'fp16' or 'fp16x3', got {precision!r}")
    _check_inputs('the fp16 conversion', x, x_amax)
    B, M, K = x.shape
    if x_amax.shape != (B, ):
        raise ValueError(f'x_amax must be a ({B},) tensor, got {tuple(x_amax.shape)}')
    split = precision == 'fp16x3'
    half = dict(dtype=torch.float16, device=x.device)
    if split:
        lx = torch.empty(B, M, 2 * K, **half) if left else None
        rx = torch.empty(B, 2 * M, K, **half) if right else None
    else:
        lx = rx = torch.empty(B, M, K, **half)  # one tensor for both sides
    stand_in = lx if rx is None else rx  # for a layout not asked for: not written
    _to_fp16[(-(-M // PASS_BLOCK), -(-K // PASS_BLOCK), B)](
        x, x_amax, stand_in if lx is None else lx, stand_in if rx is None else rx, M, K,
        *x.stride(), SPLIT=split, LEFT=split and left, RIGHT=right or not split,
        BM=PASS_BLOCK, BK=PASS_BLOCK, num_warps=PASS_WARPS)
    return Fp16Operand(x_amax, lx if left else None, rx if right else None)


def _gemm16(x, y):
    """x·y for fp16 x (B, M, K), y (B, K, N): float32 products and sums, float32 result.
    On CUDA cuBLAS's (tensor cores, float32 accumulation); in the interpreter's tests the
    same values in a float32 library product (products of 11-bit significands are exact
    in float32)."""
    if x.is_cuda:
        return torch.bmm(x, y, out_dtype=torch.float32)
    return torch.bmm(x.float(), y.float())


def fp16_product(c, a, b, beta=1., alpha=1., precision='fp16', out_amax=None):
    """β·c + α·(a·b) from ``Fp16Operand`` a (its left) and b (its right): (result
    (B, M, N) float32, its max |entry| per matrix (B,)); c (B, M, N) float32 or None;
    ``out_amax`` a (B,) float32 tensor of zeros for the maxima (a new one where None)."""
    if a.amax.is_cuda and not cublas_fp16():
        raise ValueError("the fp16 products need torch.bmm's out_dtype (torch 2.8 or later), "
                         f'this is torch {torch.__version__}')
    if precision not in PRECISIONS or a.left is None or b.right is None:
        raise ValueError("fp16_product takes 'fp16' or 'fp16x3' and operands converted as a "
                         f'left and a right one; got {precision!r}, left '
                         f'{a.left is not None}, right {b.right is not None}')
    split = precision == 'fp16x3'
    B, M, Ka = a.left.shape
    K = Ka // 2 if split else Ka
    N = b.right.shape[-1]
    if b.right.shape != (B, 2 * K if split else K, N) or (
            c is not None and c.shape != (B, M, N)):
        raise ValueError(f'shapes do not match: a {tuple(a.left.shape)}, b '
                         f'{tuple(b.right.shape)}, c {None if c is None else tuple(c.shape)}')
    out_amax = a.amax.new_zeros(B) if out_amax is None else out_amax
    _check_inputs('the fp16 products', a.amax, b.amax, c, out_amax)
    if out_amax.shape != (B, ):
        raise ValueError(f'out_amax must be a ({B},) tensor, got {tuple(out_amax.shape)}')
    if split:
        small = _gemm16(a.left, b.right)
        acc = _gemm16(a.left[:, :, K:], b.right[:, :K])
    else:
        small, acc = None, _gemm16(a.left, b.right)
    cc = acc if c is None else c
    grid = (-(-M // PASS_BLOCK), -(-N // PASS_BLOCK), B)
    _unscale[grid](acc, acc if small is None else small, cc, acc, a.amax, b.amax, out_amax,
                   M, N, float(alpha), float(beta), *cc.stride(), *acc.stride(),
                   HAS_C=c is not None, SPLIT=split, BM=PASS_BLOCK, BN=PASS_BLOCK,
                   num_warps=PASS_WARPS)
    return acc, out_amax


def product(c, a, b, beta=1., alpha=1., precision='fp16x3', amaxes=None):
    """β·c + α·(a·b) for float32 a (B, M, K), b (B, K, N) and c (B, M, N) or None, made
    by the fp16 products in ``precision``: (result, its max |entry| per matrix (B,)).
    ``amaxes``: the operands' max |entry| per matrix where the caller has them (else
    computed); an operand given as both a and b is converted once."""
    a_amax, b_amax = (amax(a), amax(b)) if amaxes is None else amaxes
    if a is b:
        a_op = b_op = fp16_operand(a, a_amax, precision)
    else:
        a_op = fp16_operand(a, a_amax, precision, right=False)
        b_op = fp16_operand(b, b_amax, precision, left=False)
    return fp16_product(c, a_op, b_op, beta=beta, alpha=alpha, precision=precision)
