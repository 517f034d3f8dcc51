"""Looking inside the backbones: SOFT's attention rows and SimA's token importance (SimA
paper Fig. 3), Newton–Raphson convergence (SOFT paper Fig. 4), where the kernels'
spectra sit against the iterate's convergence boundary, and the inverse's norms
(Fig. 5b).

Every function works on a built backbone and an input batch and returns plain tensors /
numbers (tools/analysis_tools/ draws them).
"""
from dataclasses import replace

import torch
import torch.nn.functional as F

from .models.attention import (Inputs, gaussian_kernel, newton_alpha, newton_pinv_error,
                               normalize_inverse, plan_for, select_variant)
from .models.attention.newton import ALPHA_BOUND, first_step_bound
from .models.backbones.soft import SoftKernelAttention
from .models.backbones.xcit_sima import SimAAttention


def _planned_pinv(A, iters):
    """The T-step iterate of A (``iters`` steps) as the variant 'auto' takes under the
    plan in force for A's device computes it in a training step: its W = A⁺·I."""
    variant = select_variant('auto', plan_for(A.device.type), replace(Inputs.of(A, A), grad=True))
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device).expand_as(A)
    with torch.no_grad():
        return variant.apply(A, eye, iters)


def _alpha_margin(A, max_halvings=10):
    """min |‖I - α_j·A²‖₁ - ``ALPHA_BOUND``| over ``newton_alpha``'s candidates α_j = α/2^j
    (α = 2 / (max row sum)²) and the kernels A (..., m, m), from the norm's definition."""
    alpha = 2 * A.sum(-1).amax(-1)[..., None, None].pow(-2)
    AA = A @ A
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    return min((eye - alpha / 2**j * AA).abs().sum(-2).amax(-1).sub(ALPHA_BOUND).abs().min().item()
               for j in range(max_halvings))


def soft_attention_inputs(model, x):
    """Run ``model(x)`` and return, per SOFT kernel-attention layer, what its forward fed
    the attention: ``{name: (module, q, landmarks, (H, W))}``.

    ``q`` (B, h, N, d) are the queries as the layer scaled them and ``landmarks``
    (B, h, m, d) the layer's own ``landmarks(q, hw)``: they are recorded from that call
    (the method is wrapped on the instance for the pass), not recomputed here.
    """
    seen = {}
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, SoftKernelAttention)]

    def recording(name, mod):

        def landmarks(q, hw):
            lm = type(mod).landmarks(mod, q, hw)
            seen[name] = (mod, q, lm, tuple(hw))
            return lm

        return landmarks

    for name, mod in layers:
        mod.landmarks = recording(name, mod)
    try:
        with torch.no_grad():
            model(x)
    finally:
        for _, mod in layers:
            del mod.landmarks
    return seen


def module_inputs(model, x, module_type):
    """Run ``model(x)`` without gradients and return {name: (module, input)} of every
    module of ``module_type``, its first input copied before the module runs (so an
    in-place module keeps what it received)."""
    seen, handles = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, module_type):
            handles.append(mod.register_forward_pre_hook(
                lambda m, inp, name=name: seen.__setitem__(name, (m, inp[0].detach().clone()))))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def _sima_inputs(model, x):
    """{name: (module, tokens)} of every SimA attention that ``model(x)`` runs."""
    return module_inputs(model, x, SimAAttention)


def soft_layers(model, x):
    """Names of the SOFT kernel-attention layers that ``model(x)`` runs, in order."""
    return list(soft_attention_inputs(model, x))


def sima_layers(model, x):
    """Names of the SimA attention layers that ``model(x)`` runs, in order."""
    return list(_sima_inputs(model, x))


def query_token(query, hw):
    """(row, column) of the token at ``query`` = (y, x) fractions of a (H, W) grid."""
    H, W = hw
    return min(int(query[0] * H), H - 1), min(int(query[1] * W), W - 1)


@torch.no_grad()
def soft_attention_rows(model, x, layer, query):
    """The attention row P·Â·Pᵀ of one query token, per head, for one SOFT layer.

    Args:
        layer (str): module name of a ``SoftKernelAttention`` (see ``soft_layers``).
        query (tuple[float, float]): (y, x) position of the query as fractions of the image;
            the token is ``query_token(query, (H, W))``.
    Returns:
        Tensor: (B, h, H, W) attention of the query token over the layer's token grid.
    """
    seen = soft_attention_inputs(model, x)
    if layer not in seen:
        raise KeyError(f'{layer!r} is not a SOFT attention layer; choose from {list(seen)}')
    mod, q, lm, (H, W) = seen[layer]
    P, A = gaussian_kernel(q, lm), gaussian_kernel(lm, lm)  # (B, h, N, m), (B, h, m, m)
    Y = _planned_pinv(A, mod.newton_iters)
    if mod.normalize:
        Y = normalize_inverse(A, Y)
    i, j = query_token(query, (H, W))
    qi = i * W + j
    row = (P[:, :, qi:qi + 1] @ Y) @ P.transpose(-1, -2)  # (B, h, 1, N)
    return row.reshape(*row.shape[:2], H, W)


