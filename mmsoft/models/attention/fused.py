"""P's products in fused Triton kernels: κ computed block by block, never written to memory.

SOFT's N-sized work is products with P = κ(Q, Q̃) = exp(min(Q̂·Q̃̂ᵀ, 0)) (``soft.py``):
Pᵀ·V and P·W forward, and backward ∇W, ∇V and G = ∇P ⊙ P with its products with the
features. Made with library products, each is a pass over an N×m tensor in memory
(P's row chunks), several per layer in a training step. Here each is one kernel that
computes a block of P from the thin features in registers, uses it, and drops it, as
FlashAttention does with softmax attention: memory traffic is the thin matrices only.

Two kernels, both with float32's accuracy throughout, for one flat batch dimension b. The
logits' products and the products with P (and ∇P) are float32 products on the CUDA cores
(``tl.dot`` with ``input_precision='ieee'``: no TF32, the same floor as the library
products), or where ``split`` (the plan's ``float32_products`` 'tf32x3' or 'fp16x3';
the forward programs, those without G) three TF32 tensor-core products of split operands
each (``_dot``), the logits' too:

- ``_rows``: a block of BN rows of P at a time, looping over the m landmarks:
  P·X for an (m, n) X (the attention's output P·W, or ∇V = P·∇Z), and
  ∇q = G·l̃ - rowsum(G) ⊙ q with G = (L·Rᵀ) ⊙ P (L (N, k) and R (m, k): ∇P = L·Rᵀ).
- ``_cols``: a block of BM landmarks at a time, looping over a slice of the rows:
  Pᵀ·Y for an (N, n) Y (Z = Pᵀ·V, or ∇W = Pᵀ·∇out), and ∇l̃ = Gᵀ·q - colsum(G) ⊙ l̃.
  The rows are cut into slices (``_row_splits``) so that enough programs run; each
  slice writes its partial sums, added in a fixed order afterwards (deterministic: no
  atomics).

The logits are q·l̃ - |q|²/2 - |l̃|²/2 (the kernel features' product, ``kernel_features``:
q, l̃ and the squared norms are read from the features), clamped at 0 and exponentiated
by CUDA's expf (libdevice's, as PyTorch's exp; ``tl.exp`` is the faster ex2.approx of
the logits times log₂e, a rounding like that of the CPU trial with ``exp2``, which moved
the maps by up to 7e-6 of the 1e-5 floor: docs/en/notes/per_device_plans.md).
∇q and ∇l̃ follow from ∇q̂ = G·l̂ and ∇l̂ = Gᵀ·q̂ through the features (the squared norm's
column of l̂ is -1/2: ``soft._features_grad``). The results equal the row-chunked
library products up to float32 rounding (another order of sums; tests compare both with
float64).

On CUDA the kernels are compiled by Triton. Elsewhere they run only in Triton's
interpreter (NumPy, slow), which TRITON_INTERPRET=1 selects when Triton is imported: the
tests check them there at small sizes, in a process of their own.
"""
import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

try:  # CUDA's libdevice through Triton's dispatcher (Triton 3.1 on), or directly (3.0)
    from triton.language.extra import libdevice
except ImportError:
    from triton.language.extra.cuda import libdevice

__all__ = ['backward', 'product']

BLOCK_ROWS = 64  # BN: rows of P per block
BLOCK_COLS = 64  # BM: landmarks per block
# ``_cols`` programs per streaming multiprocessor the row slices aim at (CUDA); under the
# interpreter a fixed count of programs, so that tests see slices
PROGRAMS_PER_SM = 4
INTERPRETER_PROGRAMS = 8


