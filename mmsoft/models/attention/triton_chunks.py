"""P = κ(Q, Q̃), and G = ∇P ⊙ P, written by one Triton kernel (``'triton_chunks'``).

With library operators a chunk of P takes three passes over an (N, m) tensor
(``soft._kernel``): the kernel features' product writes the logits, ``clamp_`` reads and
writes them, ``exp_`` reads and writes them again. In backward G = ∇P ⊙ P takes two more:
∇P = L·Rᵀ written by a product, then read with P and written again by ``mul_``. The
logits' product has depth d + 2 (34 in SOFT's heads), too shallow for a matrix product to
hide its memory traffic, so these passes are memory-bound, in a training step at
detection sizes several per layer over tensors of hundreds of MB (SOFT-S stage 1 at
800×1344: 67 200 × 1 050 per head and image).

Here one program computes a BN×BM block of P from the thin features in registers, as the
fused kernels do (``fused._kernel_block``: q·l̃ - |q|²/2 - |l̃|²/2, clamped at 0,
exponentiated by CUDA's expf), and writes it once; in backward the same program also
computes ∇P's block L·Rᵀ and writes G = ∇P ⊙ P, and P only where a product needs it. The
products with P and G stay the library's (cuBLAS), unlike the fused kernels, which also
make them. The logits' and ∇P's products are float32 products on the CUDA cores, or where
``split`` (the plan's ``float32_products`` 'tf32x3' or 'fp16x3', as the fused kernels)
three TF32 tensor-core products of split operands (``fused._dot``); either way float32's
accuracy.

On CUDA the kernel is compiled by Triton. Elsewhere it runs only in Triton's interpreter
(TRITON_INTERPRET=1 when Triton is imported), where the tests check it at small sizes.
"""
import triton
import triton.language as tl

from .fused import _dot, _interpreting, _kernel_block, _load, _pointers, _pow2, _prepared

__all__ = ['kernel', 'kernel_and_grad']

BLOCK_ROWS = 64  # BN: rows of P per program
BLOCK_COLS = 64  # BM: landmarks per program
BLOCK_DEPTH = 16  # KB: columns of ∇P's factors per product
# Warps per program. Compiled for sm_90 (tests/models/attention/test_fused.py; SOFT's
# head depth 32, ∇P's 64), every variant keeps its blocks in registers with 8 warps:
# 80-120 per thread (float32 or split products; P, G or both), so two programs fit on a
# streaming multiprocessor. With 4 warps, 109-226; with ∇P's 64 columns in one product
# instead of 16 at a time, G in float32 spilled even with 8 warps (∇P is made before P
# for the same reason: the other order kept the logits' operands live through its loop)
WARPS = 8


@triton.jit
def _form(fq, fl, left, right, p, g, N, M, D, K,
          s_qb, s_qn, s_lb, s_lm, s_Lb, s_Ln, s_Rb, s_Rm, s_pb, s_pn, s_gb, s_gn,
          HAS_P: tl.constexpr, HAS_G: tl.constexpr, EXACT_EXP: tl.constexpr,
          SPLIT: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, DP: tl.constexpr,
          KB: tl.constexpr):
    """Program (row block, landmark block, batch): P's block, written to p where
    ``HAS_P``, and G = (L·Rᵀ) ⊙ P's, written to g where ``HAS_G``. fq (b, N, D + 2) and
    fl (b, M, D + 2): the kernel features (``soft.kernel_features``); left (b, N, K),
    right (b, M, K); p, g (b, N, M)."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.program_id(1) * BM + tl.arange(0, BM)
    b = tl.program_id(2).to(tl.int64)  # b·N·M may pass 2^31 (a batch of large images)
    in_rows = rows < N
    in_cols = cols < M
    inside = in_rows[:, None] & in_cols[None, :]
    if HAS_G:  # ∇P = L·Rᵀ first, KB columns of L and R at a time (fewer registers live)
        grad = tl.zeros((BN, BM), dtype=tl.float32)
        for start in range(0, K, KB):
            kk = start + tl.arange(0, KB)
            lft = _load(left + b * s_Lb, rows, in_rows, s_Ln, kk, K)
            rgt = _load(right + b * s_Rb, cols, in_cols, s_Rm, kk, K)
            grad = _dot(lft, tl.trans(rgt), grad, SPLIT)
    dd = tl.arange(0, DP)
    q = _load(fq + b * s_qb, rows, in_rows, s_qn, dd, D)
    half_sq_q = 0.5 * tl.load(fq + b * s_qb + rows * s_qn + D, mask=in_rows, other=0.)
    lm = _load(fl + b * s_lb, cols, in_cols, s_lm, dd, D)
    half_sq_l = 0.5 * tl.load(fl + b * s_lb + cols * s_lm + D + 1, mask=in_cols, other=0.)
    block = _kernel_block(q, half_sq_q, lm, half_sq_l, EXACT_EXP, SPLIT)
    if HAS_P:
        tl.store(p + b * s_pb + rows[:, None] * s_pn + cols[None, :], block, mask=inside)
    if HAS_G:
        tl.store(g + b * s_gb + rows[:, None] * s_gn + cols[None, :], grad * block,
                 mask=inside)


def launch_options(split):
    """The constants of a launch: blocks, the exponential (CUDA's expf compiled; the
    interpreter's NumPy exp), the products' precision and the warps."""
    return dict(EXACT_EXP=not _interpreting(), SPLIT=split, BN=BLOCK_ROWS, BM=BLOCK_COLS,
                KB=BLOCK_DEPTH, num_warps=WARPS)


def _run(fq, fl, left, right, keep_p, split):
    """``_form`` over (b, N, m): (P or None, G or None), G where ∇P's factors are given."""
    fq, fl, left, right = _prepared(fq, fl, left, right, what="triton_chunks.py's kernel")
    b, N, D = fq.shape[0], fq.shape[1], fq.shape[2] - 2
    M = fl.shape[1]
    K = 0 if left is None else left.shape[-1]
    P = fq.new_empty(b, N, M) if keep_p else None
    G = None if left is None else fq.new_empty(b, N, M)
    if b * N * M == 0:  # nothing to write (an empty grid cannot be launched)
        return P, G
    tensors, strides = _pointers(fq, fq, fl, left, right, P, G)
    _form[(triton.cdiv(N, BLOCK_ROWS), triton.cdiv(M, BLOCK_COLS), b)](
        *tensors, N, M, D, K, *strides, HAS_P=keep_p, HAS_G=left is not None,
        DP=_pow2(D), **launch_options(split))
    return P, G


def kernel(fq, fl, split=False):
    """``soft._kernel`` in one pass: P = κ from the features, (b, N, m) for fq (b, N, K)
    and fl (b, m, K), float32; the logits' product split into TF32 ones where ``split``."""
    return _run(fq, fl, None, None, True, split)[0]


def kernel_and_grad(fq, fl, left, right, keep_p=True, split=False):
    """(P or None, G) with G = (left·rightᵀ) ⊙ P for left (b, N, k) and right (b, m, k),
    ∇P as ``soft._kernel_backward`` takes it: both in one pass, P written only where
    ``keep_p``; ``split`` as ``kernel``."""
    return _run(fq, fl, left, right, keep_p, split)
