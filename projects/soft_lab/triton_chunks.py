"""P = κ(Q, Q̃), and G = ∇P ⊙ P, written by one Triton kernel per chunk (candidate
``'triton_chunks'`` of the plan's ``kernel_products``).

With library operators a chunk of P takes three passes over an (N, m) tensor
(``mmsoft.models.attention.soft._kernel``): the kernel features' product writes the
logits, ``clamp_`` reads and writes them, ``exp_`` reads and writes them again. In
backward G = ∇P ⊙ P takes two more: ∇P = L·Rᵀ written by a product, then read with P
and written again by ``mul_``. The logits' product has depth d + 2 (34 in SOFT's heads),
too shallow for a matrix product to hide its memory traffic, so these passes are
memory-bound, in a training step at detection sizes several per layer over tensors of
hundreds of MB (SOFT-S stage 1 at 800×1344: 67 200 × 1 050 per head and image).

Here one program computes a BN×BM block of P from the thin features in registers
(q·l̃ - |q|²/2 - |l̃|²/2, clamped at 0, exponentiated by CUDA's expf), and writes it once;
in backward the same program also computes ∇P's block L·Rᵀ and writes G = ∇P ⊙ P, and P
only where a product needs it. The products with P and G stay the library's (cuBLAS).
The logits' and ∇P's products are float32 products on the CUDA cores: float32's
accuracy.

On CUDA the kernel is compiled by Triton. Elsewhere it runs only in Triton's interpreter
(TRITON_INTERPRET=1 when Triton is imported), where the tests check it at small sizes.
"""
import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

try:  # CUDA's libdevice through Triton's dispatcher (Triton 3.1 on), or directly (3.0)
    from triton.language.extra import libdevice
except ImportError:
    from triton.language.extra.cuda import libdevice

__all__ = ['kernel', 'kernel_and_grad']

BLOCK_ROWS = 64  # BN: rows of P per program
BLOCK_COLS = 64  # BM: landmarks per program
BLOCK_DEPTH = 16  # KB: columns of ∇P's factors per product
# Warps per program. Compiled for sm_90 (SOFT's head depth 32, ∇P's 64), every variant
# keeps its blocks in registers with 8 warps: 80-120 per thread (P, G or both), so two
# programs fit on a streaming multiprocessor. With 4 warps, 109-226; with ∇P's 64
# columns in one product instead of 16 at a time, G spilled even with 8 warps (∇P is
# made before P for the same reason: the other order kept the logits' operands live
# through its loop)
WARPS = 8


@triton.jit
def _exp(x, EXACT: tl.constexpr):
    """exp(x): CUDA's expf (libdevice's, as PyTorch's exp) where ``EXACT``, else
    ``tl.exp`` (the interpreter's NumPy exp)."""
    if EXACT:
        return libdevice.exp(x)
    return tl.exp(x)


@triton.jit
def _load(base, idx, in_idx, stride, cols, ncols):
    """The block of rows ``idx`` (row stride ``stride``) and columns ``cols`` of a
    row-major matrix at ``base``: 0 outside ``in_idx`` and past ``ncols`` columns."""
    return tl.load(base + idx[:, None] * stride + cols[None, :],
                   mask=in_idx[:, None] & (cols[None, :] < ncols), other=0.)


