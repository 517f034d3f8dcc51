"""SOFT's softmax-free attention P·Â·(Pᵀ·V) (SPEC 1.1, paper Eq. 5, TPAMI Eq. 25).

P = κ(Q, Q̃) is (..., N, m): at detection sizes the largest tensor of the network (282 MB
per head in SOFT-S stage 1 at 800×1344, float32). When gradients are needed, P is never
kept for backward: ``kernel_matmul`` computes its products in row chunks and recomputes
P in its backward, so training memory holds only the thin Q, Q̃, V and W. Without
gradients P is formed once, or, where ``KERNEL_PLAN`` says so for large P, its products
are also computed in row chunks (P computed twice, never whole).
"""
import torch

from .newton import (_device_type, _float_dtype, newton_pinv_apply, regularized_apply,
                     resolve_pinv_method)

__all__ = ['KERNEL_PLAN', 'gaussian_kernel', 'kernel_matmul', 'soft_attention']

# How P = κ(q, landmarks) is computed, per device type (others: as 'cuda'):
# (chunk, once_up_to): ``kernel_matmul`` makes P in row chunks of about ``chunk`` elements
# (whatever the batch and landmark count); without gradients P is formed once if it has
# at most ``once_up_to`` elements (None: always), else the chunked products run twice.
# Measured with tools/benchmark.py --sections kernel --sizes 512x512 640x640 800x1344
# --rounds 3 --train-batch 1 (SOFT-S's stages 1-3; README "Benchmarks"):
# - cpu: 2-core x86 CPU, torch 2.14.1. A fresh tensor of tens of MB costs page faults on
#   every forward (torch.abs of a 44 MB tensor: 19 ms into a new one, 2.2 ms with out=);
#   4 MB chunks are used while in cache and reuse the same memory. With backward 2^20
#   was the fastest chunk or within 3 % of it at every stage (800×1344 stage 1: 2.92 s,
#   2^24: 4.38 s). Inference, P once vs 2^20 chunks: up to 2^23.3 elements once wins or
#   they are within noise (512×512 stage 3: 7.1 vs 11.2 ms; 640×640 stage 2: 38.6 vs
#   41.2 ms; 512×512 stage 1: 37.7 vs 36.5 ms), from 2^24.3 chunks win (640×640 stage 1:
#   95 vs 76 ms; 800×1344 stage 2, 2^26.1: 444 vs 354 ms; stage 1, 2^27.1: 785 vs 648).
# - cuda: 64 MB chunks (few launches), P once; not yet measured against other choices.
KERNEL_PLAN = {
    'cpu': (2**20, 2**24),
    'cuda': (2**24, None),
}


def gaussian_kernel(a, b):
    """Gaussian kernel exp(-||a_i - b_j||² / 2) (paper Eq. 5 on d^(1/4)-scaled vectors).

    Args:
        a (Tensor): (..., N, d)
        b (Tensor): (..., M, d)
    Returns:
        Tensor: (..., N, M), in the dtype of a·bᵀ (the autocast dtype under autocast).
    """
    # Squared norms in (at least) float32, also when the product runs in half precision.
    a_sq = a.to(_float_dtype(a)).pow(2).sum(-1, keepdim=True)  # (..., N, 1)
    b_sq = b.to(_float_dtype(b)).pow(2).sum(-1).unsqueeze(-2)  # (..., 1, M)
    # -||a - b||²/2 = a·b - |a|²/2 - |b|²/2; clamp at 0 against rounding above 0. The
    # (N, M) product is updated in place: at detection sizes it is the largest tensor of
    # the layer, and every extra copy of it costs memory traffic.
    logits = a @ b.transpose(-1, -2)
    return logits.sub_(0.5 * a_sq).sub_(0.5 * b_sq).clamp_(max=0).exp_()


def _kernel_plan(q):
    return KERNEL_PLAN.get(q.device.type, KERNEL_PLAN['cuda'])


