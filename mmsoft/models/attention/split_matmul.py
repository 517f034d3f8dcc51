"""Float32 products on tensor cores: three TF32 products of split operands in one kernel.

The iterate's float32 m×m products (``newton.py``: the float32 steps of 'iterative' and
'tf32', the thin steps' X_k) run on CUDA cores in the library (cuBLAS's float32 GEMM,
about 40 TFLOP/s on an H100 at m = 1056, against 180 for its TF32 products:
docs/en/notes/per_device_plans.md). The 3xTF32 form keeps float32's accuracy on tensor
cores: with x = hi + lo, hi = x rounded to TF32 and lo = x - hi,

    a·b ≈ lo_a·hi_b + hi_a·lo_b + hi_a·hi_b

(the dropped lo_a·lo_b is about 2^-22 of a·b). ``newton._split_bmm`` makes it of three
library products and the splits as separate passes over memory; here one Triton
program per output block splits its operand blocks in registers (``fused._dot``: hi and
lo rounded to TF32 as ``newton.round_tf32`` rounds, the two small terms summed first,
then the large one, per block of K) and adds the epilogue β·C + α·(a·b) of
``torch.baddbmm`` (a Newton step 2V - V·X in one launch).

On CUDA the kernel is compiled by Triton. Elsewhere it runs only in Triton's interpreter
(TRITON_INTERPRET=1 when Triton is imported). Every operand of its TF32 products is a
TF32 value, which tensor cores multiply exactly and the interpreter's float32 products
too: the interpreter computes the same products, up to the order of the sums.
"""
import torch
import triton
import triton.language as tl

from .fused import INTERPRETER_PROGRAMS, _check_inputs, _dot

__all__ = ['baddbmm']

BLOCK_K = 32
# (BM, BN, warps) tried in turn: the first whose output blocks give every streaming
# multiprocessor one, else the last (``_blocks``). Compiled for sm_90 (Triton's ptxas,
# no GPU needed; tests/models/attention/test_split_matmul.py) both stay in registers:
# 128×64 with 8 warps 176-178 per thread, 64×64 with 4 186-188; 128×128 with 8 warps
# and 64×128 with 4 reach 248-255.
BLOCKS = ((128, 64, 8), (64, 64, 4))


@triton.jit
def _baddbmm(a, b, c, out, M, N, K, alpha, beta,
             s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn, s_ob, s_om, s_on,
             HAS_C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Program (row block, column block, batch): out = β·c + α·(a·b) on its block.
    a (B, M, K), b (B, K, N), c and out (B, M, N), any strides."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    z = tl.program_id(2)
    kk = tl.arange(0, BK)
    in_rows, in_cols = rows < M, cols < N
    pa = a + z * s_ab + rows[:, None] * s_am + kk[None, :] * s_ak
    pb = b + z * s_bb + kk[:, None] * s_bk + cols[None, :] * s_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for start in range(0, K, BK):
        in_k = start + kk < K
        x = tl.load(pa, mask=in_rows[:, None] & in_k[None, :], other=0.)
        y = tl.load(pb, mask=in_k[:, None] & in_cols[None, :], other=0.)
        acc = _dot(x, y, acc, True)
        pa += BK * s_ak
        pb += BK * s_bk
    acc = alpha * acc
    mask = in_rows[:, None] & in_cols[None, :]
    if HAS_C:
        acc += beta * tl.load(c + z * s_cb + rows[:, None] * s_cm + cols[None, :] * s_cn,
                              mask=mask, other=0.)
    tl.store(out + z * s_ob + rows[:, None] * s_om + cols[None, :] * s_on, acc, mask=mask)


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


def baddbmm(c, a, b, beta=1., alpha=1.):
    """β·c + α·(a·b) for float32 a (B, M, K) and b (B, K, N), c (B, M, N) or None (then
    α·(a·b)): ``torch.baddbmm`` with the product as three TF32 tensor-core products of
    split operands (module docstring). CUDA tensors, or CPU tensors in Triton's
    interpreter (the same products, up to the order of the sums)."""
    _check_inputs('the split float32 products', a, b, c)
    B, M, K = a.shape
    N = b.shape[-1]
    if b.shape != (B, K, N) or (c is not None and c.shape != (B, M, N)):
        raise ValueError(f'shapes do not match: a {tuple(a.shape)}, b {tuple(b.shape)}, '
                         f'c {None if c is None else tuple(c.shape)}')
    out = a.new_empty(B, M, N)
    BM, BN, warps = _blocks(B, M, N, a.device)
    cc = out if c is None else c  # a pointer the program does not read
    _baddbmm[(-(-M // BM), -(-N // BN), B)](
        a, b, cc, out, M, N, K, float(alpha), float(beta), *a.stride(), *b.stride(),
        *cc.stride(), *out.stride(), HAS_C=c is not None, BM=BM, BN=BN, BK=BLOCK_K,
        num_warps=warps)
    return out
