"""SOFT's softmax-free attention P·Â·(Pᵀ·V) (SOFT, IJCV 2024: Eq. 5, Alg. 2, Eq. 25).

P = κ(Q, Q̃) is (..., N, m): at detection sizes the largest tensor of the network (N×m =
67200×1050 float32 values per head in SOFT-S stage 1 at 800×1344). When gradients are
needed, P is never kept for backward: its products are computed in row chunks and P is
recomputed in backward, so training memory holds only the thin Q, Q̃, V and W. Both products and the
m-sized middle run through ``kernel_attention`` there, whose backward forms one
G = ∇P ⊙ P for both products; under ``torch.compile`` each product is its own
(``kernel_matmul``). Without gradients P is formed once, or, where the device's plan
says so for large P (``plan.py``), its products are also computed in row chunks (P
computed twice, never whole).

Every P (or chunk of it) is one product of the thin kernel features
(``kernel_features``, made once per attention; where inference forms P whole, the
landmarks' features serve both P and the m×m kernel A), clamped and exponentiated in
place: three passes over an N×m tensor and no copies, in training too, where the
products with the features also give the norms' gradients (``_KernelMatmul``). The
inverse's variant for the m-sized middle is the dispatch's (``plan.select_variant``:
the layer's ``pinv_method``, the plan's ``pinv``). ``official_order_attention`` is the
reference order of the official code.
"""
import math
from functools import partial

import torch

from .dtypes import autocast_dtype, compute_dtype, device_type, is_compiling
from .newton import newton_pinv, normalize_inverse
from .plan import Inputs, plan_for, select_variant

__all__ = [
    'gaussian_kernel', 'kernel_attention', 'kernel_features', 'kernel_matmul',
    'official_order_attention', 'soft_attention'
]

def kernel_features(x, right=False):
    """Features whose products are the Gaussian kernel's logits: one matmul makes them.

    -||a - b||²/2 = a·b - |a|²/2 - |b|²/2 = [a, |a|², -1/2]·[b, -1/2, |b|²], so
    κ(a, b) = exp(min(â·b̂ᵀ, 0)) with â = ``kernel_features(a)`` and b̂ =
    ``kernel_features(b, right=True)`` (the min clamps rounding above 0). The squared
    norms are computed in (at least) float32, also when x is half precision.

    Args:
        x (Tensor): (..., n, d)
        right (bool): the right-hand factor's features [x, -1/2, |x|²].
    Returns:
        Tensor: (..., n, d + 2) in x's dtype.
    """
    sq = x.to(compute_dtype(x)).pow(2).sum(-1, keepdim=True).to(x.dtype)
    half = torch.full_like(sq, -0.5)
    return torch.cat([x, half, sq] if right else [x, sq, half], -1)


def _kernel(fa, fb):
    """κ from features, (..., N, d + 2) and (..., M, d + 2) -> (..., N, M). Updated in
    place: at detection sizes P is the largest tensor of the layer."""
    return (fa @ fb.transpose(-1, -2)).clamp_(max=0).exp_()


def gaussian_kernel(a, b):
    """Gaussian kernel exp(-||a_i - b_j||² / 2) (paper Eq. 5 on d^(1/4)-scaled vectors).

    Args:
        a (Tensor): (..., N, d)
        b (Tensor): (..., M, d)
    Returns:
        Tensor: (..., N, M), in the dtype of a·bᵀ (the autocast dtype under autocast).
    """
    return _kernel(kernel_features(a), kernel_features(b, right=True))


def _kernel_and_grad(fq, fl, left, right):
    """P = κ from the features (``_kernel``) and G = (left·rightᵀ) ⊙ P, the exp's
    derivative times ∇P = left·rightᵀ: (b, rows, m) each."""
    P = _kernel(fq, fl)
    return P, torch.bmm(left, right.transpose(-1, -2)).mul_(P)