@triton.jit
def _form(fq, fl, left, right, p, g, N, M, D, K,
          s_qb, s_qn, s_lb, s_lm, s_Lb, s_Ln, s_Rb, s_Rm, s_pb, s_pn, s_gb, s_gn,
          HAS_P: tl.constexpr, HAS_G: tl.constexpr, EXACT_EXP: tl.constexpr,
          BN: tl.constexpr, BM: tl.constexpr, DP: tl.constexpr, KB: tl.constexpr):
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
            grad = tl.dot(lft, tl.trans(rgt), grad, input_precision='ieee')
    dd = tl.arange(0, DP)
    q = _load(fq + b * s_qb, rows, in_rows, s_qn, dd, D)
    half_sq_q = 0.5 * tl.load(fq + b * s_qb + rows * s_qn + D, mask=in_rows, other=0.)
    lm = _load(fl + b * s_lb, cols, in_cols, s_lm, dd, D)
    half_sq_l = 0.5 * tl.load(fl + b * s_lb + cols * s_lm + D + 1, mask=in_cols, other=0.)
    logits = tl.dot(q, tl.trans(lm), tl.zeros((BN, BM), dtype=tl.float32),
                    input_precision='ieee') - half_sq_q[:, None] - half_sq_l[None, :]
    block = _exp(tl.minimum(logits, 0.), EXACT_EXP)
    if HAS_P:
        tl.store(p + b * s_pb + rows[:, None] * s_pn + cols[None, :], block, mask=inside)
    if HAS_G:
        tl.store(g + b * s_gb + rows[:, None] * s_gn + cols[None, :], grad * block,
                 mask=inside)


def interpreting():
    """Whether Triton's kernels run in its interpreter: TRITON_INTERPRET=1 when Triton
    was imported (it decides when a kernel is decorated)."""
    return isinstance(_form, InterpretedFunction)


def _pow2(n, least=16):
    """The power of two ≥ n and ≥ ``least`` (a block's extent; ``tl.dot`` takes ≥ 16)."""
    return max(least, 1 << max(0, (n - 1).bit_length()))


def _prepared(*tensors):
    """The tensors as the kernel reads them: on CUDA (or in the interpreter), float32,
    with unit stride in the last dimension (copied where not); None stays None."""
    if not tensors[0].is_cuda and not interpreting():
        raise ValueError("the triton_chunks kernel runs on CUDA tensors, elsewhere only in "
                         "Triton's interpreter (TRITON_INTERPRET=1 when Triton is "
                         f'imported); got a tensor on {tensors[0].device}')
    for t in tensors:
        if t is not None and t.dtype != torch.float32:
            raise ValueError(f'the triton_chunks kernel takes float32 tensors, got {t.dtype}')
    return [t if t is None or t.stride(-1) == 1 else t.contiguous() for t in tensors]


def _run(fq, fl, left, right, keep_p):
    """``_form`` over (b, N, m): (P or None, G or None), G where ∇P's factors are given."""
    fq, fl, left, right = _prepared(fq, fl, left, right)
    b, N, D = fq.shape[0], fq.shape[1], fq.shape[2] - 2
    M = fl.shape[1]
    K = 0 if left is None else left.shape[-1]
    P = fq.new_empty(b, N, M) if keep_p else None
    G = None if left is None else fq.new_empty(b, N, M)
    if b * N * M == 0:  # nothing to write (an empty grid cannot be launched)
        return P, G
    tensors = [fq if t is None else t for t in (fq, fl, left, right, P, G)]
    strides = [s for t in tensors for s in (t.stride(0), t.stride(1))]
    _form[(triton.cdiv(N, BLOCK_ROWS), triton.cdiv(M, BLOCK_COLS), b)](
        *tensors, N, M, D, K, *strides, HAS_P=keep_p, HAS_G=left is not None,
        EXACT_EXP=not interpreting(), BN=BLOCK_ROWS, BM=BLOCK_COLS, DP=_pow2(D),
        KB=BLOCK_DEPTH, num_warps=WARPS)
    return P, G


def kernel(fq, fl):
    """``soft._kernel`` in one pass: P = κ from the features, (b, N, m) for fq (b, N, K)
    and fl (b, m, K), float32."""
    return _run(fq, fl, None, None, True)[0]


def kernel_and_grad(fq, fl, left, right, keep_p=True):
    """(P or None, G) with G = (left·rightᵀ) ⊙ P for left (b, N, k) and right (b, m, k),
    ∇P as ``soft._kernel_backward`` takes it: both in one pass, P written only where
    ``keep_p``."""
    return _run(fq, fl, left, right, keep_p)