def _row_chunks(q, landmarks):
    """Row ranges of P = κ(q, landmarks) of about ``KERNEL_PLAN``'s chunk elements."""
    N, m = q.shape[-2], landmarks.shape[-2]
    per_row = max(1, q[..., 0, 0].numel() * m)
    step = max(1, _kernel_plan(q)[0] // per_row)
    return [(i, min(i + step, N)) for i in range(0, N, step)]


class _KernelMatmul(torch.autograd.Function):
    """P·W or Pᵀ·W for P = κ(q, l), with P recomputed in backward instead of kept.

    With G = ∇P ⊙ P (the derivative of exp(-||q_i - l_j||²/2)):
    ∇q = G·l - rowsum(G) ⊙ q and ∇l = Gᵀ·q - colsum(G) ⊙ l; ∇P = ∇out·Wᵀ (P·W) or
    W·∇outᵀ (Pᵀ·W), ∇W = Pᵀ·∇out or P·∇out. Computed over row chunks of P, so only one
    chunk of P and ∇P exists at a time.
    """

    @staticmethod
    def forward(ctx, q, l, w, transpose):
        ctx.save_for_backward(q, l, w)
        ctx.transpose = transpose
        chunks = _row_chunks(q, l)
        if transpose:  # Pᵀ·W: (..., m, n), summed over row chunks
            out = None
            for i, j in chunks:
                part = gaussian_kernel(q[..., i:j, :], l).transpose(-1, -2) @ w[..., i:j, :]
                out = part if out is None else out.add_(part)
            return out
        out = q.new_empty(q.shape[:-1] + w.shape[-1:])
        for i, j in chunks:
            torch.matmul(gaussian_kernel(q[..., i:j, :], l), w, out=out[..., i:j, :])
        return out

    @staticmethod
    def backward(ctx, grad):
        q, l, w = ctx.saved_tensors
        need_q, need_l, need_w, _ = ctx.needs_input_grad
        grad_q = torch.empty_like(q) if need_q else None
        grad_l = torch.zeros_like(l) if need_l else None
        grad_w = None
        if need_w:  # rows filled chunk by chunk (Pᵀ·W) or a sum over chunks (P·W)
            grad_w = torch.empty_like(w) if ctx.transpose else torch.zeros_like(w)
        for i, j in _row_chunks(q, l):
            qc = q[..., i:j, :]
            P = gaussian_kernel(qc, l)  # (..., rows, m)
            if ctx.transpose:  # out = Pᵀ·W
                wc = w[..., i:j, :]
                if need_w:
                    grad_w[..., i:j, :] = P @ grad
                G = (wc @ grad.transpose(-1, -2)).mul_(P)
            else:  # out = P·W
                gc = grad[..., i:j, :]
                if need_w:
                    grad_w.add_(P.transpose(-1, -2) @ gc)
                G = (gc @ w.transpose(-1, -2)).mul_(P)
            if need_q:
                grad_q[..., i:j, :] = G @ l - G.sum(-1, keepdim=True) * qc
            if need_l:
                grad_l.add_(G.transpose(-1, -2) @ qc - G.sum(-2).unsqueeze(-1) * l)
        return grad_q, grad_l, grad_w, None


def kernel_matmul(q, landmarks, w, transpose=False):
    """κ(q, landmarks)·w, or κ(q, landmarks)ᵀ·w, without keeping κ for backward.

    Args:
        q (Tensor): (..., N, d)
        landmarks (Tensor): (..., m, d)
        w (Tensor): (..., m, n), or (..., N, n) if ``transpose``
    Returns:
        Tensor: (..., N, n), or (..., m, n) if ``transpose``
    """
    return _KernelMatmul.apply(q, landmarks, w, transpose)


def soft_attention(q, landmarks, v, iters=20, normalize=True, pinv_method='auto'):
    """Softmax-free attention P·Â·(Pᵀ·V) with the symmetric Gaussian kernel (K = Q).

    Computed as P·(Â·(Pᵀ·V)): O(N·m·d + m²·d) instead of the O(N·m²) of forming P·Â.
    Â = D^-1/2·A⁺·D^-1/2 is never formed either: D^-1/2 scales the thin m×d matrices and
    A⁺ is applied to them (``newton_pinv_apply``). With gradients, P is computed in
    chunks and never kept (``kernel_matmul``); without, it is computed once, or in
    chunks twice where ``KERNEL_PLAN`` says so for its size and device.

    Args:
        q (Tensor): (..., N, d) queries (= keys), already scaled by d^(-1/4)
        landmarks (Tensor): (..., m, d) bottleneck tokens Q̃
        v (Tensor): (..., N, d) values
        iters (int): Newton–Raphson steps.
        normalize (bool): apply D^-1/2 A⁺ D^-1/2 (TPAMI Eq. 25); off reproduces the
            un-normalized SOFT of the NeurIPS paper (Table 10 ablation).
        pinv_method (str): how the T-step iterate A⁺ is computed (``PINV_METHODS``;
            'auto' chooses per device and m), or the fast mode 'regularized'.
    Returns:
        Tensor: (..., N, d) in q's dtype (the autocast dtype under autocast).
    """
    device = _device_type(q)
    method = resolve_pinv_method(pinv_method, landmarks.shape[-2], q.device.type, iters)
    # Under autocast the N-sized products run in the autocast dtype, as plain matmuls
    # would; the Function below sees concrete dtypes and runs with autocast off.
    cast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    with torch.autocast(device_type=device, enabled=False):
        qc, lc, vc = (t if cast is None or t.dtype == torch.float64 else t.to(cast)
                      for t in (q, landmarks, v))
        # P in row chunks (``kernel_matmul``) when gradients are needed (then it is never
        # kept for backward) or when it is too large to form at once on this device; a
        # traced graph keeps the plain products (the chunking is Python-side).
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, landmarks, v))
        once_up_to = _kernel_plan(q)[1]
        large = once_up_to is not None and q[..., 0].numel() * lc.shape[-2] > once_up_to
        chunked = (grad or large) and not torch.jit.is_tracing()
        if chunked:
            Z = kernel_matmul(qc, lc, vc, transpose=True)  # (..., m, d)
        else:
            P = gaussian_kernel(qc, lc)  # (..., N, m), computed once
            Z = P.transpose(-1, -2) @ vc
        # The small m×m landmark kernel and its inverse always stay in float32.
        dtype = _float_dtype(landmarks)
        lm = landmarks.to(dtype)
        A = gaussian_kernel(lm, lm)  # (..., m, m)
        Z = Z.to(dtype)
        if normalize:
            d_inv_sqrt = A.sum(-1, keepdim=True).rsqrt()  # (..., m, 1)
            Z = d_inv_sqrt * Z
        if method == 'regularized':
            W = regularized_apply(A, Z, iters)
        else:
            W = newton_pinv_apply(A, Z, iters, method, nonnegative=True)
        if normalize:
            W = d_inv_sqrt * W
        if chunked:
            return kernel_matmul(qc, lc, W.to(qc.dtype))
        return P @ W.to(P.dtype)
