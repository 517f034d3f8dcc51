"""The iterate's m×m products on tensor cores: float32 products as three TF32 or fp16
products of split operands, and TF32 products from fp16 tensor cores.

``newton.py``'s iterations make 2T products of m×m matrices per kernel. Two kinds run
faster here than in the library, with the library's rounding:

- **float32 products** (``precision='tf32x3'``, the plan's ``float32_products``). The
  library makes them on CUDA cores (cuBLAS's float32 GEMM, about 40 TFLOP/s on an H100
  at m = 1056, against 180 for its TF32 products: docs/en/notes/per_device_plans.md).
  The 3xTF32 form keeps float32's accuracy on tensor cores: with x = hi + lo, hi = x
  rounded to TF32 and lo = x - hi,

      a·b ≈ lo_a·hi_b + hi_a·lo_b + hi_a·hi_b

  (the dropped lo_a·lo_b is about 2^-22 of a·b). ``newton._split_bmm`` makes it of
  three library products and the splits as separate passes over memory; here one
  program per output block splits its float32 operand blocks in registers
  (``fused._dot``: hi and lo rounded to TF32 as ``newton.round_tf32`` rounds, the two
  small terms summed first, then the large one, per block of K). ``precision='fp16x3'``
  makes the same three products on fp16 tensor cores, at twice the rate: hi and lo of
  the operand scaled as below, lo scaled by 2^11 more so that it is an fp16 normal
  number where x is one (``_fp16_split``); the small terms accumulate apart and join
  the large ones scaled back. With fp16's 11 significant bits per part the split keeps
  its 2^-22 (``newton._split_fp16``).
- **TF32 products** (``precision='fp16'``, the plan's ``tf32_products``): the TF32
  steps' products, from fp16 tensor cores, which multiply at twice TF32's rate (989
  against 495 dense TFLOP/s on an H100 SXM). fp16 keeps TF32's 10 mantissa bits in a
  narrower exponent range, so each operand matrix is scaled by a power of two (exact)
  that puts its largest |entry| in [2^14, 2^15) (``_fp16_scale``, from the matrix's max
  |entry|): every entry down to 2^-28 of the largest then rounds to fp16 exactly as
  ``newton.round_tf32`` rounds it to TF32 (to nearest, ties to even), and smaller ones,
  fp16's subnormals, within 2^-39 of the largest. The products accumulate in float32
  and are scaled back.

The fp16 operands are converted once per matrix, in one pass over memory
(``fp16_operand``: scaled, rounded and, for 'fp16x3', split; fp16 values, half
float32's bytes), so that an operand used in two products is converted once: a Newton
step converts A once for all its steps, V once for A·V and V·X. For 'fp16x3' an operand
is laid out so that the two small terms are one product, [lo_a | hi_a]·[hi_b; lo_b]
(inner size 2K), and the hi halves give the large one (``Fp16Operand``). The products
are then made one of two ways (``GEMMS``; ``fp16_gemm`` chooses where the caller does
not):

- ``'triton'``: ``_baddbmm``, a program per output block, loads the fp16 tiles (copied
  to shared memory asynchronously), multiplies them on the tensor cores into float32
  accumulators and undoes the scales in its epilogue, with the rest of the epilogue
  (below): one launch per product.
- ``'cublas'`` (torch 2.8 on: ``torch.bmm(..., out_dtype=torch.float32)``): cuBLAS's
  fp16 products with float32 sums and results (two for 'fp16x3'), then one pass that
  undoes the scales and adds the epilogue (``_unscale``). On CPU tensors, in the
  interpreter's tests, float32 library products of the fp16 values stand in: exact
  products of 11-bit significands, float32 sums.

Every product adds the epilogue β·C + α·(a·b) of ``torch.baddbmm`` (a Newton step
2V - V·X in one launch), and the fp16 ones write their result's max |entry| per matrix
(``out_amax``, an atomic max per program), which the next conversion's scale needs, so
a Newton step takes no pass of its own for it. The two ways multiply the same values;
their results differ by the order of the sums.

On CUDA the Triton programs are compiled by Triton. Elsewhere they run only in Triton's
interpreter (TRITON_INTERPRET=1 when Triton is imported). Every operand of their
tensor-core products is a TF32 or fp16 value, which tensor cores multiply exactly and
the interpreter's float32 products too: the interpreter computes the same products, up
to the order of the sums. An H200 measured the kernel when it converted float32
operand blocks in its loop (80 TFLOP/s at m = 1056 for 'fp16', against cuBLAS's 126
with TF32: docs/en/notes/per_device_plans.md); neither way of today is measured yet.
"""
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from .fused import INTERPRETER_PROGRAMS, _check_inputs, _dot

