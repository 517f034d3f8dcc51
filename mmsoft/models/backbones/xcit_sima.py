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
from ..utils import Backbone, DropPath, Mlp, build_norm, is_int, parse_arch

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


class CeilMaxPool(nn.Module):
    """k×k max-pooling at stride k that rounds up: ⌈H / k⌉ × ⌈W / k⌉ cells, the last row
    and column over what remains (``MaxPool2d``'s ``ceil_mode``). Written as a padding
    with -inf, which no window takes as its maximum, so that the ONNX exporter of every
    supported torch keeps the sizes dynamic (torch 2.1's refuses a ceil-mode pool of an
    input whose size it does not know)."""

    def __init__(self, kernel_size):
        super().__init__()
        self.kernel_size = kernel_size

    def forward(self, x):
        k = self.kernel_size
        H, W = x.shape[-2:]
        x = F.pad(x, (0, (k - W % k) % k, 0, (k - H % k) % k), value=float('-inf'))
        return F.max_pool2d(x, k)


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

    @staticmethod
    def _conv(conv, x):
        """``conv(x)`` with the weight passed through a reshape. x is a channels-last view
        of the (B, N, C) tokens, for which the kernels return the depthwise weight's
        gradient in channels-last strides; the reshape's backward gives it back in the
        parameter's own strides, which DDP's gradient buckets expect (otherwise DDP
        warns that grad strides do not match and copies them)."""
        w = conv.weight
        return F.conv2d(x, w.flatten(1).view_as(w), conv.bias, conv.stride, conv.padding,
                        conv.dilation, conv.groups)

    def forward(self, x, H, W):
        B, N, C = x.shape
        x = x.transpose(1, 2).reshape(B, C, H, W)
        x = self._conv(self.conv2, self.bn(self.act(self._conv(self.conv1, x))))
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
    """XCiT-SimA backbone for dense prediction: a pyramid of NCHW maps at strides 4, 8, 16
    and 32 (levels 0–3), as XCiT's detection and segmentation backbones build it.

    The patch embedding (stride ``patch_size``) feeds a column of ``depth`` blocks; the
    tokens after four of them (``tap_blocks``) become the four levels, upsampled or
    pooled to their stride (XCiT paper, Sec. 4.2). Level ``i``'s map has
    ⌈H / s_i⌉ × ⌈W / s_i⌉ cells at every input size, as a convolutional backbone's.

    Args:
        arch (str | dict): 't12', 's12', 't24', 's24', 'm24', 'l24' (XCiT paper Table 1)
            or a dict with ``embed_dims``, ``depth``, ``num_heads``, ``eta``.
        patch_size (int): 16 or 8.
        in_channels (int): input image channels.
        out_indices (int | Sequence[int]): the pyramid levels to return, 0–3 for strides
            4, 8, 16 and 32 (-1: the last), as for every MMDetection backbone. Blocks
            after the last returned level's tap are not built.
        tap_blocks (Sequence[int], optional): the four (0-based) blocks whose tokens make
            levels 0–3, increasing; default XCiT's detection taps, 3, 5, 7, 11 for depth
            12 and 7, 11, 15, 23 for depth 24 (earlier mmsoft versions took them as
            out_indices).
        with_pyramid (bool): turn the taps into strides 4/8/16/32 (XCiT's dense
            backbones); False returns the chosen levels' taps as they are, all at stride
            ``patch_size`` (for classification).
        drop_path_rate (float): stochastic depth, the same rate in every block (as XCiT).
        norm_cfg (dict): BatchNorm of the patch embedding, the LPI and the stride-4 branch
            (``SyncBN`` in multi-GPU configs; ``BN`` on CPU).
        norm_eval (bool): keep the BatchNorm layers in eval mode while training (running
            statistics used and frozen), e.g. for small per-GPU batches or multi-process
            CPU training, where SyncBN is not available.
        frozen_stages (int): stages as MMDetection counts them for Swin: 0 freezes (no
            grad, eval mode) the patch embedding and position encoding; k >= 1 also
            stages 1..k, stage i being the blocks after the previous level's tap up to
            level i-1's tap and that level's upsampling or pooling (``fpn{i}``); at the
            number of built levels nothing is left to train. -1 (default) freezes
            nothing.
        with_cp (bool): activation checkpointing of every block.
        pretrained (str, optional): deprecated, the same as ``init_cfg=dict(
            type='Pretrained', checkpoint=pretrained)``, with a warning.
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
    num_levels = 4

    def __init__(self,
                 arch='s12',
                 patch_size=16,
                 in_channels=3,
                 out_indices=(0, 1, 2, 3),
                 tap_blocks=None,
                 with_pyramid=True,
                 drop_path_rate=0.1,
                 norm_cfg=dict(type='BN'),
                 norm_eval=False,
                 frozen_stages=-1,
                 with_cp=False,
                 pretrained=None,
                 init_cfg=None):
        super().__init__(frozen_stages, norm_eval, with_cp, drop_path_rate, pretrained,
                         init_cfg)
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
        self.tap_blocks = self._parse_tap_blocks(tap_blocks)
        self.out_indices = self._parse_out_indices(out_indices, self.num_levels,
                                                   'pyramid level', self._old_taps_hint)
        self.num_built_levels = self.out_indices[-1] + 1
        self._check_frozen_stages(self.num_built_levels, 'levels')
        self.patch_size = patch_size
        self.strides = (4, 8, 16, 32) if with_pyramid else (patch_size,) * 4

        self.patch_embed = ConvPatchEmbed(in_channels, C, patch_size, norm_cfg)
        self.pos_embeder = PositionalEncodingFourier(C)
        self.blocks = nn.ModuleList([
            SimABlock(C, self.num_heads, self.eta, drop_path_rate, norm_cfg)
            for _ in range(self.tap_blocks[self.num_built_levels - 1] + 1)
        ])
        self.with_pyramid = with_pyramid
        if with_pyramid:
            self._build_pyramid(C, patch_size, norm_cfg)

    def _parse_tap_blocks(self, tap_blocks):
        if tap_blocks is None:
            if self.depth not in self.default_taps:
                raise ValueError(f'XCiTSimA: tap_blocks must be given for depth {self.depth} '
                                 f'(defaults exist for depths {sorted(self.default_taps)})')
            return self.default_taps[self.depth]
        taps = list(tap_blocks) if isinstance(tap_blocks, (list, tuple)) else None
        if not (taps and len(taps) == self.num_levels
                and all(is_int(i) for i in taps)
                and 0 <= taps[0] and all(a < b for a, b in zip(taps, taps[1:]))
                and taps[-1] < self.depth):
            raise ValueError(f'XCiTSimA: tap_blocks must be {self.num_levels} increasing '
                             f'block indices in [0, {self.depth - 1}], got {tap_blocks!r}')
        return tuple(taps)

    def _old_taps_hint(self, out_indices):
        """The migration sentence for ``out_indices`` that name tapped blocks, as
        earlier mmsoft versions and XCiT's own detection configs wrote them."""
        values = list(out_indices) if isinstance(out_indices, (list, tuple)) else []
        if len(values) == self.num_levels and all(is_int(i) for i in values):
            return (f'out_indices names the pyramid levels to return; to tap blocks '
                    f'{tuple(values)} for the four levels (what out_indices meant in '
                    f'earlier mmsoft versions and in XCiT\'s own configs), set '
                    f'tap_blocks={tuple(values)} and leave out_indices=(0, 1, 2, 3)')
        return None

    def _build_pyramid(self, C, patch_size, norm_cfg):
        """Taps (stride ``patch_size``) -> strides 4, 8, 16, 32 (XCiT's dense backbones):
        ``fpn{i + 1}`` makes level i, built for the levels returned. Max-pooling rounds
        up (``CeilMaxPool``), and upsampled maps are cropped to ⌈H / s⌉, so every level has
        a convolutional backbone's size."""

        def up():
            return nn.ConvTranspose2d(C, C, 2, 2)

        if patch_size == 16:
            ops = (lambda: nn.Sequential(up(), build_norm(norm_cfg, C), nn.GELU(), up()),
                   up, nn.Identity, lambda: CeilMaxPool(2))
        else:
            ops = (up, nn.Identity, lambda: CeilMaxPool(2), lambda: CeilMaxPool(4))
        for i in self.out_indices:
            setattr(self, f'fpn{i + 1}', ops[i]())

    def adapt_checkpoint(self, state_dict):
        return checkpoint_filter_fn(state_dict, self)

    def _frozen_parts(self):
        """0: the patch embedding and position encoding; k: also stages 1..k, each the
        blocks up to its level's tap and the level's ``fpn``."""
        if self.frozen_stages < 0:
            return [], []
        modules = [self.patch_embed, self.pos_embeder]
        first = 0
        for level in range(self.frozen_stages):
            last = self.tap_blocks[level]
            modules.extend(self.blocks[first:last + 1])
            first = last + 1
            if hasattr(self, f'fpn{level + 1}'):
                modules.append(getattr(self, f'fpn{level + 1}'))
        return modules, []

    def forward(self, x):
        self._check_input(x)
        B, _, H, W = x.shape
        x = self.patch_embed(x)
        Hp, Wp = x.shape[-2:]
        x = x + self.pos_embeder(B, Hp, Wp).to(x.dtype)
        x = x.flatten(2).transpose(1, 2)
        taps = {}
        wanted = {self.tap_blocks[i]: i for i in self.out_indices}
        for i, blk in enumerate(self.blocks):
            x = self._run_block(blk, x, Hp, Wp)
            if i in wanted:
                taps[wanted[i]] = x.transpose(1, 2).reshape(B, -1, Hp, Wp)
        if not self.with_pyramid:
            return tuple(taps[i] for i in self.out_indices)
        outs = []
        for i in self.out_indices:
            s = self.strides[i]
            y = getattr(self, f'fpn{i + 1}')(taps[i])
            # upsampled from ⌈H / p⌉ cells: crop what covers only the stem's padding
            # (⌈H / s⌉ written with non-negative operands: ONNX's integer division of a
            # traced size truncates)
            outs.append(y[..., :(H + s - 1) // s, :(W + s - 1) // s])
        return tuple(outs)


def checkpoint_filter_fn(state_dict, model=None):
    """Adapt an official XCiT or SimA ImageNet state dict to ``model``.

    Drops what dense prediction does not use (``cls_token``, ``cls_attn_blocks``, ``norm``,
    ``head``) and XCA's ``attn.temperature`` (SimA has none). Given a ``model``, checks the
    number of blocks before any weight is copied: the checkpoint must hold every built
    block (up to the tap of the last returned level) and no more than the arch's depth;
    blocks and pyramid branches the model does not build are dropped, with a log line.
    """
    unused = ('cls_token', 'cls_attn_blocks.', 'norm.', 'head.')
    kept = {k: v for k, v in state_dict.items()
            if not (k.startswith(unused) or k.endswith('attn.temperature'))}
    if model is None:
        return kept
    unbuilt = tuple(f'fpn{i + 1}.' for i in range(model.num_levels)
                    if not hasattr(model, f'fpn{i + 1}'))
    dropped = [k for k in kept if k.startswith(unbuilt)]
    if dropped:
        print_log(f'XCiTSimA: {sorted({k.split(".")[0] for k in dropped})} of the checkpoint '
                  f'make pyramid levels that out_indices={model.out_indices} does not '
                  'return: ignored', logger='current', level=logging.INFO)
        kept = {k: v for k, v in kept.items() if not k.startswith(unbuilt)}
    ids = {int(k.split('.')[1]) for k in kept if k.startswith('blocks.')}
    if not ids:
        return kept
    n_ckpt, built = max(ids) + 1, len(model.blocks)
    if not built <= n_ckpt <= model.depth:
        raise ValueError(f'XCiTSimA checkpoint has {n_ckpt} blocks but the model arch has '
                         f'depth {model.depth} and builds blocks 0-{built - 1} (up to the '
                         f'tap of level {model.num_built_levels - 1}, tap_blocks='
                         f'{model.tap_blocks}): choose the arch the checkpoint was trained '
                         f'with (a checkpoint of an earlier mmsoft whose out_indices named '
                         f'fewer blocks: pass those blocks as tap_blocks)')
    if n_ckpt > built:
        print_log(f'XCiTSimA: checkpoint blocks {built}-{n_ckpt - 1} come after the last '
                  f'tapped block (tap_blocks={model.tap_blocks}, out_indices='
                  f'{model.out_indices}) and are not built: ignored', logger='current',
                  level=logging.INFO)
        kept = {k: v for k, v in kept.items()
                if not (k.startswith('blocks.') and int(k.split('.')[1]) >= built)}
    return kept