@torch.no_grad()
def sima_token_importance(model, x, layer):
    """SimA's token importance: the L2 norm of q̂ and k̂ per token (SimA paper Fig. 3).

    Returns:
        tuple[Tensor, Tensor]: q and k maps, each (B, h, Hp, Wp).
    """
    seen = _sima_inputs(model, x)
    if layer not in seen:
        raise KeyError(f'{layer!r} is not a SimA attention layer; choose from {list(seen)}')
    mod, tokens = seen[layer]
    B, N, C = tokens.shape
    h = mod.num_heads
    q, k, _ = mod.qkv(tokens).reshape(B, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
    # q̂, k̂: L1-normalized over the tokens, as in sima_attention
    q = F.normalize(q, p=1, dim=-2).norm(dim=-1)
    k = F.normalize(k, p=1, dim=-2).norm(dim=-1)
    Hp = x.shape[-2] // model.patch_size + (x.shape[-2] % model.patch_size > 0)
    Wp = N // Hp
    return q.reshape(B, h, Hp, Wp), k.reshape(B, h, Hp, Wp)


@torch.no_grad()
def newton_convergence(model, x, iters=20):
    """The paper's Fig. 4: ||A·A_k·A − A||₂ / ||A||₂ for k = 0..iters, every SOFT layer.

    Returns:
        dict[str, dict]: per layer, ``errors`` (iters + 1,) averaged over batch and heads,
        and the number of landmarks ``m``.
    """
    out = {}
    for name, (_, _, lm, _) in soft_attention_inputs(model, x).items():
        A = gaussian_kernel(lm, lm).double()
        errs = [newton_pinv_error(A, _planned_pinv(A, k)).mean().item()
                for k in range(iters + 1)]
        out[name] = dict(errors=errs, m=A.shape[-1])
    return out


@torch.no_grad()
def newton_boundary(model, x, iters=20, near=1.9):
    """Where each landmark kernel's spectrum sits against the iterate's convergence
    boundary αλ² = 2 (the step size of paper Alg. 2), per SOFT layer.

    On an eigenvalue λ of A the T-step iterate is v_T(λ) = (1 - (1 - αλ²)^(2^T)) / λ, so
    λ·v_T(λ) - 1 = -(1 - αλ²)^(2^T): 0 where the iterate has converged to 1/λ, -1 where
    it is 0 instead. The official α = 2 / (max row sum)² puts the largest eigenvalue of
    A ≈ I (landmarks far apart) at αλ² ≈ 2, where that factor is near 1: the iterate
    then shrinks those directions (A = I exactly: it is 0). Nothing here changes the
    iterate; it reports what it does.

    Returns:
        dict[str, dict]: per layer ``m``; ``near_share``: the share of eigenvalues with
        αλ² ≥ ``near`` (mean over batch and heads); ``max_alpha_lambda2``: the largest
        αλ² of any kernel (≤ 2 by α's test); ``worst_shortfall``: the largest
        |1 - αλ²|^(2^T) over eigenvalues with αλ² > 1 and kernels (0: converged, 1: the
        iterate is 0 in that direction); ``alpha_margin``: how near α's choice came to
        going the other way, min |‖I - α_j·A²‖₁ - 1.01| over the candidates α_j of
        ``newton_alpha`` and the kernels (float64, of the kernel in the landmarks'
        dtype; a margin within that dtype's rounding, ~1e-7 for float32, is a tie that
        another order of sums can decide the other way); ``first_step_bound``: the
        largest bound on αλ² of any kernel from its row sums (``newton.first_step_bound``,
        O(m²): at most 1 proves every eigenvalue far from the step size's boundary 2).
    """
    out = {}
    for name, (_, _, lm, _) in soft_attention_inputs(model, x).items():
        A = gaussian_kernel(lm, lm).double()
        margin = _alpha_margin(A)
        alpha = newton_alpha(A, nonnegative=True).squeeze(-1)  # (..., 1)
        xs = alpha * torch.linalg.eigvalsh(A).pow(2)  # αλ², (..., m)
        shortfall = torch.exp(float(2**iters) * torch.log((1 - xs).abs().clamp_min(1e-300)))
        upper = torch.where(xs > 1, shortfall, torch.zeros_like(shortfall))
        bound = first_step_bound(A, alpha, nonnegative=True).max().item()
        out[name] = dict(m=A.shape[-1], near_share=(xs >= near).double().mean().item(),
                         max_alpha_lambda2=xs.max().item(),
                         worst_shortfall=upper.max().item(), alpha_margin=margin,
                         first_step_bound=bound)
    return out


@torch.no_grad()
def inverse_spectral_norms(model, x):
    """The paper's Fig. 5b: ||A⁺||₂ without and with attention normalization, per layer.

    Returns:
        dict[str, dict]: per layer ``m``, ``plain`` and ``normalized`` (means over batch
        and heads).
    """
    out = {}
    for name, (mod, _, lm, _) in soft_attention_inputs(model, x).items():
        A = gaussian_kernel(lm, lm).double()
        Y = _planned_pinv(A, mod.newton_iters)
        plain = torch.linalg.matrix_norm(Y, ord=2).mean().item()
        normed = torch.linalg.matrix_norm(normalize_inverse(A, Y), ord=2).mean().item()
        out[name] = dict(m=A.shape[-1], plain=plain, normalized=normed)
    return out