def _chunk_count(q, landmarks, plan=None):
    """How many row chunks P = κ(q, landmarks), (..., N, m), is computed in: chunks of at
    most the plan's ``kernel_chunk`` elements, under ``torch.compile`` its
    ``compiled_kernel_chunks`` whatever the size. ``plan`` None: the plan in force for
    q's device type.

    Under torch.compile a count from the size would be part of the graph: Dynamo would
    compile a graph for every count a detector's image sizes give, each slowly (the
    count's arithmetic on symbolic sizes), and fall back to eager once its recompile
    limit is reached. With a fixed count one graph holds for every size
    (tests/models/backbones/test_soft.py).
    """
    plan = plan_for(q.device.type) if plan is None else plan
    if is_compiling():
        return plan.compiled_kernel_chunks
    N, bm = q.shape[-2], math.prod(q.shape[:-2]) * landmarks.shape[-2]
    step = max(1, plan.kernel_chunk // max(1, bm))  # rows per chunk
    return -(-N // step)


def _row_parts(count, *tensors):
    """The tensors' rows (dim 1, of one length N) in ``count`` parts, the same partition
    for each: ``torch.tensor_split``'s, sizes within one row of each other."""
    return zip(*(t.tensor_split(count, 1) for t in tensors))


def _add_product(acc, a, b):
    """acc + a·b in place (a·b for the first chunk: acc is None)."""
    return torch.bmm(a, b) if acc is None else acc.baddbmm_(a, b)


def _cat_rows(parts):
    """Row chunks (b, rows, c) -> (b, N, c), one copy (none for a single chunk)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def _flat(t):
    """(..., n, c) -> (b, n, c), one batch dimension (a view where the layout allows)."""
    return t.reshape(-1, *t.shape[-2:])


def _view_or_none(t, like):
    """t viewed in ``like``'s shape (a gradient from its flat form); None stays None."""
    return None if t is None else t.view(like.shape)


def _features_grad(grad_f, f, right=False):
    """∇x from ∇f for f = ``kernel_features(x, right)``: x is f's first d columns and
    ∂|x|²/∂x = 2x, so ∇x = ∇f[:d] + 2·∇f[|x|² column] ⊙ x."""
    d = f.shape[-1] - 2
    col = d + 1 if right else d
    return torch.addcmul(grad_f[..., :d], grad_f[..., col:col + 1], f[..., :d], value=2)


def _features_of(q, landmarks):
    """q̂ and l̂ as ``_KernelMatmul`` takes them (flat batch, no autograd graph)."""
    with torch.no_grad():
        return kernel_features(_flat(q)), kernel_features(_flat(landmarks), right=True)


def _kernel_product(fq, fl, w3, chunks, transpose=False):
    """P·W, or Pᵀ·W, for P = κ from the features, one row chunk of P at a time.

    Args:
        fq (Tensor): (b, N, K) q̂ (``kernel_features``)
        fl (Tensor): (b, m, K) l̂ (``kernel_features(·, right=True)``)
        w3 (Tensor): (b, m, n), or (b, N, n) if ``transpose``
        chunks (int): P's row chunks (``_chunk_count``).
    Returns:
        Tensor: (b, N, n), the chunks' rows concatenated; or (b, m, n) if ``transpose``,
        summed over the chunks.
    """
    if not transpose:
        return _cat_rows([_kernel(q, fl) @ w3 for q, in _row_parts(chunks, fq)])
    out = None
    for q, w in _row_parts(chunks, fq, w3):
        out = _add_product(out, _kernel(q, fl).transpose(-1, -2), w)
    return out


def _kernel_backward(fq, fl, chunks, grad, transpose, left, right, needs):
    """One backward pass over P's row chunks, P = κ from the features recomputed per chunk.

    For out = P·W (Pᵀ·W if ``transpose``) with ∇out = ``grad``: ∇W = Pᵀ·∇out (P·∇out).
    With G = (left·rightᵀ) ⊙ P (the exp's derivative; left·rightᵀ is ∇P: ∇out·Wᵀ or
    W·∇outᵀ for one product, [∇out, V]·[W, ∇Z]ᵀ for both of ``kernel_attention``):
    ∇q̂ = G·l̂ and ∇l̂ = Gᵀ·q̂, which give ∇q and ∇l (``_features_grad``). Only one chunk
    of P and of G exists at a time.

    Args:
        fq, fl (Tensor): (b, N, K) and (b, m, K) features.
        chunks (int): P's row chunks.
        grad (Tensor): (b, N, n) ∇out, or (b, m, n) if ``transpose``.
        left, right (Tensor): (b, N, k) and (b, m, k).
        needs (tuple[bool]): whether ∇W, ∇q and ∇l are needed.
    Returns:
        tuple: ∇W ((b, m, n), or (b, N, n) if ``transpose``), ∇q (b, N, K - 2) and ∇l
        (b, m, K - 2); None where not needed.
    """
    need_w, need_q, need_l = needs
    grad_fq, grad_w_rows = [], []  # row chunks of ∇q̂ (and of ∇W for Pᵀ·W)
    grad_fl = grad_w = None  # sums over chunks (∇W: for P·W)
    rows = (fq, left) if transpose else (fq, left, grad)  # split along P's rows
    for q, left_rows, *grad_rows in _row_parts(chunks, *rows):
        if need_q or need_l:
            P, G = _kernel_and_grad(q, fl, left_rows, right)
        else:
            P = _kernel(q, fl)  # (b, rows, m)
        if need_w and transpose:
            grad_w_rows.append(P @ grad)
        elif need_w:
            grad_w = _add_product(grad_w, P.transpose(-1, -2), grad_rows[0])
        if need_q:
            grad_fq.append(G @ fl)
        if need_l:
            grad_fl = _add_product(grad_fl, G.transpose(-1, -2), q)
    if grad_w_rows:
        grad_w = _cat_rows(grad_w_rows)
    grad_q = _features_grad(_cat_rows(grad_fq), fq) if need_q else None
    grad_l = _features_grad(grad_fl, fl, right=True) if need_l else None
    return grad_w, grad_q, grad_l


class _KernelMatmul(torch.autograd.Function):
    """P·W or Pᵀ·W for P = κ(q, l) = exp(min(q̂·l̂ᵀ, 0)), with P recomputed in backward
    instead of kept.

    Saved for backward: q, l, w as given (tensors the layer keeps anyway). The kernel
    features q̂, l̂ ((b, ·, d + 2), ``kernel_features``, made once by the caller for all
    its products) are recomputed in backward instead, for one pass over P's row chunks
    (``_kernel_backward``) with ∇P = ∇out·Wᵀ (P·W) or W·∇outᵀ (Pᵀ·W).
    """

    @staticmethod
    def forward(ctx, q, l, w, transpose, chunks, fq, fl):
        ctx.save_for_backward(q, l, w)
        ctx.transpose, ctx.chunks = transpose, chunks
        out = _kernel_product(fq, fl, _flat(w), chunks, transpose)
        return out.view(*q.shape[:-2], *out.shape[-2:])

    @staticmethod
    def backward(ctx, grad):
        q, l, w = ctx.saved_tensors
        need_q, need_l, need_w = ctx.needs_input_grad[:3]
        fq, fl = _features_of(q, l)
        w3, grad = _flat(w), _flat(grad)
        left, right = (w3, grad) if ctx.transpose else (grad, w3)  # ∇P = left·rightᵀ
        grad_w, grad_q, grad_l = _kernel_backward(fq, fl, ctx.chunks, grad, ctx.transpose,
                                                  left, right, (need_w, need_q, need_l))
        return (_view_or_none(grad_q, q), _view_or_none(grad_l, l), _view_or_none(grad_w, w),
                None, None, None, None)


class _KernelIn(torch.autograd.Function):
    """Z = Pᵀ·V for P = κ(q, l), the first product of ``kernel_attention``, whose second
    product P·W (``_KernelOut``) hands its ∇out and W over in ``link``: this backward
    then forms one G = ∇P ⊙ P for both products.

    ∇P of both is ∇out·Wᵀ + V·∇Zᵀ, so G = ([∇out, V]·[W, ∇Z]ᵀ) ⊙ P, one product of twice
    the depth, and ∇q̂ = G·l̂, ∇l̂ = Gᵀ·q̂ for both; with ∇V = P·∇Z this is the second
    pass over P of a training step's backward (``_KernelOut``'s is the first). Per row
    chunk of P, backward evaluates P twice, as two ``_KernelMatmul`` do, and runs 5
    products with it and one ⊙ P instead of their 8 and 2.

    Autograd runs this backward after ``_KernelOut``'s: ∇Z comes from ∇W through the
    m-sized middle between them. Saved for backward: q, l, v (as ``_KernelMatmul``).
    """

    @staticmethod
    def forward(ctx, q, l, v, link, chunks, fq, fl):
        ctx.save_for_backward(q, l, v)
        ctx.link, ctx.chunks = link, chunks
        Z = _kernel_product(fq, fl, _flat(v), chunks, transpose=True)  # (b, m, d)
        return Z.view(*v.shape[:-2], *Z.shape[-2:])

    @staticmethod
    def backward(ctx, grad_z):
        q, l, v = ctx.saved_tensors
        need_q, need_l, need_v = ctx.needs_input_grad[:3]
        # ∇out, and the features _KernelOut's backward made; None: out had no gradient
        grad_out, features = ctx.link.pop('grad_out', None), ctx.link.pop('features', None)
        fq, fl = features or _features_of(q, l)
        v3, grad_z = _flat(v), _flat(grad_z)
        left, right = v3, grad_z  # ∇P of Pᵀ·V alone
        if grad_out is not None and (need_q or need_l):
            # ∇P of both products: [∇out, V]: (b, N, 2d) times [W, ∇Z]ᵀ: (b, 2d, m)
            left = torch.cat([_flat(grad_out), v3], -1)
            right = torch.cat([_flat(ctx.link['W']), grad_z], -1)
        grad_v, grad_q, grad_l = _kernel_backward(fq, fl, ctx.chunks, grad_z, True, left,
                                                  right, (need_v, need_q, need_l))
        return (_view_or_none(grad_q, q), _view_or_none(grad_l, l), _view_or_none(grad_v, v),
                None, None, None, None)


class _KernelOut(torch.autograd.Function):
    """out = P·W, the second product of ``kernel_attention``: its backward computes only
    ∇W = Pᵀ·∇out (the first pass over P) and leaves ∇q, ∇l to ``_KernelIn``'s backward,
    handing it ∇out and W in ``link``.

    ``link`` keeps W detached (no reference from it back into the graph), and ∇out and
    the kernel features only until ``_KernelIn``'s backward takes them. Saved for
    backward: q, l.
    """

    @staticmethod
    def forward(ctx, q, l, w, link, chunks, fq, fl):
        ctx.save_for_backward(q, l)
        ctx.link, ctx.chunks, ctx.w_shape = link, chunks, w.shape
        link['W'] = w.detach()
        out = _kernel_product(fq, fl, _flat(w), chunks)
        return out.view(*q.shape[:-2], *out.shape[-2:])

    @staticmethod
    def backward(ctx, grad):
        q, l = ctx.saved_tensors
        fq, fl = _features_of(q, l)
        # ∇out as autograd gave it and the features, until _KernelIn's backward takes them
        ctx.link.update(grad_out=grad, features=(fq, fl))
        grad_w = _kernel_product(fq, fl, _flat(grad), ctx.chunks, transpose=True)  # (b, m, d)
        return None, None, grad_w.view(ctx.w_shape), None, None, None, None


def kernel_matmul(q, landmarks, w, transpose=False, plan=None):
    """κ(q, landmarks)·w, or κ(q, landmarks)ᵀ·w, without keeping κ for backward.

    Args:
        q (Tensor): (..., N, d)
        landmarks (Tensor): (..., m, d)
        w (Tensor): (..., m, n), or (..., N, n) if ``transpose``
        plan (AttentionPlan, optional): κ's row chunks are its ``kernel_chunk``'s (its
            ``compiled_kernel_chunks`` under torch.compile; ``_chunk_count``); None: the
            plan in force for q's device type.
    Returns:
        Tensor: (..., N, n), or (..., m, n) if ``transpose``
    """
    chunks = _chunk_count(q, landmarks, plan)
    return _KernelMatmul.apply(q, landmarks, w, transpose, chunks,
                               *_features_of(q, landmarks))


def kernel_attention(q, landmarks, v, middle, lm=None, plan=None):
    """P·middle(l̃, Pᵀ·V) for P = κ(q, landmarks) in row chunks, never kept for backward.

    The backward of the first product forms one G = ∇P ⊙ P for both (``_KernelIn``,
    ``_KernelOut``); while compiling or tracing, two ``kernel_matmul`` calls around
    ``middle`` (Dynamo cannot trace the hand-over between the two backward passes; the
    same values and gradients up to rounding).

    Args:
        q (Tensor): (..., N, d)
        landmarks (Tensor): (..., m, d), q's dtype.
        v (Tensor): (..., N, d)
        middle (callable): (l̃ (..., m, d), Z (..., m, d) in l̃'s dtype) -> W (..., m, d),
            differentiable in both.
        lm (Tensor, optional): the landmarks ``middle`` takes, l̃ (e.g. in float32 for
            half-precision q); None: ``landmarks``.
        plan (AttentionPlan, optional): P's row chunks are its ``kernel_chunk``'s (its
            ``compiled_kernel_chunks`` under torch.compile; ``_chunk_count``); None: the
            plan in force for q's device type.
    Returns:
        Tensor: (..., N, d) in q's dtype.
    """
    lm = landmarks if lm is None else lm
    chunks = _chunk_count(q, landmarks, plan)
    features = _features_of(q, landmarks)
    if is_compiling() or torch.jit.is_tracing():
        Z = _KernelMatmul.apply(q, landmarks, v, True, chunks, *features)  # (..., m, d)
        W = middle(lm, Z.to(lm.dtype))
        return _KernelMatmul.apply(q, landmarks, W.to(q.dtype), False, chunks, *features)
    link = {}  # W, and in backward ∇out, from _KernelOut to _KernelIn
    Z = _KernelIn.apply(q, landmarks, v, link, chunks, *features)  # (..., m, d)
    W = middle(lm, Z.to(lm.dtype))
    return _KernelOut.apply(q, landmarks, W.to(q.dtype), link, chunks, *features)


def soft_attention(q, landmarks, v, iters=20, normalize=True, pinv_method='auto', plan=None):
    """Softmax-free attention P·Â·(Pᵀ·V) with the symmetric Gaussian kernel (K = Q).

    Computed as P·(Â·(Pᵀ·V)): O(N·m·d + m²·d) instead of the O(N·m²) of forming P·Â.
    Â = D^-1/2·A⁺·D^-1/2 is never formed either: D^-1/2 scales the thin m×d matrices and
    A⁺ is applied to them (the variant ``plan.select_variant`` picks). With gradients, P
    is computed in chunks and never kept (``kernel_attention``); without, it is computed
    once, or in chunks twice where the plan says so for its size (``plan.py``).

    Args:
        q (Tensor): (..., N, d) queries (= keys), already scaled by d^(-1/4)
        landmarks (Tensor): (..., m, d) bottleneck tokens Q̃
        v (Tensor): (..., N, d) values
        iters (int): Newton–Raphson steps.
        normalize (bool): apply D^-1/2 A⁺ D^-1/2 (Eq. 25); off reproduces the
            un-normalized SOFT of the NeurIPS paper (Table 10 ablation).
        pinv_method (str): how the T-step iterate A⁺ is computed: 'auto', the plan's
            list for m, or a registered variant's name (``plan.pinv_methods()``;
            another raises ValueError; the fast mode 'regularized' is not the iterate).
        plan (AttentionPlan, optional): every per-device choice (``plan.py``); None: the
            plan in force for q's device type. A SOFT layer reads it once per forward and
            passes it here.
    Returns:
        Tensor: (..., N, d) in q's dtype (the autocast dtype under autocast).
    """
    if iters < 0:
        raise ValueError(f'iters must be >= 0, got {iters}')
    plan = plan_for(q.device.type) if plan is None else plan
    device = device_type(q)
    # Under autocast the N-sized products run in the autocast dtype, as plain matmuls
    # would; the Function below sees concrete dtypes and runs with autocast off.
    cast = autocast_dtype(device)
    with torch.autocast(device_type=device, enabled=False):
        qc, lc, vc = [t if cast is None or t.dtype == torch.float64 else t.to(cast)
                      for t in (q, landmarks, v)]
        # P in row chunks (``kernel_attention``) when gradients are needed (then it is
        # never kept for backward) or when it is too large to form at once on this
        # device; a traced graph keeps the plain products (the chunks are Python-side).
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, landmarks, v))
        once_up_to = plan.kernel_once_up_to
        large = once_up_to is not None and q[..., 0].numel() * lc.shape[-2] > once_up_to
        chunked = (grad or large) and not torch.jit.is_tracing()
        # The small m×m landmark kernel A and its inverse always stay in float32.
        dtype = compute_dtype(landmarks)
        lm = landmarks.to(dtype)
        if chunked:  # the kernel features once for both products
            middle = partial(_landmark_middle, iters=iters, normalize=normalize,
                             pinv_method=pinv_method, plan=plan)
            return kernel_attention(qc, lc, vc, middle, lm, plan)
        # The landmarks' features serve A and P (unless P runs in another dtype: autocast,
        # half inputs). Not in training, where they would have to exist before the kernel
        # products' Function: the landmarks' gradients are then summed in another order
        # (same math; last bits differ, and so do long training runs).
        fm = kernel_features(lm, right=True)
        fl = fm if lc.dtype == dtype else kernel_features(lc, right=True)
        P = _kernel(kernel_features(qc), fl)  # (..., N, m), computed once
        # A = κ(l̃, l̃): [l̃, |l̃|², -1/2] from [l̃, -1/2, |l̃|²], one copy, no norms
        A = _kernel(torch.cat([fm[..., :-2], fm[..., -1:], fm[..., -2:-1]], -1), fm)
        W = _apply_inverse(A, (P.transpose(-1, -2) @ vc).to(dtype), iters, normalize,
                           pinv_method, plan)
        return P @ W.to(P.dtype)