__all__ = ['GEMMS', 'PRECISIONS', 'Fp16Operand', 'baddbmm', 'fp16_gemm', 'fp16_operand',
           'fp16_product']

PRECISIONS = ('tf32x3', 'fp16', 'fp16x3')
GEMMS = ('cublas', 'triton')
BLOCK_K = 32
# the passes that convert operands and undo scales (``fp16_operand``, ``fp16_product``):
# blocks of 64×64 entries, 8 warps (16 entries per thread; compiled for sm_90, 48-104
# registers per thread, against 96-187 with 4 warps)
PASS_BLOCK = 64
PASS_WARPS = 8
# (BM, BN, warps) tried in turn: the first whose output blocks give every streaming
# multiprocessor one, else the last (``_blocks``). Compiled for sm_90 (Triton's ptxas,
# no GPU needed; tests/models/attention/test_iterate_matmul.py), specialized as a launch
# on padded kernels is (m a multiple of 32), both stay in registers with the operand
# tiles copied to shared memory asynchronously: split TF32, 128×64 with 8 warps 150 per
# thread, 64×64 with 4 125-126.
BLOCKS = ((128, 64, 8), (64, 64, 4))
# The same for the kernel's fp16 products of converted operands (the 'triton' way),
# with BLOCK_K16 of the inner size per step (fp16 tiles 64 wide: 128 bytes a row):
# 'fp16' 128×128 with 8 warps 120-204 registers, 64×64 with 4 71-93; 'fp16x3' 215-217
# and 128-133 (128×256 spills). Where the sizes are not multiples of 16 the launch is
# not specialized for them, and 128×128 spills: 64×64 then.
BLOCKS16 = ((128, 128, 8), (64, 64, 4))
BLOCK_K16 = 64


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
def _baddbmm(a, b, c, out, a_amax, b_amax, out_amax, M, N, K, alpha, beta,
             s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn, s_ob, s_om, s_on,
             HAS_C: tl.constexpr, FP16: tl.constexpr, SPLIT: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Program (row block, column block, batch): out = β·c + α·(a·b) on its block, for an
    inner size K; c and out (B, M, N), any strides. Split TF32 products of float32 a
    (B, M, K) and b (B, K, N), any strides; or where ``FP16`` fp16 products of operands
    ``fp16_operand`` converted (a its left, b its right layout: scaled by ``_fp16_scale``
    of a_amax[z] and b_amax[z]; where ``SPLIT`` [lo | hi] (B, M, 2K) and [hi; lo]
    (B, 2K, N), three products: the small terms apart, 2^11 times their value), undone
    in the epilogue, and out_amax[z] raised to the block's max |out| (atomic max)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    z = tl.program_id(2)
    kk = tl.arange(0, BK)
    in_rows, in_cols = rows < M, cols < N
    pa = a + z * s_ab + rows[:, None] * s_am + kk[None, :] * s_ak
    pb = b + z * s_bb + kk[:, None] * s_bk + cols[None, :] * s_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    small = acc  # the small terms' sums where FP16 and SPLIT, else unread
    if FP16 and SPLIT:
        small = tl.zeros((BM, BN), dtype=tl.float32)
    for start in range(0, K, BK):
        in_k = start + kk < K
        x = tl.load(pa, mask=in_rows[:, None] & in_k[None, :], other=0.)
        y = tl.load(pb, mask=in_k[:, None] & in_cols[None, :], other=0.)
        if FP16 and SPLIT:  # x: lo_a, y: hi_b; hi_a and lo_b K further on
            x_hi = tl.load(pa + K * s_ak, mask=in_rows[:, None] & in_k[None, :], other=0.)
            y_lo = tl.load(pb + K * s_bk, mask=in_k[:, None] & in_cols[None, :], other=0.)
            small = tl.dot(x_hi, y_lo, tl.dot(x, y, small))
            acc = tl.dot(x_hi, y, acc)
        elif FP16:
            acc = tl.dot(x, y, acc)
        else:
            acc = _dot(x, y, acc, True)
        pa += BK * s_ak
        pb += BK * s_bk
    _epilogue(acc, small, z, rows, cols, c, out, a_amax, b_amax, out_amax, M, N, alpha,
              beta, s_cb, s_cm, s_cn, s_ob, s_om, s_on, HAS_C, FP16, FP16 and SPLIT)


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
    """Program (row block, column block, batch): ``_baddbmm``'s epilogue on its block of
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


def _blocks(batch, M, N, device, blocks=BLOCKS):
    """(BM, BN, warps) for a launch: the larger blocks (of ``blocks``: ``BLOCKS``, or
    ``BLOCKS16`` for fp16 products) where they still give each streaming multiprocessor
    an output block (SOFT-S's stage 1 at 800×1344 has one head: m = 1056 is 153 blocks of
    128×64 for an H100's 132 SMs)."""
    sms = (torch.cuda.get_device_properties(device).multi_processor_count
           if device.type == 'cuda' else INTERPRETER_PROGRAMS)  # the tests see both
    for BM, BN, warps in blocks:
        if batch * -(-M // BM) * -(-N // BN) >= sms:
            return BM, BN, warps
    return blocks[-1]


def _fp16_blocks(batch, M, N, K, device):
    """(BM, BN, warps) of the kernel's fp16 products (``_blocks`` of ``BLOCKS16``): the
    large blocks only where M, N and K are multiples of 16, which Triton's launcher
    specializes the kernel for (else they spill registers on sm_90)."""
    aligned = M % 16 == 0 and N % 16 == 0 and K % 16 == 0
    return _blocks(batch, M, N, device, BLOCKS16 if aligned else BLOCKS16[-1:])


def amax(x):
    """Each matrix's max |entry|: (B,) for x (B, M, N), float32 (``baddbmm``'s fp16
    scales)."""
    return x.abs().amax((-2, -1))


def _cublas_fp16():
    """Whether torch has cuBLAS products of fp16 operands with float32 results
    (``torch.bmm``'s ``out_dtype``, torch 2.8 on)."""
    return hasattr(torch.ops.aten.bmm, 'dtype')


def fp16_gemm():
    """How the fp16 products are made where no caller says (module docstring):
    'cublas' where torch has them (``_cublas_fp16``), else 'triton'."""
    return 'cublas' if _cublas_fp16() else 'triton'


def _check_gemm(gemm, device):
    if gemm not in GEMMS:
        raise ValueError(f'gemm must be one of {GEMMS}, got {gemm!r}')
    if gemm == 'cublas' and device.type == 'cuda' and not _cublas_fp16():
        raise ValueError("gemm='cublas' needs torch.bmm's out_dtype (torch 2.8 or later), "
                         f'this is torch {torch.__version__}')


class Fp16Operand(NamedTuple):
    """A float32 matrix batch x (B, M, K) converted for the fp16 products, either way
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
    if precision not in ('fp16', 'fp16x3'):
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


def fp16_product(c, a, b, beta=1., alpha=1., precision='fp16', out_amax=None, gemm=None):
    """β·c + α·(a·b) from ``Fp16Operand`` a (its left) and b (its right), made the
    ``gemm`` way (module docstring; None: ``fp16_gemm()``): (result (B, M, N) float32, its
    max |entry| per matrix (B,)), as ``baddbmm`` returns them; c (B, M, N) float32 or
    None; ``out_amax`` a (B,) float32 tensor of zeros for the maxima (a new one where
    None)."""
    gemm = fp16_gemm() if gemm is None else gemm
    _check_gemm(gemm, a.amax.device)
    if precision not in ('fp16', 'fp16x3') or a.left is None or b.right is None:
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
    if gemm == 'triton':  # one kernel: the products and the epilogue
        out = a.amax.new_empty(B, M, N)
        cc = out if c is None else c
        BM, BN, warps = _fp16_blocks(B, M, N, K, out.device)
        _baddbmm[(-(-M // BM), -(-N // BN), B)](
            a.left, b.right, cc, out, a.amax, b.amax, out_amax, M, N, K, float(alpha),
            float(beta), *a.left.stride(), *b.right.stride(), *cc.stride(), *out.stride(),
            HAS_C=c is not None, FP16=True, SPLIT=split, BM=BM, BN=BN, BK=BLOCK_K16,
            num_warps=warps)
        return out, out_amax
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


def baddbmm(c, a, b, beta=1., alpha=1., precision='tf32x3', amaxes=None, out_amax=None,
            gemm=None):
    """β·c + α·(a·b) for float32 a (B, M, K) and b (B, K, N), c (B, M, N) or None (then
    α·(a·b)): ``torch.baddbmm`` with the product made on tensor cores in ``precision``
    (module docstring): 'tf32x3' or 'fp16x3' (float32's accuracy), or 'fp16' (TF32's
    rounding). CUDA tensors, or CPU tensors in Triton's interpreter (the same products,
    up to the order of the sums).

    'fp16' and 'fp16x3' return (result, its max |entry| per matrix (B,)), and take
    ``amaxes``, the operands' max |entry| per matrix ((B,), (B,)), where the caller has
    them (a Newton step: A's once, V's and X's from the products that made them); else
    they are computed (``amax``). ``out_amax``: a (B,) float32 tensor of zeros to write
    the result's maxima into (a new one where None). ``gemm``: how the fp16 products
    are made, 'cublas' or 'triton' (module docstring; None: ``fp16_gemm()``); 'tf32x3'
    runs in the Triton kernel. An operand given as both a and b is converted once
    (``fp16_operand``).
    """
    if precision not in PRECISIONS:
        raise ValueError(f'precision must be one of {PRECISIONS}, got {precision!r}')
    gemm = fp16_gemm() if gemm is None else gemm
    _check_gemm(gemm, a.device)
    _check_inputs('the iterate kernel', a, b, c)
    B, M, K = a.shape
    N = b.shape[-1]
    if b.shape != (B, K, N) or (c is not None and c.shape != (B, M, N)):
        raise ValueError(f'shapes do not match: a {tuple(a.shape)}, b {tuple(b.shape)}, '
                         f'c {None if c is None else tuple(c.shape)}')
    if precision != 'tf32x3':
        a_amax, b_amax = (amax(a), amax(b)) if amaxes is None else amaxes
        if a is b:
            a_op = b_op = fp16_operand(a, a_amax, precision)
        else:
            a_op = fp16_operand(a, a_amax, precision, right=False)
            b_op = fp16_operand(b, b_amax, precision, left=False)
        return fp16_product(c, a_op, b_op, beta=beta, alpha=alpha, precision=precision,
                            out_amax=out_amax, gemm=gemm)
    out = a.new_empty(B, M, N)
    BM, BN, warps = _blocks(B, M, N, a.device)
    cc = out if c is None else c
    _baddbmm[(-(-M // BM), -(-N // BN), B)](
        a, b, cc, out, out, out, out, M, N, K, float(alpha), float(beta), *a.stride(),
        *b.stride(), *cc.stride(), *out.stride(), HAS_C=c is not None, FP16=False,
        SPLIT=False, BM=BM, BN=BN, BK=BLOCK_K, num_warps=warps)  # out: unread maxima
    return out
