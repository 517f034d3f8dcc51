"""Looking inside the backbones: attention maps, Newton–Raphson convergence, inverse norms,
the accuracy of the pseudo-inverse paths on hard kernels, and what a forward asks of a
GPU's host (operators launched, host-device transfers).

Used by tools/analysis/*.py and tools/benchmark.py (which hold the plumbing: images,
figures, options in tools/analysis/_common.py); every function here works on a built
backbone and an input batch and returns plain tensors / numbers, so it can be tested
without files.
"""
from collections import Counter
from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .models.attention import (KERNEL_PLAN, PINV_AUTO, gaussian_kernel, newton_alpha,
                               newton_pinv, newton_pinv_apply, newton_pinv_error,
                               normalize_inverse)
from .models.backbones.soft import LOCAL_CONV_LAYOUT, SoftKernelAttention
from .models.backbones.xcit_sima import SimAAttention

# Operators that reach the backend but launch no kernel: allocation and metadata.
NO_KERNEL_OPS = frozenset({'empty', 'empty_like', 'empty_strided', 'new_empty', 'detach',
                           'alias', 'lift_fresh', '_unsafe_view'})


class LaunchCounter(TorchDispatchMode):
    """Counts the ATen operators run below autograd (forward and backward) inside the
    block: on a GPU each launches one or more kernels, so in eager mode this is the host
    work per step. Views and ``NO_KERNEL_OPS`` are not counted. Also records every copy
    of a host tensor to another device (``transfers``): on a GPU such a copy waits for
    the device to finish its queue. 0-dim host tensors are passed as values (no copy).

    Attributes:
        counts (Counter): operator name -> calls.
        transfers (list[str]): the operators that copied a host tensor to a device.
    """

    def __init__(self):
        super().__init__()
        self.counts, self.transfers = Counter(), []

    @property
    def total(self):
        return sum(self.counts.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        returns = func._schema.returns
        view = bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                     for r in returns)
        if not view and name not in NO_KERNEL_OPS:
            self.counts[name] += 1
        host = any(isinstance(t, torch.Tensor) and t.device.type == 'cpu' and t.dim() > 0
                   for t in tree_leaves((args, kwargs)))
        if host and any(isinstance(t, torch.Tensor) and t.device.type != 'cpu'
                        for t in tree_leaves(out)):
            self.transfers.append(name)
        return out


@contextmanager
def table_entry(table, key, value):
    """``table[key] = value`` inside the block (None: no entry), as before afterwards."""
    old = table.get(key)
    try:
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
        yield
    finally:
        if old is None:
            table.pop(key, None)
        else:
            table[key] = old


@contextmanager
def device_plan(device, like):
    """Let tensors on ``device`` take ``like``'s entries of SOFT's per-device tables
    (``PINV_AUTO``, ``KERNEL_PLAN``, ``LOCAL_CONV_LAYOUT``) inside the block: e.g.
    ``device_plan('meta', like='cuda')`` runs on PyTorch's data-less meta device
    exactly the operators CUDA would run."""
    with ExitStack() as stack:
        for table in (PINV_AUTO, KERNEL_PLAN, LOCAL_CONV_LAYOUT):
            stack.enter_context(table_entry(table, device, table.get(like)))
        yield


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


def _sima_inputs(model, x):
    """Run ``model(x)`` and return {name: (module, tokens)} of every SimA attention."""
    seen, handles = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, SimAAttention):
            handles.append(mod.register_forward_hook(
                lambda m, inp, out, name=name: seen.__setitem__(name, (m, inp[0]))))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


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
    Y = newton_pinv(A, iters=mod.newton_iters)
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
    # q̂, k̂: L1-normalized over the tokens, as in sima_attention (SPEC 2.1)
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
        errs = [newton_pinv_error(A, newton_pinv(A, iters=k)).mean().item()
                for k in range(iters + 1)]
        out[name] = dict(errors=errs, m=A.shape[-1])
    return out