def _apply_inverse(A, Z, iters, normalize, pinv_method, plan):
    """W = D^-1/2·A⁺·D^-1/2·Z (Eq. 25; A⁺·Z without ``normalize``), D = diag(A·1),
    A⁺·Z by the variant the dispatch picks for these inputs (``plan.select_variant``).

    Args:
        A (Tensor): (..., m, m) landmark kernel, float32 or float64.
        Z (Tensor): (..., m, d) Pᵀ·V, A's dtype.
        pinv_method (str): the layer's: 'auto' (the plan's list) or a variant's name.
    Returns:
        Tensor: (..., m, d)
    """
    if normalize:
        d_inv_sqrt = A.sum(-1, keepdim=True).rsqrt()  # (..., m, 1)
        Z = d_inv_sqrt * Z
    W = select_variant(pinv_method, plan, Inputs.of(A, Z)).apply(A, Z, iters)
    return d_inv_sqrt * W if normalize else W


def _landmark_middle(lm, Z, iters, normalize, pinv_method, plan):
    """``soft_attention``'s m-sized middle for ``kernel_attention``:
    A = κ(l̃, l̃), then ``_apply_inverse``."""
    return _apply_inverse(gaussian_kernel(lm, lm), Z, iters, normalize, pinv_method, plan)


