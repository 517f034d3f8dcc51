"""The iterate's m×m products on tensor cores in one Triton kernel: float32 products as
three TF32 or fp16 products of split operands, and TF32 products from fp16 tensor cores.

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
  program per output block splits its operand blocks in registers (``fused._dot``: hi
  and lo rounded to TF32 as ``newton.round_tf32`` rounds, the two small terms summed
  first, then the large one, per block of K). ``precision='fp16x3'`` makes the same
  three products on fp16 tensor cores, at twice the rate: hi and lo of the operand
  scaled as below, lo scaled by 2^11 more so that it is an fp16 normal number where x
  is one (``_fp16_split``); the small terms accumulate apart and join the large ones
  scaled back. With fp16's 11 significant bits per part the split keeps its 2^-22
  (``newton._split_fp16``).
- **TF32 products** (``precision='fp16'``, the plan's ``tf32_products``): the TF32
  steps' products, from fp16 tensor cores, which multiply at twice TF32's rate (989
  against 495 dense TFLOP/s on an H100 SXM). fp16 keeps TF32's 10 mantissa bits in a
  narrower exponent range, so each operand matrix is scaled by a power of two (exact)
  that puts its largest |entry| in [2^14, 2^15) (``_fp16_scale``, from the matrix's max
  |entry|): every entry down to 2^-28 of the largest then rounds to fp16 exactly as
  ``newton.round_tf32`` rounds it to TF32 (to nearest, ties to even), and smaller ones,
  fp16's subnormals, within 2^-39 of the largest. The products accumulate in float32
  and are scaled back in the epilogue. The kernel also writes its result's max |entry|
  per matrix (``out_amax``, an atomic max per program), which the next product's
  scale needs, so a Newton step takes no extra pass over memory for it.

Both add the epilogue β·C + α·(a·b) of ``torch.baddbmm`` (a Newton step 2V - V·X in
one launch).

On CUDA the kernel is compiled by Triton. Elsewhere it runs only in Triton's interpreter
(TRITON_INTERPRET=1 when Triton is imported). Every operand of its tensor-core products
is a TF32 or fp16 value, which tensor cores multiply exactly and the interpreter's
float32 products too: the interpreter computes the same products, up to the order of the
sums.
"""
import torch
import triton
import triton.language as tl

from .fused import INTERPRETER_PROGRAMS, _check_inputs, _dot

__all__ = ['PRECISIONS', 'baddbmm']