@torch.no_grad()
def newton_boundary(model, x, iters=20, near=1.9):
    """Where each landmark kernel's spectrum sits against the iterate's convergence
    boundary αλ² = 2 (SPEC 1.1 step 5), per SOFT layer.

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
        iterate is 0 in that direction).
    """
    out = {}
    for name, (_, _, lm, _) in soft_attention_inputs(model, x).items():
        A = gaussian_kernel(lm, lm).double()
        alpha = newton_alpha(A, nonnegative=True).squeeze(-1)  # (..., 1)
        xs = alpha * torch.linalg.eigvalsh(A).pow(2)  # αλ², (..., m)
        shortfall = torch.exp(float(2**iters) * torch.log((1 - xs).abs().clamp_min(1e-300)))
        upper = torch.where(xs > 1, shortfall, torch.zeros_like(shortfall))
        out[name] = dict(m=A.shape[-1], near_share=(xs >= near).double().mean().item(),
                         max_alpha_lambda2=xs.max().item(),
                         worst_shortfall=upper.max().item())
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
        Y = newton_pinv(A, iters=mod.newton_iters)
        plain = torch.linalg.matrix_norm(Y, ord=2).mean().item()
        normed = torch.linalg.matrix_norm(normalize_inverse(A, Y), ord=2).mean().item()
        out[name] = dict(m=A.shape[-1], plain=plain, normalized=normed)
    return out


# ------------------------------------------------------------------------------------
# Accuracy of the pseudo-inverse paths on landmark kernels that are hard for float32
# ------------------------------------------------------------------------------------
HARD_KERNELS = ('clustered', 'pooled', 'duplicated', 'near_rank1', 'near_identity')


