"""XCiT-SimA: XCiT with its cross-covariance attention replaced by SimA (SimA paper),
tapped at four depths and turned into a stride 4/8/16/32 pyramid as XCiT's detection and
segmentation backbones do.

Module and parameter names follow the official XCiT / SimA code, so their ImageNet files
load without renaming (``checkpoint_filter_fn`` drops the classification-only parts).
"""
import logging
import math
from typing import Dict

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import print_log

from ...registry import register_model
from ..attention import sima_attention
from ..attention.dtypes import device_type
from ..utils import Backbone, DropPath, Mlp, build_norm, parse_arch

__all__ = ['XCiTSimA', 'fourier_position_encoding', 'checkpoint_filter_fn']


def fourier_position_encoding(height, width, hidden_dim=32, temperature=10000.,
                              device=None, dtype=torch.float32):
    """XCiT's sine/cosine encoding of 1-based row/column indices, for any grid.

    Returns:
        Tensor: (1, 2·hidden_dim, height, width), channels = concat(pos_y, pos_x), each
        interleaved sin(k=0), cos(k=1), sin(k=2), ...
    """
    eps, scale = 1e-6, 2 * math.pi
    y = torch.arange(1, height + 1, device=device, dtype=torch.float32)
    x = torch.arange(1, width + 1, device=device, dtype=torch.float32)
    y = y / (y[-1] + eps) * scale
    x = x / (x[-1] + eps) * scale
    k = torch.arange(hidden_dim, device=device, dtype=torch.float32)
    dim_t = temperature**(2 * torch.div(k, 2, rounding_mode='floor') / hidden_dim)

    def encode(t):  # (L,) -> (L, F) interleaved sin/cos
        p = t[:, None] / dim_t
        return torch.stack((p[:, 0::2].sin(), p[:, 1::2].cos()), dim=2).flatten(1)

    pos_y = encode(y)[:, None, :].expand(height, width, hidden_dim)
    pos_x = encode(x)[None, :, :].expand(height, width, hidden_dim)
    pos = torch.cat((pos_y, pos_x), dim=2).permute(2, 0, 1)
    return pos.unsqueeze(0).to(dtype)


class PositionalEncodingFourier(nn.Module):
    """Fourier position encoding followed by the 1×1 ``token_projection`` (2F -> C)."""

    def __init__(self, embed_dims, hidden_dim=32, temperature=10000.):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.temperature = temperature
        self.token_projection = nn.Conv2d(2 * hidden_dim, embed_dims, 1)

    def forward(self, B, H, W):
        w = self.token_projection.weight
        pos = fourier_position_encoding(H, W, self.hidden_dim, self.temperature,
                                        device=w.device, dtype=w.dtype)
        return self.token_projection(pos).expand(B, -1, -1, -1)