PRECISIONS = ('tf32x3', 'fp16', 'fp16x3')
BLOCK_K = 32
# (BM, BN, warps) tried in turn: the first whose output blocks give every streaming
# multiprocessor one, else the last (``_blocks``). Compiled for sm_90 (Triton's ptxas,
# no GPU needed; tests/models/attention/test_iterate_matmul.py) both stay in registers:
# split, 128×64 with 8 warps 176-178 per thread, 64×64 with 4 186-188 (128×128 with 8
# warps and 64×128 with 4 reach 248-255); fp16 154-172, split fp16 192-236.
BLOCKS = ((128, 64, 8), (64, 64, 4))


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
def _baddbmm(a, b, c, out, a_amax, b_amax, out_amax, M, N, K, alpha, beta,
             s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn, s_ob, s_om, s_on,
             HAS_C: tl.constexpr, FP16: tl.constexpr, SPLIT: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Program (row block, column block, batch): out = β·c + α·(a·b) on its block.
    a (B, M, K), b (B, K, N), c and out (B, M, N), any strides. Split TF32 products, or
    where ``FP16`` fp16 products of a and b scaled by ``_fp16_scale`` of a_amax[z] and
    b_amax[z] (where ``SPLIT`` too, three of split operands: ``_fp16_split``), and
    out_amax[z] raised to the block's max |out| (atomic max)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    z = tl.program_id(2)
    kk = tl.arange(0, BK)
    in_rows, in_cols = rows < M, cols < N
    pa = a + z * s_ab + rows[:, None] * s_am + kk[None, :] * s_ak
    pb = b + z * s_bb + kk[:, None] * s_bk + cols[None, :] * s_bn
    if FP16:
        scale_a = _fp16_scale(tl.load(a_amax + z))
        scale_b = _fp16_scale(tl.load(b_amax + z))
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if FP16 and SPLIT:  # the small terms apart, 2^11 times their value
        small = tl.zeros((BM, BN), dtype=tl.float32)
    for start in range(0, K, BK):
        in_k = start + kk < K
        x = tl.load(pa, mask=in_rows[:, None] & in_k[None, :], other=0.)
        y = tl.load(pb, mask=in_k[:, None] & in_cols[None, :], other=0.)
        if FP16 and SPLIT:
            x_hi, x_lo = _fp16_split(x * scale_a)
            y_hi, y_lo = _fp16_split(y * scale_b)
            small = tl.dot(x_hi, y_lo, tl.dot(x_lo, y_hi, small))
            acc = tl.dot(x_hi, y_hi, acc)
        elif FP16:
            acc = tl.dot((x * scale_a).to(tl.float16), (y * scale_b).to(tl.float16), acc)
        else:
            acc = _dot(x, y, acc, True)
        pa += BK * s_ak
        pb += BK * s_bk
    if FP16 and SPLIT:
        acc += small / 2048.
    if FP16:  # the scales undone one at a time (each a power of two: exact)
        acc = acc / scale_a / scale_b
    acc = alpha * acc
    mask = in_rows[:, None] & in_cols[None, :]
    if HAS_C:
        acc += beta * tl.load(c + z * s_cb + rows[:, None] * s_cm + cols[None, :] * s_cn,
                              mask=mask, other=0.)
    tl.store(out + z * s_ob + rows[:, None] * s_om + cols[None, :] * s_on, acc, mask=mask)
    if FP16:
        tl.atomic_max(out_amax + z, tl.max(tl.max(tl.where(mask, tl.abs(acc), 0.), 1), 0))


def _blocks(batch, M, N, device):
    """(BM, BN, warps) for a launch: the larger blocks (``BLOCKS``) where they still give
    each streaming multiprocessor an output block (SOFT-S's stage 1 at 800×1344 has one head:
    m = 1056 is 153 blocks of 128×64 for an H100's 132 SMs)."""
    sms = (torch.cuda.get_device_properties(device).multi_processor_count
           if device.type == 'cuda' else INTERPRETER_PROGRAMS)  # the tests see both
    for BM, BN, warps in BLOCKS:
        if batch * -(-M // BM) * -(-N // BN) >= sms:
            return BM, BN, warps
    return BLOCKS[-1]


def amax(x):
    """Each matrix's max |entry|: (B,) for x (B, M, N), float32 (``baddbmm``'s fp16
    scales)."""
    return x.abs().amax((-2, -1))


def baddbmm(c, a, b, beta=1., alpha=1., precision='tf32x3', amaxes=None, out_amax=None):
    """β·c + α·(a·b) for float32 a (B, M, K) and b (B, K, N), c (B, M, N) or None (then
    α·(a·b)): ``torch.baddbmm`` with the product made on tensor cores in ``precision``
    (module docstring): 'tf32x3' or 'fp16x3' (float32's accuracy), or 'fp16' (TF32's
    rounding). CUDA tensors, or CPU tensors in Triton's interpreter (the same products,
    up to the order of the sums).

    'fp16' and 'fp16x3' return (result, its max |entry| per matrix (B,)), and take
    ``amaxes``, the operands' max |entry| per matrix ((B,), (B,)), where the caller has
    them (a Newton step: A's once, V's and X's from the products that made them); else
    they are computed (``amax``). ``out_amax``: a (B,) float32 tensor of zeros to write
    the result's maxima into (a new one where None)."""
    if precision not in PRECISIONS:
        raise ValueError(f'precision must be one of {PRECISIONS}, got {precision!r}')
    _check_inputs('the iterate kernel', a, b, c)
    B, M, K = a.shape
    N = b.shape[-1]
    if b.shape != (B, K, N) or (c is not None and c.shape != (B, M, N)):
        raise ValueError(f'shapes do not match: a {tuple(a.shape)}, b {tuple(b.shape)}, '
                         f'c {None if c is None else tuple(c.shape)}')
    fp16 = precision != 'tf32x3'
    out = a.new_empty(B, M, N)
    if fp16:
        a_amax, b_amax = (amax(a), amax(b)) if amaxes is None else amaxes
        out_amax = a.new_zeros(B) if out_amax is None else out_amax
        _check_inputs('the iterate kernel', a_amax, b_amax, out_amax)
        if any(t.shape != (B, ) for t in (a_amax, b_amax, out_amax)):
            raise ValueError(f'amaxes and out_amax must be ({B},) tensors, got '
                             f'{[tuple(t.shape) for t in (a_amax, b_amax, out_amax)]}')
    else:
        a_amax = b_amax = out_amax = out  # pointers the program does not read
    BM, BN, warps = _blocks(B, M, N, a.device)
    cc = out if c is None else c
    _baddbmm[(-(-M // BM), -(-N // BN), B)](
        a, b, cc, out, a_amax, b_amax, out_amax, M, N, K, float(alpha), float(beta),
        *a.stride(), *b.stride(), *cc.stride(), *out.stride(), HAS_C=c is not None,
        FP16=fp16, SPLIT=precision == 'fp16x3', BM=BM, BN=BN, BK=BLOCK_K, num_warps=warps)
    return (out, out_amax) if fp16 else out
