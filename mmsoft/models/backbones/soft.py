"""SOFT: softmax-free pyramid transformer with attention normalization (SOFT, IJCV 2024).

Module and parameter names follow the official release, so official ImageNet checkpoints
load without renaming (``checkpoint_filter_fn`` only unwraps and drops the head).
"""
import functools
import logging
import math
import warnings
from typing import Dict

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import print_log
from mmengine.model.weight_init import trunc_normal_

from ...registry import register_model
from ..attention import pinv_methods, plan_for, soft_attention
from ..attention.dtypes import is_compiling
from ..cuda_graphs import StageGraphs, can_capture, check_cuda_graphs
from ..utils import Backbone, DropPath, Mlp, build_norm, check_depths, parse_arch

__all__ = ['SOFT', 'checkpoint_filter_fn', 'guard_gelu_grad', 'resize_checkpoint_pos_embeds']


@functools.lru_cache(maxsize=None)
def _gelu_backward_misreads_strides():
    """Whether this torch's GELU backward on the CPU gets a gradient wrong that is laid
    out unlike GELU's input: torch 2.1's (its oneDNN kernel) returns uninitialized memory
    then (pytorch/pytorch#112006). Asked of the kernel itself on 8×8 values, once, at
    the first training forward on the CPU (not at import)."""
    x = torch.linspace(-3, 3, 64, dtype=torch.float32).view(8, 8)
    g = torch.linspace(-1, 1, 64, dtype=torch.float32).view(8, 8).t()  # laid out unlike x
    with torch.no_grad():
        strided = torch.ops.aten.gelu_backward(g, x)
        dense = torch.ops.aten.gelu_backward(g.contiguous(), x)
    return not torch.allclose(strided, dense)


def guard_gelu_grad(y):
    """y, the output of a GELU whose input is contiguous: where this torch's CPU GELU
    backward misreads a gradient laid out otherwise (torch 2.1,
    ``_gelu_backward_misreads_strides``), y's gradient is made contiguous before GELU's
    backward reads it. Elsewhere, under torch.compile (whose backward is generated, not
    that kernel) and while tracing (a traced graph keeps no hook), y unchanged, no hook.

    Autograd hands a sum of gradients to GELU's backward in the layout of the first to
    arrive; the gradient of a product's transposed operand arrives transposed (SOFT's
    landmarks: from A = κ(Q̃, Q̃)).
    """
    if (y.requires_grad and y.device.type == 'cpu' and not is_compiling()
            and not torch.jit.is_tracing() and _gelu_backward_misreads_strides()):
        y.register_hook(torch.Tensor.contiguous)
    return y


class HeadSharedConv(nn.Conv2d):
    """The k×k depthwise conv on V: one filter per head, shared by the head's d channels.

    The official module (same key ``conv.weight``, shape (h, 1, k, k)) runs it as a
    grouped conv over B·d images of h channels ('images'). 'channels' computes the same
    sums as one depthwise conv over V's h·d channels, each head's filter repeated d
    times: V comes from its projection as (B, N, h·d), already a channels-last image, so
    nothing is copied. ``SoftKernelAttention`` passes its plan's ``local_conv_layout``
    (``mmsoft/models/attention/plan.py``).
    """

    def __init__(self, num_heads, head_dims, kernel_size):
        super().__init__(num_heads, num_heads, kernel_size, padding=kernel_size // 2,
                         groups=num_heads, bias=False)
        self.head_dims = head_dims

    def forward(self, v, hw, layout='images'):
        """(B, h, N, d) values on the (H, W) grid -> (B, h, N, d), in ``layout``."""
        B, h, N, d = v.shape
        H, W = hw
        if layout == 'images':
            x = v.permute(0, 3, 1, 2).reshape(B * d, h, H, W)
            return super().forward(x).reshape(B, d, h, N).permute(0, 2, 3, 1)
        if layout != 'channels':
            raise ValueError(f"layout must be 'images' or 'channels', got {layout!r}")
        x = v.transpose(1, 2).reshape(B, H, W, h * d).permute(0, 3, 1, 2)
        # (h, 1, k, k) -> (h·d, 1, k, k) from the module's own sizes (constants in an
        # exported graph, which needs the kernel's shape)
        hd = self.out_channels * self.head_dims
        weight = self.weight.expand(-1, self.head_dims, -1, -1).reshape(hd, 1,
                                                                         *self.kernel_size)
        x = F.conv2d(x, weight, padding=self.padding, groups=hd)
        return x.permute(0, 2, 3, 1).reshape(B, N, h, d).transpose(1, 2)