def hard_landmarks(kind, m, d=32, seed=0):
    """(m, d) float64 landmarks whose Gaussian kernel is hard for a float32 inverse.

    'clustered': 4 tight clusters (cond ~5e2); 'pooled': 2×2 means of smooth tokens, as
    SOFT pools them (cond ~2e4 at m = 196); 'duplicated': a quarter of the landmarks twice
    (singular); 'near_rank1': all near one point (cond ~2e7); 'near_identity': far apart,
    squared norms ~20 (αλ² close to 2). 'pooled' needs m = k² (k even or odd).
    """
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    if kind == 'clustered':
        if m % 4:
            raise ValueError(f"'clustered' needs m divisible by 4, got {m}")
        return (randn(4, 1, d) * 0.6 + 0.08 * randn(4, m // 4, d)).reshape(m, d)
    if kind == 'pooled':
        side = round(m**0.5)
        if side * side != m:
            raise ValueError(f"'pooled' needs a square m, got {m}")
        t = F.avg_pool2d(randn(1, d, 2 * side, 2 * side) * 0.35, 3, 1, 1)
        return F.avg_pool2d(t, 2).flatten(2)[0].T.contiguous()
    if kind == 'duplicated':
        x = randn(m - m // 4, d) * 0.3
        return torch.cat([x, x[:m // 4]])
    if kind == 'near_rank1':
        return randn(1, d) + 1e-2 * randn(m, d)
    if kind == 'near_identity':
        return randn(m, d) * (20 / d)**0.5
    raise ValueError(f'kind must be one of {HARD_KERNELS}, got {kind!r}')


def official_float32_iterate(A, iters=20):
    """The official code's iterate in float32, V ← 2V - (V·A)·V from V₀ = αA (one α per
    matrix, SPEC 1.1 step 5): the accuracy floor of every default path."""
    A = A.float()
    V = newton_alpha(A) * A
    for _ in range(iters):
        V = 2 * V - (V @ A) @ V
    return V


def float64_iterate(A, iters=20):
    """The reference: the T-step iterate of A in float64."""
    A = A.double()
    V = newton_alpha(A) * A
    for _ in range(iters):
        V = 2 * V - V @ (A @ V)
    return V


def relative_deviation(W, ref):
    """max|W - ref| / max|ref|, in float64."""
    return ((W.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def hard_problem(kind, m, seed=0, n=32):
    """A hard float32 kernel A (m, m) (``hard_landmarks``), a Z (m, n), the reference
    A⁺·Z (the float64 iterate of A, times Z) and the floor: the official float32
    iteration's deviation from it."""
    x = hard_landmarks(kind, m, seed=seed)
    A = gaussian_kernel(x, x).float()
    Z = torch.randn(m, n, generator=torch.Generator().manual_seed(seed + 1))
    ref = float64_iterate(A) @ Z.double()
    return A, Z, ref, relative_deviation(official_float32_iterate(A) @ Z, ref)


def pinv_accuracy(kind, m, seed=0, n=32,
                  methods=('iterative', 'spectral', 'tf32', 'tf32x3')):
    """Output deviation of A⁺·Z from the float64 iterate for a hard kernel, per path,
    next to the official float32 iteration's (the floor; ``hard_problem``).

    Returns:
        dict: ``floor`` (the official float32 deviation) and, per method,
        ``'<method> inference'`` (no gradient) and ``'<method> training'`` (the path with
        gradients), each as a ratio to the floor.
    """
    A, Z, ref, floor = hard_problem(kind, m, seed, n)
    out = dict(floor=floor)
    for method in methods:
        with torch.no_grad():
            W = newton_pinv_apply(A, Z, method=method, nonnegative=True)
        out[f'{method} inference'] = relative_deviation(W, ref) / floor
        with torch.enable_grad():
            W = newton_pinv_apply(A.clone().requires_grad_(), Z, method=method,
                                  nonnegative=True)
        out[f'{method} training'] = relative_deviation(W.detach(), ref) / floor
    return out


def build_backbone(backbone=None, config=None, checkpoint=None):
    """A backbone in eval mode from ``'SOFT:small'`` / ``'XCiTSimA:s12'`` or from a
    config's ``model.backbone``, optionally loading ``checkpoint`` (any format the
    backbones load: official, mmengine whole-model, converted)."""
    from mmengine.config import Config

    from .models import SOFT, XCiTSimA
    if config is not None:
        cfg = dict(Config.fromfile(config).model.backbone)
        cls = {'SOFT': SOFT, 'XCiTSimA': XCiTSimA}[cfg.pop('type').split('.')[-1]]
        cfg.pop('init_cfg', None)
        if cfg.get('norm_cfg', {}).get('type') == 'SyncBN':
            cfg['norm_cfg'] = dict(cfg['norm_cfg'], type='BN')
    else:
        family, _, arch = (backbone or 'SOFT:small').partition(':')
        if family not in ('SOFT', 'XCiTSimA'):
            raise ValueError(f'backbone must be SOFT:ARCH or XCiTSimA:ARCH, got {backbone!r}')
        cls = {'SOFT': SOFT, 'XCiTSimA': XCiTSimA}[family]
        cfg = dict(arch=arch or ('small' if family == 'SOFT' else 's12'))
    cfg['drop_path_rate'] = 0.
    if checkpoint:
        cfg['init_cfg'] = dict(type='Pretrained', checkpoint=checkpoint)
    model = cls(**cfg)
    model.init_weights()
    return model.eval()


def build_model_from_config(cfg):
    """The detector / segmentor / classifier of a config (path or ``Config``), built as
    mmengine's Runner does (codebase scope, top-level ``data_preprocessor``), without the
    backbone's ImageNet checkpoint, with SyncBN reverted to BN, after ``init_weights()``."""
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    if not isinstance(cfg, Config):
        cfg = Config.fromfile(cfg)
    init_default_scope(cfg.default_scope)
    cfg.model.backbone.pop('init_cfg', None)
    if 'data_preprocessor' in cfg:
        cfg.model.setdefault('data_preprocessor', cfg.data_preprocessor)
    registry = __import__(cfg.default_scope + '.registry', fromlist=['MODELS']).MODELS
    model = revert_sync_batchnorm(registry.build(cfg.model))
    model.init_weights()
    return model