@triton.jit
def _exp(x, EXACT: tl.constexpr):
    """exp(x): CUDA's expf (libdevice's, as PyTorch's exp) where ``EXACT``, else
    ``tl.exp`` (the interpreter's NumPy exp; compiled, ex2.approx: module docstring)."""
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
def _tf32(x):
    """float32 values rounded to TF32 (to nearest, ties to even), still float32: exact in
    a TF32 product (``newton.round_tf32``'s bit arithmetic)."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + ((bits >> 13) & 1) + 0x0FFF) & -0x2000).to(tl.float32, bitcast=True)


@triton.jit
def _dot(a, b, acc, SPLIT: tl.constexpr):
    """acc + a·b for float32 blocks: in float32 on the CUDA cores, or where ``SPLIT`` as
    three TF32 tensor-core products of split operands, x = hi + lo with hi and lo rounded
    to TF32 (``_tf32``): lo_a·hi_b + hi_a·lo_b first, then hi_a·hi_b (the dropped lo_a·lo_b
    is about 2^-22 of a·b). Every operand is a TF32 value, so the tensor cores multiply it
    exactly, and Triton's interpreter (which multiplies in float32) computes the same
    products: the interpreter checks this rounding too."""
    if SPLIT:
        a_hi = _tf32(a)
        b_hi = _tf32(b)
        a_lo = _tf32(a - a_hi)
        b_lo = _tf32(b - b_hi)
        small = tl.dot(a_hi, b_lo, tl.dot(a_lo, b_hi, input_precision='tf32'),
                       input_precision='tf32')
        return acc + tl.dot(a_hi, b_hi, small, input_precision='tf32')
    return tl.dot(a, b, acc, input_precision='ieee')


@triton.jit
def _kernel_block(a, half_sq_a, b, half_sq_b, EXACT_EXP: tl.constexpr, SPLIT: tl.constexpr):
    """κ(a, b) = exp(min(a·bᵀ - |a|²/2 - |b|²/2, 0)) between the rows of two blocks (the
    kernel features' product; module docstring), a·bᵀ split where ``SPLIT`` (``_dot``)."""
    ab = _dot(a, tl.trans(b), tl.zeros((a.shape[0], b.shape[0]), dtype=tl.float32), SPLIT)
    logits = ab - half_sq_a[:, None] - half_sq_b[None, :]
    return _exp(tl.minimum(logits, 0.), EXACT_EXP)


@triton.jit
def _rows(fq, fl, x, left, right, out, grad_q, N, M, D, NX, K,
          s_qb, s_qn, s_lb, s_lm, s_xb, s_xm, s_Lb, s_Ln, s_Rb, s_Rm, s_ob, s_on, s_gb, s_gn,
          HAS_X: tl.constexpr, HAS_G: tl.constexpr, EXACT_EXP: tl.constexpr,
          SPLIT: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, DP: tl.constexpr,
          XP: tl.constexpr, KP: tl.constexpr):
    """Program (row block, batch): out = P·X and grad_q = G·l̃ - rowsum(G) ⊙ q on its rows
    (module docstring). fq (b, N, D + 2), fl (b, M, D + 2): the features; x (b, M, NX);
    left (b, N, K), right (b, M, K); out (b, N, NX), grad_q (b, N, D)."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    b = tl.program_id(1)
    in_rows = rows < N
    dd = tl.arange(0, DP)
    q = _load(fq + b * s_qb, rows, in_rows, s_qn, dd, D)
    half_sq_q = 0.5 * tl.load(fq + b * s_qb + rows * s_qn + D, mask=in_rows, other=0.)
    if HAS_X:
        xx = tl.arange(0, XP)
        acc = tl.zeros((BN, XP), dtype=tl.float32)
    if HAS_G:
        kk = tl.arange(0, KP)
        lft = _load(left + b * s_Lb, rows, in_rows, s_Ln, kk, K)
        acc_g = tl.zeros((BN, DP), dtype=tl.float32)
        g_sum = tl.zeros((BN, ), dtype=tl.float32)
    for start in range(0, M, BM):
        cols = start + tl.arange(0, BM)
        in_cols = cols < M
        lm = _load(fl + b * s_lb, cols, in_cols, s_lm, dd, D)
        half_sq_l = 0.5 * tl.load(fl + b * s_lb + cols * s_lm + D + 1, mask=in_cols,
                                  other=0.)
        # P of the padding columns is not 0, but their X and R are: they add nothing
        p = _kernel_block(q, half_sq_q, lm, half_sq_l, EXACT_EXP, SPLIT)
        if HAS_X:
            xb = _load(x + b * s_xb, cols, in_cols, s_xm, xx, NX)
            acc = _dot(p, xb, acc, SPLIT)
        if HAS_G:
            rgt = _load(right + b * s_Rb, cols, in_cols, s_Rm, kk, K)
            g = _dot(lft, tl.trans(rgt), tl.zeros((BN, BM), dtype=tl.float32), SPLIT) * p
            acc_g = _dot(g, lm, acc_g, SPLIT)
            g_sum += tl.sum(g, 1)
    if HAS_X:
        tl.store(out + b * s_ob + rows[:, None] * s_on + xx[None, :], acc,
                 mask=in_rows[:, None] & (xx[None, :] < NX))
    if HAS_G:
        tl.store(grad_q + b * s_gb + rows[:, None] * s_gn + dd[None, :],
                 acc_g - g_sum[:, None] * q, mask=in_rows[:, None] & (dd[None, :] < D))


@triton.jit
def _cols(fq, fl, y, left, right, out, grad_l, N, M, D, NY, K, slice_rows,
          s_qb, s_qn, s_lb, s_lm, s_yb, s_yn, s_Lb, s_Ln, s_Rb, s_Rm, s_os, s_ob, s_om,
          s_gs, s_gb, s_gm,
          HAS_Y: tl.constexpr, HAS_G: tl.constexpr, EXACT_EXP: tl.constexpr,
          SPLIT: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, DP: tl.constexpr,
          YP: tl.constexpr, KP: tl.constexpr):
    """Program (landmark block, batch, row slice): partial sums over the slice's rows of
    out = Pᵀ·Y and grad_l = Gᵀ·q - colsum(G) ⊙ l̃ (module docstring). y (b, N, NY);
    out (slices, b, M, NY), grad_l (slices, b, M, D); the rest as ``_rows``."""
    cols = tl.program_id(0) * BM + tl.arange(0, BM)
    b = tl.program_id(1)
    part = tl.program_id(2)
    in_cols = cols < M
    dd = tl.arange(0, DP)
    lm = _load(fl + b * s_lb, cols, in_cols, s_lm, dd, D)
    half_sq_l = 0.5 * tl.load(fl + b * s_lb + cols * s_lm + D + 1, mask=in_cols, other=0.)
    if HAS_Y:
        yy = tl.arange(0, YP)
        acc = tl.zeros((BM, YP), dtype=tl.float32)
    if HAS_G:
        kk = tl.arange(0, KP)
        rgt = _load(right + b * s_Rb, cols, in_cols, s_Rm, kk, K)
        acc_g = tl.zeros((BM, DP), dtype=tl.float32)
        g_sum = tl.zeros((BM, ), dtype=tl.float32)
    lo = part * slice_rows
    hi = tl.minimum(lo + slice_rows, N)
    for start in range(lo, hi, BN):
        rows = start + tl.arange(0, BN)
        in_rows = rows < hi
        q = _load(fq + b * s_qb, rows, in_rows, s_qn, dd, D)
        half_sq_q = 0.5 * tl.load(fq + b * s_qb + rows * s_qn + D, mask=in_rows, other=0.)
        # Pᵀ (BM, BN); its padding rows add nothing (their Y and L are 0)
        pt = _kernel_block(lm, half_sq_l, q, half_sq_q, EXACT_EXP, SPLIT)
        if HAS_Y:
            yb = _load(y + b * s_yb, rows, in_rows, s_yn, yy, NY)
            acc = _dot(pt, yb, acc, SPLIT)
        if HAS_G:
            lft = _load(left + b * s_Lb, rows, in_rows, s_Ln, kk, K)
            gt = _dot(rgt, tl.trans(lft), tl.zeros((BM, BN), dtype=tl.float32), SPLIT) * pt
            acc_g = _dot(gt, q, acc_g, SPLIT)
            g_sum += tl.sum(gt, 1)
    if HAS_Y:
        tl.store(out + part * s_os + b * s_ob + cols[:, None] * s_om + yy[None, :], acc,
                 mask=in_cols[:, None] & (yy[None, :] < NY))
    if HAS_G:
        tl.store(grad_l + part * s_gs + b * s_gb + cols[:, None] * s_gm + dd[None, :],
                 acc_g - g_sum[:, None] * lm, mask=in_cols[:, None] & (dd[None, :] < D))


def _interpreting():
    """Whether Triton's kernels run in its interpreter: TRITON_INTERPRET=1 when Triton
    was imported (it decides when a kernel is decorated)."""
    return isinstance(_rows, InterpretedFunction)


def _pow2(n, least=16):
    """The power of two ≥ n and ≥ ``least`` (a block's extent; ``tl.dot`` takes ≥ 16)."""
    return max(least, 1 << max(0, (n - 1).bit_length()))


def warps(backward):
    """Warps per program: 8 forward, 16 for the backward programs, which hold more
    (BN, BM) blocks (R or L, ∇P, G besides P). Compiled for sm_90 (Triton's ptxas, no GPU
    needed; tests/models/attention/test_fused.py) every program stays in registers:
    forward 109-112 per thread with 8 warps (with 4: 168-255), with split products
    (``_dot``, the logits' too) 215-216; backward 96-116 with 16 (with 8: 255 and
    spills, with 4: 32 and 7.5 kB spilled per thread). With split products the backward programs spilled at
    every count tried (4, 8, 16 warps; 64×64 blocks and 32×32; with ∇P's product in
    float32 too), so they keep float32 products (``_launch_options``)."""
    return 16 if backward else 8


def _row_splits(N, programs, device):
    """How many row slices ``_cols`` cuts the N rows into, for ``programs`` (landmark
    blocks × batch) programs: enough slices for about ``PROGRAMS_PER_SM`` programs per
    streaming multiprocessor, at most one per row block."""
    if device.type == 'cuda':
        target = PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = INTERPRETER_PROGRAMS
    return max(1, min(-(-N // BLOCK_ROWS), -(-target // programs)))


def _check_inputs(what, *tensors):
    """That a Triton kernel of this package (``what`` names it in the errors) can take
    the tensors: on CUDA, or on the CPU in Triton's interpreter; float32 (None skipped)."""
    if not tensors[0].is_cuda and not _interpreting():
        raise ValueError(f'{what} run on CUDA tensors, elsewhere only in Triton\'s '
                         'interpreter (TRITON_INTERPRET=1 when Triton is imported); got a '
                         f'tensor on {tensors[0].device}')
    for t in tensors:
        if t is not None and t.dtype != torch.float32:
            raise ValueError(f'{what} take float32 tensors, got {t.dtype}')


def _prepared(*tensors, what='the fused kernel products'):
    """The tensors as the kernels read them: float32 (checked, ``_check_inputs``; ``what``
    names the kernels in its errors), with unit stride in the last dimension (a gradient
    autograd expanded from a sum may have none: copied then); None stays None."""
    _check_inputs(what, *tensors)
    return [t if t is None or t.stride(-1) == 1 else t.contiguous() for t in tensors]


def _pointers(stand_in, *tensors):
    """The kernel's tensor arguments and their (batch, row) strides (their columns' is 1):
    ``stand_in`` for each missing one, a pointer its program does not read."""
    tensors = [stand_in if t is None else t for t in tensors]
    return tensors, [s for t in tensors for s in (t.stride(0), t.stride(1))]


def _launch_options(K, backward, split):
    """The block sizes, ∇P's depth K padded, the exponential, the products' precision
    (split in the programs without G only: ``warps``) and the warps of a launch."""
    return dict(EXACT_EXP=not _interpreting(), SPLIT=split and not backward, BN=BLOCK_ROWS,
                BM=BLOCK_COLS, KP=_pow2(K), num_warps=warps(backward))


def _run_rows(fq, fl, x=None, left=None, right=None, split=False):
    """``_rows``: (P·X or None, ∇q or None) for X (b, m, n) and ∇P = left·rightᵀ; the
    products with P (and ∇P's) split into TF32 ones where ``split`` (``_dot``)."""
    fq, fl, x, left, right = _prepared(fq, fl, x, left, right)
    b, N, D = fq.shape[0], fq.shape[1], fq.shape[2] - 2
    n = 0 if x is None else x.shape[-1]
    K = 0 if left is None else left.shape[-1]
    out = None if x is None else fq.new_empty(b, N, n)
    grad_q = None if left is None else fq.new_empty(b, N, D)
    tensors, strides = _pointers(fq, fq, fl, x, left, right, out, grad_q)
    _rows[(math.ceil(N / BLOCK_ROWS), b)](
        *tensors, N, fl.shape[1], D, n, K, *strides, HAS_X=x is not None,
        HAS_G=left is not None, DP=_pow2(D), XP=_pow2(n),
        **_launch_options(K, left is not None, split))
    return out, grad_q


def _run_cols(fq, fl, y=None, left=None, right=None, split=False):
    """``_cols``: (Pᵀ·Y or None, ∇l or None) for Y (b, N, n) and ∇P = left·rightᵀ, the
    row slices' partial sums added in slice order; ``split`` as ``_run_rows``."""
    fq, fl, y, left, right = _prepared(fq, fl, y, left, right)
    b, N, D = fq.shape[0], fq.shape[1], fq.shape[2] - 2
    M = fl.shape[1]
    n = 0 if y is None else y.shape[-1]
    K = 0 if left is None else left.shape[-1]
    blocks = math.ceil(M / BLOCK_COLS)
    splits = _row_splits(N, blocks * b, fq.device)
    slice_rows = math.ceil(math.ceil(N / splits) / BLOCK_ROWS) * BLOCK_ROWS
    splits = math.ceil(N / slice_rows)  # no empty slice
    out = None if y is None else fq.new_empty(splits, b, M, n)
    grad_l = None if left is None else fq.new_empty(splits, b, M, D)
    tensors, strides = _pointers(fq, fq, fl, y, left, right)
    o, g = (fq[None] if t is None else t for t in (out, grad_l))  # (slices, b, rows, ·)
    _cols[(blocks, b, splits)](
        *tensors, o, g, N, M, D, n, K, slice_rows, *strides, *o.stride()[:3],
        *g.stride()[:3], HAS_Y=y is not None, HAS_G=left is not None, DP=_pow2(D),
        YP=_pow2(n), **_launch_options(K, left is not None, split))
    return tuple(None if t is None else t.sum(0) for t in (out, grad_l))


def product(fq, fl, w3, transpose=False, split=False):
    """``soft._kernel_product`` in the fused kernels: P·W, (b, N, n), or Pᵀ·W, (b, m, n),
    for P = κ from the features, float32; the products with P split into TF32 ones where
    ``split`` (``_dot``; the logits' products too)."""
    return (_run_cols(fq, fl, y=w3, split=split) if transpose else
            _run_rows(fq, fl, x=w3, split=split))[0]


def backward(fq, fl, grad, transpose, left, right, needs, split=False):
    """``soft._kernel_backward`` in the fused kernels (the same arguments less the row
    chunk count, and ``split`` as ``product``): ∇W, ∇q and ∇l, None where not needed. The
    rows kernel gives ∇q (and ∇W = P·∇out for Pᵀ·W), the columns kernel ∇l (and
    ∇W = Pᵀ·∇out for P·W)."""
    need_w, need_q, need_l = needs
    grad_w = grad_q = grad_l = None
    lr = dict(left=left, right=right, split=split)
    if need_q or (need_w and transpose):
        grad_w_rows, grad_q = _run_rows(
            fq, fl, x=grad if need_w and transpose else None,
            **(lr if need_q else dict(split=split)))
        if transpose:
            grad_w = grad_w_rows
    if need_l or (need_w and not transpose):
        grad_w_cols, grad_l = _run_cols(
            fq, fl, y=grad if need_w and not transpose else None,
            **(lr if need_l else dict(split=split)))
        if not transpose:
            grad_w = grad_w_cols
    return grad_w, grad_q, grad_l