class SoftKernelAttention(nn.Module):
    """Landmarks, Gaussian kernel, Newton inverse and the depthwise conv on V (paper Eq. 5,
    Alg. 2; IJCV 2024 Eq. 25)."""

    def __init__(self, head_dims, num_heads, sr_ratio, conv_size, newton_iters=20,
                 normalize=True, pinv_method='auto', landmark_grid=None):
        super().__init__()
        self.sr_ratio = sr_ratio
        self.landmark_grid = landmark_grid
        self.newton_iters = newton_iters
        self.normalize = normalize
        self.pinv_method = pinv_method
        # One landmark conv shared by all heads, then LayerNorm(d) + exact GELU.
        self.Qlandmark_op = nn.Conv2d(head_dims, head_dims, sr_ratio, sr_ratio, bias=False)
        self.Qnorm_act = nn.Sequential(nn.LayerNorm(head_dims, eps=1e-5), nn.GELU())
        self.conv = HeadSharedConv(num_heads, head_dims, conv_size)

    def landmarks(self, q, hw):
        """(B, h, N, d) scaled queries -> (B, h, m, d) bottleneck tokens Q̃."""
        B, h, N, d = q.shape
        H, W = hw
        x = q.reshape(B * h, H, W, d).permute(0, 3, 1, 2)
        r, g = self.sr_ratio, self.landmark_grid
        if g is not None and (H // r > g or W // r > g):
            # Bounded landmarks: average-pool the queries so that the r×r landmark conv
            # yields at most g×g landmarks (m stays fixed as N grows; paper Table 8).
            x = F.adaptive_avg_pool2d(x, (min(H // r, g) * r, min(W // r, g) * r))
        x = self.Qlandmark_op(x)  # (B·h, d, H/r, W/r)
        x = x.flatten(2).transpose(1, 2).reshape(B, h, -1, d)
        return guard_gelu_grad(self.Qnorm_act(x))

    def forward(self, q, v, hw):
        # The one read of the device's plan on this layer's way; its choices go down as
        # arguments (under torch.compile, one graph per plan).
        plan = plan_for(q.device.type)
        q = q / q.shape[-1]**0.25
        lm = self.landmarks(q, hw)
        out = soft_attention(q, lm, v, iters=self.newton_iters, normalize=self.normalize,
                             pinv_method=self.pinv_method, plan=plan)
        return out + self.conv(v, hw, plan.local_conv_layout)


class SoftMultiHeadAttention(nn.Module):
    """Q = K projection, V projection, kernel attention, output projection ``ff``."""

    def __init__(self, embed_dims, num_heads, sr_ratio, conv_size, **attn_kwargs):
        super().__init__()
        self.num_heads = num_heads
        self.W_q = nn.Linear(embed_dims, embed_dims)
        self.W_v = nn.Linear(embed_dims, embed_dims)
        self.attn = SoftKernelAttention(embed_dims // num_heads, num_heads, sr_ratio,
                                        conv_size, **attn_kwargs)
        self.ff = nn.Linear(embed_dims, embed_dims)

    def forward(self, x, hw):
        B, N, C = x.shape
        h = self.num_heads
        q = self.W_q(x).reshape(B, N, h, C // h).transpose(1, 2)
        v = self.W_v(x).reshape(B, N, h, C // h).transpose(1, 2)
        out = self.attn(q, v, hw).transpose(1, 2).reshape(B, N, C)
        return self.ff(out)


class SoftLayer(nn.Module):
    """Post-norm SOFT layer, as the released models run it: LN(x + attn),
    LN(y + FF(GELU_tanh(FF(y))))."""

    def __init__(self, embed_dims, num_heads, sr_ratio, conv_size, drop_path=0.,
                 **attn_kwargs):
        super().__init__()
        self.mha = SoftMultiHeadAttention(embed_dims, num_heads, sr_ratio, conv_size,
                                          **attn_kwargs)
        self.norm1 = nn.LayerNorm(embed_dims, eps=1e-5)
        self.ff1 = nn.Linear(embed_dims, 4 * embed_dims)
        self.ff2 = nn.Linear(4 * embed_dims, embed_dims)
        self.norm2 = nn.LayerNorm(embed_dims, eps=1e-5)
        self.drop_path = DropPath(drop_path)

    def forward(self, x, hw):
        y = self.norm1(x + self.drop_path(self.mha(x, hw)))
        ff = self.ff2(F.gelu(self.ff1(y), approximate='tanh'))
        return self.norm2(y + self.drop_path(ff))


class SoftBlock(nn.Module):
    """Wrapper that gives the official key path ``block{s}.{i}.att.*``."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.att = SoftLayer(*args, **kwargs)

    def forward(self, x, hw):
        return self.att(x, hw)


class SoftmaxAttention(nn.Module):
    """Stage-4 softmax attention (PVT style, sr_ratio 1): ``q``, ``kv``, ``proj``."""

    def __init__(self, embed_dims, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(embed_dims, embed_dims)
        self.kv = nn.Linear(embed_dims, 2 * embed_dims)
        self.proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, x):
        B, N, C = x.shape
        h = self.num_heads
        q = self.q(x).reshape(B, N, h, C // h).transpose(1, 2)
        k, v = self.kv(x).reshape(B, N, 2, h, C // h).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)  # scale d^-1/2
        return self.proj(out.transpose(1, 2).reshape(B, N, C))


class SoftmaxBlock(nn.Module):
    """Pre-norm stage-4 block with softmax attention, as the released models run it (PVT
    style), LayerNorm eps 1e-6, MLP ratio 4."""

    def __init__(self, embed_dims, num_heads, drop_path=0.):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.attn = SoftmaxAttention(embed_dims, num_heads)
        self.norm2 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.mlp = Mlp(embed_dims, 4 * embed_dims)
        self.drop_path = DropPath(drop_path)

    def forward(self, x, hw):
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    """Convolutional downsampling with the official ``proj`` Sequential layout."""

    def __init__(self, in_channels, embed_dims, norm_cfg, stem=False):
        super().__init__()

        def conv_bn_relu(cin, cout, stride):
            return [nn.Conv2d(cin, cout, 3, stride, 1), build_norm(norm_cfg, cout),
                    nn.ReLU(inplace=True)]

        if stem:  # stride 4: conv s2 (3->32), conv s1 (32->32), conv s2 (32->C1)
            layers = (conv_bn_relu(in_channels, 32, 2) + conv_bn_relu(32, 32, 1) +
                      conv_bn_relu(32, embed_dims, 2))
        else:
            layers = conv_bn_relu(in_channels, embed_dims, 2)
        self.proj = nn.Sequential(*layers)

    def forward(self, x):
        return self.proj(x)


def resize_pos_embed(pos_embed, grid, hw):
    """Learned (1, g·g, C) position embedding, bilinearly resized to the (H, W) grid."""
    C = pos_embed.shape[-1]
    pe = pos_embed.reshape(1, grid, grid, C).permute(0, 3, 1, 2)
    # Always resized (the identity at the training grid), so traced graphs stay dynamic.
    pe = F.interpolate(pe, size=hw, mode='bilinear', align_corners=False)
    return pe.flatten(2).transpose(1, 2)


@register_model()
class SOFT(Backbone):
    """SOFT backbone with attention normalization (IJCV 2024, the extension of NeurIPS 2021 SOFT).

    A four-stage pyramid (strides 4, 8, 16, 32). Stages 1–3 use softmax-free Gaussian-kernel
    attention through learned landmarks and a Newton–Raphson pseudo-inverse; stage 4 uses
    softmax attention, as all released models do.

    Args:
        arch (str | dict): 'tiny', 'small', 'medium', 'large', 'huge' (paper Table 2; the
            first letter works too) or a dict with ``embed_dims``, ``num_heads``,
            ``depths`` and optionally ``sr_ratios``.
        in_channels (int): input image channels.
        out_indices (int | Sequence[int]): stages (0–3; -1 is the last) whose maps are
            returned. Stages after the last index are not built.
        with_cls_token (bool): prepend the class token in stage 4, as in ImageNet training
            (so pretrained weights see what they were trained on).
        out_type (str): what stage 4 returns: 'featmap', the (B, C, H/32, W/32) map, or
            'cls_token', the normalized (B, C) class token (for ImageNet classification,
            as the official model classifies).
        newton_iters (int): Newton–Raphson steps T for the pseudo-inverse.
        attn_normalize (bool): attention normalization D^-1/2 A⁺ D^-1/2 (IJCV 2024 Eq. 25);
            False is the NeurIPS SOFT (paper Table 10 ablation).
        pinv_method (str): how the T-step Newton–Raphson iterate is computed, all with the
            same result up to rounding: 'auto' (default) takes the first variant of the
            device's plan that can run (``mmsoft.models.attention.PLANS``, chosen by
            measurements: on the CPU 'iterative' up to 128 landmarks, 'spectral' up to
            448 and 'tridiagonal' above, 'spectral' with gradients; on CUDA 'iterative'
            up to 196 and 'tf32' above); 'iterative' runs the matrix iterations in
            float32 (the reference), 'spectral' evaluates them through one
            eigendecomposition (CPU, CUDA), 'tridiagonal' applies the same filter through
            the kernel's tridiagonal form (CPU inference, SciPy), 'tf32' runs the middle
            steps with TF32 tensor-core products between float32 steps (the options of
            the plan's ``TF32`` variant; float32 only; emulated off CUDA). A variant forced
            where it cannot run raises with the reasons. 'regularized' is a fast mode
            that is *not* the iterate: a Tikhonov solve (A² + μI)⁻¹·A with
            μ = 1/(α·2^T) by one Cholesky factorization
            (``mmsoft.models.attention.regularized_apply``; deviation from the reference:
            docs/en/benchmarks.md).
        landmark_grid (int, optional): at most ``landmark_grid``² landmarks per head
            (queries are average-pooled before the landmark conv when the r×r windows
            would give more), so cost stays linear in the number of tokens. None (the
            default) keeps the paper's m = ⌊H/r⌋·⌊W/r⌋, which grows with the input.
        drop_rate (float): dropout after the position embedding.
        drop_path_rate (float): stochastic depth, increasing linearly over all blocks.
        norm_cfg (dict): norm of the convolutional patch embeddings.
        norm_eval (bool): keep the BatchNorm layers in eval mode while training (running
            statistics used and frozen), e.g. for small per-GPU batches or multi-process
            CPU training, where SyncBN is not available.
        frozen_stages (int): as in MMDetection's ResNet and Swin: 0 freezes (no grad,
            eval mode) the stem, stage 1's convolutional patch embedding and its position
            embedding; k >= 1 freezes the first k stages whole (patch embedding, position
            embedding and blocks; stage 4 also its final norm and class token); -1
            (default) freezes nothing.
        with_cp (bool): activation checkpointing of every block.
        cuda_graphs (bool | dict): opt-in, CUDA only: replay each stage's blocks from CUDA
            graphs (``mmsoft.models.cuda_graphs``), which removes the launch cost of their
            ~1200 small kernels per forward; the patch embeddings stay eager. True, or a
            dict with ``min_calls`` (capture an input size the n-th time it is seen,
            default 2) and ``max_graphs`` (at most so many sizes × train/eval modes per
            stage, default 4; further sizes run eagerly). Each graph keeps its
            activations' memory, so it suits fixed-size inputs (segmentation crops,
            fixed-size detection batches). Not with ``with_cp`` or
            ``pinv_method='spectral'`` (eigh synchronizes with the host). On other
            devices the blocks run eagerly, with a warning.
        pretrained (str, optional): deprecated, the same as ``init_cfg=dict(
            type='Pretrained', checkpoint=pretrained)``, with a warning.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads an
            official SOFT checkpoint or an mmengine checkpoint. Position embeddings
            pre-trained on another input size (another grid) are resized to this model's
            grids, bilinearly as at every forward, with a log line.
    """
    arch_zoo: Dict[str, dict] = {
        **dict.fromkeys(['t', 'tiny'], dict(
            embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16], depths=[1, 2, 3, 2])),
        **dict.fromkeys(['s', 'small'], dict(
            embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16], depths=[1, 3, 7, 4])),
        **dict.fromkeys(['m', 'medium'], dict(
            embed_dims=[64, 128, 288, 512], num_heads=[2, 4, 9, 16], depths=[1, 3, 29, 5])),
        **dict.fromkeys(['l', 'large'], dict(
            embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16], depths=[1, 3, 40, 5])),
        **dict.fromkeys(['h', 'huge'], dict(
            embed_dims=[64, 128, 352, 512], num_heads=[2, 4, 11, 16], depths=[1, 5, 49, 5])),
    }
    essential_keys = {'embed_dims', 'num_heads', 'depths'}
    # Position-embedding grids of ImageNet training (224² input), the released weights' shapes.
    pos_grids = (56, 28, 14, 7)
    dwconv_sizes = (9, 5, 3)  # depthwise conv on V, stages 1-3
    # The smallest input side for which stage 1 still holds one 8×8 landmark window
    # (⌈H / 4⌉ ≥ 8).
    min_input_size = 29

    def __init__(self,
                 arch='small',
                 in_channels=3,
                 out_indices=(0, 1, 2, 3),
                 with_cls_token=True,
                 out_type='featmap',
                 newton_iters=20,
                 attn_normalize=True,
                 pinv_method='auto',
                 landmark_grid=None,
                 drop_rate=0.,
                 drop_path_rate=0.1,
                 norm_cfg=dict(type='BN'),
                 norm_eval=False,
                 frozen_stages=-1,
                 with_cp=False,
                 cuda_graphs=False,
                 pretrained=None,
                 init_cfg=None):
        super().__init__(frozen_stages, norm_eval, with_cp, drop_path_rate, pretrained,
                         init_cfg)
        arch = parse_arch(arch, self.arch_zoo, self.essential_keys, 'SOFT',
                          optional_keys={'sr_ratios'})
        self.embed_dims = list(arch['embed_dims'])
        self.num_heads = list(arch['num_heads'])
        self.depths = list(arch['depths'])
        self.sr_ratios = list(arch.get('sr_ratios', [8, 4, 2, 1]))
        for name in ('embed_dims', 'num_heads', 'depths', 'sr_ratios'):
            if len(getattr(self, name)) != 4:
                raise ValueError(f'arch {name} must have 4 entries (one per stage), '
                                 f'got {getattr(self, name)}')
        for i, (c, h) in enumerate(zip(self.embed_dims, self.num_heads)):
            if c % h != 0:
                raise ValueError(f'arch embed_dims[{i}]={c} is not divisible by '
                                 f'num_heads[{i}]={h}')
        if self.sr_ratios[3] != 1:
            raise ValueError(f'stage 4 uses full softmax attention: sr_ratios[3] must be '
                             f'1, got {self.sr_ratios[3]}')
        self.out_indices = self._parse_out_indices(out_indices, 4, 'stage')
        self.num_stages = self.out_indices[-1] + 1
        self._check_frozen_stages(self.num_stages, 'stages')
        if pinv_method not in pinv_methods():
            raise ValueError(f'pinv_method must be one of {pinv_methods()}, got '
                             f'{pinv_method!r}')
        if landmark_grid is not None and landmark_grid < 1:
            raise ValueError(f'landmark_grid must be None or >= 1, got {landmark_grid}')
        if newton_iters < 1:
            raise ValueError(f'newton_iters must be >= 1, got {newton_iters}')
        if out_type not in ('featmap', 'cls_token'):
            raise ValueError(f"out_type must be 'featmap' or 'cls_token', got {out_type!r}")
        if out_type == 'cls_token' and not (with_cls_token and 3 in self.out_indices):
            raise ValueError("out_type='cls_token' needs with_cls_token=True and stage 3 "
                             'in out_indices')
        self.with_cls_token = with_cls_token
        self.out_type = out_type
        graphs = check_cuda_graphs(cuda_graphs, 'SOFT')
        if graphs is not None and with_cp:
            raise ValueError('SOFT: cuda_graphs and with_cp cannot be combined (activation '
                             "checkpointing saves the CUDA RNG state, which a capture "
                             'cannot read)')
        if graphs is not None and pinv_method != 'auto' and not all(
                v.capturable for v in plan_for('cuda').may_run(pinv_method)):
            raise ValueError(f'SOFT: cuda_graphs needs a pinv_method other than '
                             f'{pinv_method!r}: it reads values on the host (eigh '
                             'synchronizes a GPU with it), which a CUDA graph cannot capture')
        # a plain attribute, not a submodule: not in state_dict, dropped by deepcopy
        self.cuda_graphs = StageGraphs(**graphs) if graphs is not None else None
        self._warned_eager = False
        self.pinv_method = pinv_method

        total = sum(self.depths)
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, total)]
        attn_kwargs = dict(newton_iters=newton_iters, normalize=attn_normalize,
                           pinv_method=pinv_method, landmark_grid=landmark_grid)
        cur = 0
        cin = in_channels
        for s in range(self.num_stages):
            C, h, depth = self.embed_dims[s], self.num_heads[s], self.depths[s]
            setattr(self, f'patch_embed{s + 1}', PatchEmbed(cin, C, norm_cfg, stem=(s == 0)))
            n_pos = self.pos_grids[s]**2 + (1 if s == 3 else 0)
            setattr(self, f'pos_embed{s + 1}', nn.Parameter(torch.zeros(1, n_pos, C)))
            if s < 3:
                blocks = [SoftBlock(C, h, self.sr_ratios[s], self.dwconv_sizes[s],
                                    drop_path=dpr[cur + j], **attn_kwargs)
                          for j in range(depth)]
            else:
                blocks = [SoftmaxBlock(C, h, drop_path=dpr[cur + j]) for j in range(depth)]
            setattr(self, f'block{s + 1}', nn.ModuleList(blocks))
            cur += depth
            cin = C
        self.pos_drop = nn.Dropout(drop_rate)
        if self.num_stages == 4:
            if with_cls_token:
                self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dims[3]))
            self.norm = nn.LayerNorm(self.embed_dims[3], eps=1e-6)

    # -- Backbone hooks -----------------------------------------------------------------
    def _init_random(self):
        super()._init_random()
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                nn.init.normal_(m.weight, 0, math.sqrt(2.0 / fan_out))
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for s in range(self.num_stages):
            trunc_normal_(getattr(self, f'pos_embed{s + 1}'), std=.02)
        if getattr(self, 'cls_token', None) is not None:
            trunc_normal_(self.cls_token, std=.02)

    def adapt_checkpoint(self, state_dict):
        return checkpoint_filter_fn(state_dict, self)

    def _frozen_parts(self):
        """0: the stem (stage 1's patch and position embeddings); k: stages 1..k, each its
        patch embedding, position embedding and blocks (stage 4: also the final norm and
        the class token)."""
        if self.frozen_stages < 0:
            return [], []
        modules, params = [self.patch_embed1], [self.pos_embed1]
        for s in range(self.frozen_stages):
            if s > 0:
                modules.append(getattr(self, f'patch_embed{s + 1}'))
                params.append(getattr(self, f'pos_embed{s + 1}'))
            modules.append(getattr(self, f'block{s + 1}'))
            if s == 3:
                modules.append(self.norm)
                if self.with_cls_token:
                    params.append(self.cls_token)
        return modules, params

    def _apply(self, fn, *args, **kwargs):
        # .to(), .cuda(), .half() give the parameters new storage: graphs of the old
        # addresses would never replay again (the signature holds them), so free them
        if getattr(self, 'cuda_graphs', None) is not None:
            self.cuda_graphs.clear()
        return super()._apply(fn, *args, **kwargs)

    # -- forward ------------------------------------------------------------------------
    def _run_stage(self, s, x, hw):
        """Stage ``s``'s blocks on the (B, N, C) tokens of the ``hw`` grid: eagerly, or
        replayed from a CUDA graph with ``cuda_graphs``."""
        blocks = getattr(self, f'block{s + 1}')

        def eager(t):
            for blk in blocks:
                t = self._run_block(blk, t, hw)
            return t

        if self.cuda_graphs is None:
            return eager(x)
        if not can_capture(x):
            if not x.is_cuda and not self._warned_eager:
                self._warned_eager = True
                warnings.warn(f'SOFT: cuda_graphs has no effect on {x.device.type} inputs: '
                              'the blocks run eagerly')
            return eager(x)
        plan = plan_for(x.device.type)
        if not all(v.capturable for v in plan.may_run(self.pinv_method)):
            # a forced plan with eigh: not even tried, as a failed capture of cuSOLVER's
            # syevd left its later eager calls failing (CUSOLVER_STATUS_EXECUTION_FAILED)
            if not self._warned_eager:
                self._warned_eager = True
                warnings.warn("SOFT: cuda_graphs: the attention plan in force runs 'spectral' "
                              '(eigh synchronizes with the host, which a CUDA graph cannot '
                              'capture): the blocks run eagerly')
            return eager(x)
        return self.cuda_graphs.run(s, eager, x, blocks, extra=(hw, plan))

    def forward(self, x):
        self._check_input(x)
        outs = []
        B = x.shape[0]
        for s in range(self.num_stages):
            x = getattr(self, f'patch_embed{s + 1}')(x)
            H, W = x.shape[-2:]
            x = x.flatten(2).transpose(1, 2)
            pos = getattr(self, f'pos_embed{s + 1}')
            if s == 3:
                spatial = resize_pos_embed(pos[:, 1:], self.pos_grids[s], (H, W))
                x = x + spatial
                if self.with_cls_token:
                    cls = self.cls_token.expand(B, -1, -1) + pos[:, :1]
                    x = torch.cat([cls, x], dim=1)
            else:
                x = x + resize_pos_embed(pos, self.pos_grids[s], (H, W))
            x = self.pos_drop(x)
            x = self._run_stage(s, x, (H, W))
            if s == 3:
                x = self.norm(x)
                if self.out_type == 'cls_token':
                    outs.append(x[:, 0])
                    break
                if self.with_cls_token:
                    x = x[:, 1:]
            x = x.transpose(1, 2).reshape(B, -1, H, W)
            if s in self.out_indices:
                outs.append(x)
        return tuple(outs)


def resize_checkpoint_pos_embeds(state_dict, model):
    """``pos_embed1``–``pos_embed4`` of a checkpoint pre-trained on another input size
    (e.g. 384²: grids 96, 48, 24, 12) resized to ``model.pos_grids``, bilinearly as the
    forward resizes them to each input; stage 4's leading class-token position is kept
    as it is. Returns a new dict; each resize is logged."""
    out = dict(state_dict)
    for s, grid in enumerate(model.pos_grids):
        key = f'pos_embed{s + 1}'
        pos = out.get(key)
        lead = 1 if s == 3 else 0
        if pos is None or pos.dim() != 3 or pos.shape[1] == grid * grid + lead:
            continue
        n = pos.shape[1] - lead
        side = math.isqrt(n)
        if side * side != n:
            raise ValueError(f'SOFT checkpoint {key} holds {n} spatial positions, not a '
                             f'square grid: it cannot be resized to {grid}×{grid}')
        spatial = resize_pos_embed(pos[:, lead:].float(), side, (grid, grid)).to(pos.dtype)
        out[key] = torch.cat([pos[:, :lead], spatial], dim=1)
        print_log(f'SOFT: {key} resized from the checkpoint\'s {side}×{side} grid to '
                  f'{grid}×{grid} (pre-trained on another input size)', logger='current',
                  level=logging.INFO)
    return out


def checkpoint_filter_fn(state_dict, model=None):
    """Adapt an official SOFT state dict: drop the classification head. Given a ``model``,
    also drop the stages it does not build (``out_indices`` ending before stage 4), check
    that the built stages' depths agree, before any weight is copied, and resize position
    embeddings of another pre-training size (``resize_checkpoint_pos_embeds``)."""
    out = {k: v for k, v in state_dict.items() if not k.startswith('head.')}
    if model is None:
        return out
    ckpt_depths = []
    for s in range(4):
        ids = {int(k.split('.')[1]) for k in out if k.startswith(f'block{s + 1}.')}
        ckpt_depths.append(max(ids) + 1 if ids else 0)
    n = model.num_stages
    check_depths(ckpt_depths[:n], model.depths[:n], 'SOFT')
    if n < 4:
        unbuilt = tuple(f'{name}{s + 1}' for s in range(n, 4)
                        for name in ('patch_embed', 'pos_embed', 'block'))
        unbuilt += ('cls_token', 'norm')
        dropped = [k for k in out if k.split('.')[0] in unbuilt]
        if dropped:
            print_log(f'SOFT: stages {n + 1}-4 of the checkpoint are not built (out_indices '
                      f'end at stage {n - 1}): their {len(dropped)} tensors are ignored',
                      logger='current', level=logging.INFO)
        out = {k: v for k, v in out.items() if k.split('.')[0] not in unbuilt}
    return resize_checkpoint_pos_embeds(out, model)