class ConvPatchEmbed(nn.Module):
    """Stack of stride-2 Conv3×3 + BN with GELU between (patch 16: 4 convs, 8: 3 convs)."""

    def __init__(self, in_channels, embed_dims, patch_size, norm_cfg):
        super().__init__()
        n = int(math.log2(patch_size))
        widths = [in_channels] + [embed_dims // 2**(n - 1 - i) for i in range(n)]
        layers = []
        for i in range(n):
            if i > 0:
                layers.append(nn.GELU())
            layers.append(nn.Sequential(
                nn.Conv2d(widths[i], widths[i + 1], 3, 2, 1, bias=False),
                build_norm(norm_cfg, widths[i + 1])))
        self.proj = nn.Sequential(*layers)

    def forward(self, x):
        return self.proj(x)


class SimAAttention(nn.Module):
    """``qkv`` projection, SimA (no softmax, no temperature), ``proj``."""

    def __init__(self, embed_dims, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(embed_dims, 3 * embed_dims)
        self.proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, x):
        B, N, C = x.shape
        h = self.num_heads
        q, k, v = self.qkv(x).reshape(B, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
        out = sima_attention(q, k, v).transpose(1, 2).reshape(B, N, C)
        # The output is ~d/N small: project it in float32 so half precision cannot
        # flush it to zero.
        with torch.autocast(device_type=device_type(out), enabled=False):
            return F.linear(out, self.proj.weight.to(out.dtype), self.proj.bias.to(out.dtype))


class LPI(nn.Module):
    """Local patch interaction: depthwise Conv3×3 -> GELU -> BN -> depthwise Conv3×3."""

    def __init__(self, embed_dims, norm_cfg):
        super().__init__()
        self.conv1 = nn.Conv2d(embed_dims, embed_dims, 3, padding=1, groups=embed_dims)
        self.act = nn.GELU()
        self.bn = build_norm(norm_cfg, embed_dims)
        self.conv2 = nn.Conv2d(embed_dims, embed_dims, 3, padding=1, groups=embed_dims)

    def forward(self, x, H, W):
        B, N, C = x.shape
        x = x.transpose(1, 2).reshape(B, C, H, W)
        x = self.conv2(self.bn(self.act(self.conv1(x))))
        return x.reshape(B, C, N).transpose(1, 2)


class SimABlock(nn.Module):
    """XCiT block (XCiT paper, Sec. 3) with SimA attention; layer scale γ = η·1."""

    def __init__(self, embed_dims, num_heads, eta, drop_path, norm_cfg):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.attn = SimAAttention(embed_dims, num_heads)
        self.norm3 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.local_mp = LPI(embed_dims, norm_cfg)
        self.norm2 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.mlp = Mlp(embed_dims, 4 * embed_dims)
        self.gamma1 = nn.Parameter(eta * torch.ones(embed_dims))
        self.gamma3 = nn.Parameter(eta * torch.ones(embed_dims))
        self.gamma2 = nn.Parameter(eta * torch.ones(embed_dims))
        self.drop_path = DropPath(drop_path)

    def forward(self, x, H, W):
        x = x + self.drop_path(self.gamma1 * self.attn(self.norm1(x)))
        x = x + self.drop_path(self.gamma3 * self.local_mp(self.norm3(x), H, W))
        return x + self.drop_path(self.gamma2 * self.mlp(self.norm2(x)))


@register_model()
class XCiTSimA(Backbone):
    """XCiT-SimA backbone for dense prediction: four NCHW maps at strides 4, 8, 16, 32.

    Args:
        arch (str | dict): 't12', 's12', 't24', 's24', 'm24', 'l24' (XCiT paper Table 1)
            or a dict with ``embed_dims``, ``depth``, ``num_heads``, ``eta``.
        patch_size (int): 16 or 8.
        in_channels (int): input image channels.
        out_indices (Sequence[int]): the four (0-based) blocks tapped for strides 4, 8, 16
            and 32; default 3, 5, 7, 11 for depth 12 and 7, 11, 15, 23 for depth 24. Blocks
            after the last tap are not built.
        with_pyramid (bool): turn the four taps into strides 4/8/16/32 (XCiT's dense
            backbones); False returns them as they are, all at stride ``patch_size``
            (for classification).
        drop_path_rate (float): stochastic depth, the same rate in every block (as XCiT).
        norm_cfg (dict): BatchNorm of the patch embedding, the LPI and the stride-4 branch
            (``SyncBN`` in multi-GPU configs; ``BN`` on CPU).
        norm_eval (bool): keep the BatchNorm layers in eval mode while training (running
            statistics used and frozen), e.g. for small per-GPU batches or multi-process
            CPU training, where SyncBN is not available.
        frozen_stages (int): as MMPretrain's ViT and XCiT count it, in blocks: 0 freezes
            the patch embedding and position encoding, k >= 1 also the first k blocks;
            -1 (default) freezes nothing.
        with_cp (bool): activation checkpointing of every block.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads official
            SimA or XCiT ImageNet files, or mmengine checkpoints.
    """
    arch_zoo: Dict[str, dict] = {
        't12': dict(embed_dims=192, depth=12, num_heads=4, eta=1.0),
        's12': dict(embed_dims=384, depth=12, num_heads=8, eta=1.0),
        't24': dict(embed_dims=192, depth=24, num_heads=4, eta=1e-5),
        's24': dict(embed_dims=384, depth=24, num_heads=8, eta=1e-5),
        'm24': dict(embed_dims=512, depth=24, num_heads=8, eta=1e-5),
        'l24': dict(embed_dims=768, depth=24, num_heads=16, eta=1e-5),
    }
    essential_keys = {'embed_dims', 'depth', 'num_heads', 'eta'}
    default_taps = {12: (3, 5, 7, 11), 24: (7, 11, 15, 23)}

    def __init__(self,
                 arch='s12',
                 patch_size=16,
                 in_channels=3,
                 out_indices=None,
                 with_pyramid=True,
                 drop_path_rate=0.1,
                 norm_cfg=dict(type='BN'),
                 norm_eval=False,
                 frozen_stages=-1,
                 with_cp=False,
                 init_cfg=None):
        super().__init__(frozen_stages, norm_eval, with_cp, drop_path_rate, init_cfg)
        arch = parse_arch(arch, self.arch_zoo, self.essential_keys, 'XCiTSimA')
        self.embed_dims = C = int(arch['embed_dims'])
        self.depth = int(arch['depth'])
        self.num_heads = int(arch['num_heads'])
        self.eta = float(arch['eta'])
        if C % self.num_heads != 0:
            raise ValueError(f'arch embed_dims={C} is not divisible by num_heads='
                             f'{self.num_heads}')
        if patch_size not in (8, 16):
            raise ValueError(f'patch_size must be 8 or 16, got {patch_size}')
        if C % (patch_size // 2) != 0:
            raise ValueError(f'embed_dims={C} must be divisible by {patch_size // 2} for '
                             f'the patch-{patch_size} convolutional stem')
        if out_indices is None:
            if self.depth not in self.default_taps:
                raise ValueError(f'out_indices must be given for depth {self.depth} (defaults '
                                 f'exist for depths {sorted(self.default_taps)})')
            out_indices = self.default_taps[self.depth]
        out_indices = self._parse_out_indices(out_indices, self.depth, 'block', count=4)
        self._check_frozen_stages(out_indices[-1] + 1, 'blocks')
        self.patch_size = patch_size
        # The stride-32 level max-pools the patch grid by 32 / patch_size: the grid
        # (⌈H / p⌉ per side) must hold at least one such window.
        self.min_input_size = patch_size * (32 // patch_size - 1) + 1
        self.out_indices = out_indices

        self.patch_embed = ConvPatchEmbed(in_channels, C, patch_size, norm_cfg)
        self.pos_embeder = PositionalEncodingFourier(C)
        self.blocks = nn.ModuleList([
            SimABlock(C, self.num_heads, self.eta, drop_path_rate, norm_cfg)
            for _ in range(out_indices[-1] + 1)
        ])
        self.with_pyramid = with_pyramid
        if with_pyramid:
            self._build_pyramid(C, patch_size, norm_cfg)

    def _build_pyramid(self, C, patch_size, norm_cfg):
        """Taps (stride ``patch_size``) -> strides 4, 8, 16, 32, as XCiT's detection and
        segmentation backbones do."""

        def up():
            return nn.ConvTranspose2d(C, C, 2, 2)

        if patch_size == 16:
            self.fpn1 = nn.Sequential(up(), build_norm(norm_cfg, C), nn.GELU(), up())
            self.fpn2 = up()
            self.fpn3 = nn.Identity()
            self.fpn4 = nn.MaxPool2d(2)
        else:
            self.fpn1 = up()
            self.fpn2 = nn.Identity()
            self.fpn3 = nn.MaxPool2d(2)
            self.fpn4 = nn.MaxPool2d(4)

    def adapt_checkpoint(self, state_dict):
        return checkpoint_filter_fn(state_dict, self)

    def _frozen_parts(self):
        """The patch embedding and position encoding, then the first blocks."""
        if self.frozen_stages < 0:
            return [], []
        return [self.patch_embed, self.pos_embeder,
                *self.blocks[:self.frozen_stages]], []

    def forward(self, x):
        self._check_input(x)
        B = x.shape[0]
        x = self.patch_embed(x)
        Hp, Wp = x.shape[-2:]
        x = x + self.pos_embeder(B, Hp, Wp).to(x.dtype)
        x = x.flatten(2).transpose(1, 2)
        taps = []
        for i, blk in enumerate(self.blocks):
            x = self._run_block(blk, x, Hp, Wp)
            if i in self.out_indices:
                taps.append(x.transpose(1, 2).reshape(B, -1, Hp, Wp))
        if not self.with_pyramid:
            return tuple(taps)
        ops = (self.fpn1, self.fpn2, self.fpn3, self.fpn4)
        return tuple(op(t) for op, t in zip(ops, taps))


def checkpoint_filter_fn(state_dict, model=None):
    """Adapt an official XCiT or SimA ImageNet state dict to ``model``.

    Drops what dense prediction does not use (``cls_token``, ``cls_attn_blocks``, ``norm``,
    ``head``) and XCA's ``attn.temperature`` (SimA has none). Given a ``model``, checks the
    number of blocks before any weight is copied: the checkpoint must hold every built
    block (up to the last of ``out_indices``) and no more than the arch's depth; blocks
    after the last built one are dropped, with a log line.
    """
    unused = ('cls_token', 'cls_attn_blocks.', 'norm.', 'head.')
    kept = {k: v for k, v in state_dict.items()
            if not (k.startswith(unused) or k.endswith('attn.temperature'))}
    ids = {int(k.split('.')[1]) for k in kept if k.startswith('blocks.')}
    if model is None or not ids:
        return kept
    n_ckpt, built = max(ids) + 1, len(model.blocks)
    if not built <= n_ckpt <= model.depth:
        raise ValueError(f'XCiTSimA checkpoint has {n_ckpt} blocks but the model arch has '
                         f'depth {model.depth} and builds blocks 0-{built - 1} (up to '
                         f'out_indices[-1]={model.out_indices[-1]}): choose the arch the '
                         f'checkpoint was trained with')
    if n_ckpt > built:
        print_log(f'XCiTSimA: checkpoint blocks {built}-{n_ckpt - 1} come after the last '
                  f'tapped block (out_indices[-1]={model.out_indices[-1]}) and are not '
                  f'built: ignored', logger='current', level=logging.INFO)
        kept = {k: v for k, v in kept.items()
                if not (k.startswith('blocks.') and int(k.split('.')[1]) >= built)}
    return kept
