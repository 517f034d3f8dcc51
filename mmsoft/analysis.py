"""Looking inside the backbones: attention maps, Newton–Raphson convergence, inverse norms.

Used by tools/analysis/*.py; every function works on a built backbone and an input batch
and returns plain tensors / numbers, so it can be tested without files.
"""
import argparse

import numpy as np
import torch
import torch.nn.functional as F

from .models.attention import (gaussian_kernel, newton_pinv, newton_pinv_error,
                               normalize_inverse)
from .models.backbones.soft import SoftKernelAttention
from .models.backbones.xcit_sima import SimAAttention

IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)


def load_image(source, short_side=None):
    """An RGB uint8 array from a file path or a scikit-image sample name ('astronaut')."""
    from PIL import Image
    try:
        img = Image.open(source).convert('RGB')
    except (FileNotFoundError, OSError, AttributeError):
        from skimage import data as skdata
        if not hasattr(skdata, str(source)):
            raise FileNotFoundError(f'{source} is neither an image file nor a '
                                    f'scikit-image sample (e.g. astronaut, coffee, chelsea)')
        img = Image.fromarray(getattr(skdata, source)()).convert('RGB')
    if short_side:
        w, h = img.size
        s = short_side / min(w, h)
        img = img.resize((max(1, round(w * s)), max(1, round(h * s))), Image.BILINEAR)
    return np.asarray(img)


def to_tensor(images):
    """(list of) HxWx3 uint8 RGB -> normalized (B, 3, H, W) float tensor (ImageNet stats)."""
    if isinstance(images, np.ndarray):
        images = [images]
    x = torch.stack([torch.from_numpy(np.array(i)).permute(2, 0, 1).float()
                     for i in images])
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def _capture(model, module_type, x):
    """Run ``model(x)`` and return {name: (module, inputs)} of every ``module_type``."""
    seen, handles = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, module_type):
            handles.append(mod.register_forward_hook(
                lambda m, inp, out, name=name: seen.__setitem__(name, (m, inp))))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def _soft_kernels(mod, inputs):
    """P (B, h, N, m), A (B, h, m, m) and the grid (H, W) of one SOFT attention call."""
    q, _, hw = inputs
    q = q / q.shape[-1]**0.25
    lm = mod.landmarks(q, hw)
    return gaussian_kernel(q, lm), gaussian_kernel(lm, lm), hw


def soft_layers(model, x):
    """Names of the SOFT kernel-attention layers that ``model(x)`` runs, in order."""
    return list(_capture(model, SoftKernelAttention, x))


@torch.no_grad()
def soft_attention_rows(model, x, layer, query):
    """The attention row P·Â·Pᵀ of one query token, per head, for one SOFT layer.

    Args:
        layer (str): module name of a ``SoftKernelAttention`` (see ``soft_layers``).
        query (tuple[float, float]): (y, x) position of the query as fractions of the image.
    Returns:
        Tensor: (B, h, H, W) attention of the query token over the layer's token grid.
    """
    seen = _capture(model, SoftKernelAttention, x)
    if layer not in seen:
        raise KeyError(f'{layer!r} is not a SOFT attention layer; choose from {list(seen)}')
    mod, inputs = seen[layer]
    P, A, (H, W) = _soft_kernels(mod, inputs)
    Y = newton_pinv(A, iters=mod.newton_iters)
    if mod.normalize:
        Y = normalize_inverse(A, Y)
    qi = min(int(query[0] * H), H - 1) * W + min(int(query[1] * W), W - 1)
    row = (P[:, :, qi:qi + 1] @ Y) @ P.transpose(-1, -2)  # (B, h, 1, N)
    return row.reshape(*row.shape[:2], H, W)


@torch.no_grad()
def sima_token_importance(model, x, layer):
    """SimA's token importance: the L2 norm of q̂ and k̂ per token (SimA paper Fig. 3).

    Returns:
        tuple[Tensor, Tensor]: q and k maps, each (B, h, Hp, Wp).
    """
    seen = _capture(model, SimAAttention, x)
    if layer not in seen:
        raise KeyError(f'{layer!r} is not a SimA attention layer; choose from {list(seen)}')
    mod, (tokens, ) = seen[layer]
    B, N, C = tokens.shape
    h = mod.num_heads
    q, k, _ = mod.qkv(tokens).reshape(B, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
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
    for name, (mod, inputs) in _capture(model, SoftKernelAttention, x).items():
        _, A, _ = _soft_kernels(mod, inputs)
        A = A.double()
        errs = [newton_pinv_error(A, newton_pinv(A, iters=k)).mean().item()
                for k in range(iters + 1)]
        out[name] = dict(errors=errs, m=A.shape[-1])
    return out


@torch.no_grad()
def inverse_spectral_norms(model, x):
    """The paper's Fig. 5b: ||A⁺||₂ without and with attention normalization, per layer.

    Returns:
        dict[str, dict]: per layer ``m``, ``plain`` and ``normalized`` (means over batch
        and heads).
    """
    out = {}
    for name, (mod, inputs) in _capture(model, SoftKernelAttention, x).items():
        _, A, _ = _soft_kernels(mod, inputs)
        A = A.double()
        Y = newton_pinv(A, iters=mod.newton_iters)
        plain = torch.linalg.matrix_norm(Y, ord=2).mean().item()
        normed = torch.linalg.matrix_norm(normalize_inverse(A, Y), ord=2).mean().item()
        out[name] = dict(m=A.shape[-1], plain=plain, normalized=normed)
    return out


def overlay(image, heat, alpha=0.5, cmap='jet'):
    """Blend a (h, w) heat map, upsampled to the image, over an HxWx3 uint8 image."""
    import matplotlib
    heat = torch.as_tensor(heat, dtype=torch.float32)[None, None]
    heat = F.interpolate(heat, size=image.shape[:2], mode='bilinear', align_corners=False)
    heat = heat[0, 0].numpy()
    lo, hi = float(heat.min()), float(heat.max())
    heat = (heat - lo) / (hi - lo) if hi > lo else np.zeros_like(heat)
    colored = matplotlib.colormaps[cmap](heat)[..., :3] * 255
    return (image * (1 - alpha) + colored * alpha).clip(0, 255).astype(np.uint8)


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


def tool_parser(doc):
    """An argument parser for a tool whose module docstring is ``doc``: first paragraph
    as description, the rest (examples) as epilog."""
    first, _, rest = doc.partition('\n\n')
    return argparse.ArgumentParser(description=first, epilog=rest,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_backbone_args(parser, default='SOFT:small'):
    """--backbone / --config / --checkpoint, the inputs of ``build_backbone``."""
    parser.add_argument('--backbone', help=f'SOFT:ARCH or XCiTSimA:ARCH (default {default})')
    parser.add_argument('--config', help='take the backbone from this config')
    parser.add_argument('--checkpoint', help='weights (official, mmengine or converted)')


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