def _out_of_place_kernel(a, b):
    """exp(-||a - b||²/2) with a new tensor per step, as the official code computes it."""
    a_sq = a.pow(2).sum(-1, keepdim=True)
    b_sq = b.pow(2).sum(-1).unsqueeze(-2)
    return (a @ b.transpose(-1, -2) - 0.5 * a_sq - 0.5 * b_sq).clamp(max=0).exp()


def official_order_attention(q, landmarks, v, iters=20, normalize=True):
    """The official code's order of computation: (P·Â)·(Pᵀ·V) with Â formed.

    The reference the fast paths are checked and timed against (a whole model runs it
    under ``mmsoft.testing.official_order``): the same value as ``soft_attention`` up to
    rounding, at the official cost: P computed twice with a new tensor per step, the
    reference iterate formed (``newton_pinv``), and P·Â an O(N·m²) product.

    Args:
        q (Tensor): (..., N, d) scaled queries (= keys)
        landmarks (Tensor): (..., m, d)
        v (Tensor): (..., N, d)
    Returns:
        Tensor: (..., N, d)
    """
    A = _out_of_place_kernel(landmarks, landmarks)
    Y = newton_pinv(A, iters=iters)
    if normalize:
        Y = normalize_inverse(A, Y)
    left = _out_of_place_kernel(q, landmarks) @ Y  # P·Â: O(N·m²)
    right = _out_of_place_kernel(landmarks, q) @ v  # P computed a second time
    return left @ right
