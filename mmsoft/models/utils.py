"""What the backbone families share: the ``Backbone`` base class (initialization,
pretrained loading, freezing, ``norm_eval``, activation checkpointing), arch parsing,
the MLP and input checks. Reading checkpoints and
matching their keys is ``mmsoft.checkpoint``'s."""
import warnings

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks import DropPath
from mmengine.model import BaseModule
from mmengine.model.weight_init import initialize, trunc_normal_
from torch.nn.modules.batchnorm import _BatchNorm

from ..checkpoint import load_pretrained
from .attention.dtypes import is_compiling

__all__ = [
    'Backbone', 'DropPath', 'Mlp', 'build_norm', 'check_depths', 'check_input',
    'eval_batch_norms', 'is_int', 'parse_arch'
]


class Mlp(nn.Module):
    """``fc1`` -> GELU (exact) -> ``fc2``: the MLP of SOFT's stage 4 and of XCiT blocks."""

    def __init__(self, embed_dims, hidden_dims):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dims, embed_dims)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def parse_arch(arch, arch_zoo, essential_keys, family, optional_keys=()):
    """An arch name (case-insensitive) or dict -> a settings dict (a copy).

    An unknown name lists the known ones; a dict missing an essential key, or with a key
    that would be ignored (a typo), lists what is required and what is allowed.
    """
    if isinstance(arch, str):
        key = arch.lower()
        if key not in arch_zoo:
            raise ValueError(f'Unknown {family} arch {arch!r}; choose from '
                             f'{sorted(arch_zoo)} or pass a dict')
        return dict(arch_zoo[key])
    essential, optional = set(essential_keys), set(optional_keys)
    extra = sorted(set(arch) - essential - optional) if isinstance(arch, dict) else []
    if not isinstance(arch, dict) or not essential <= set(arch) or extra:
        problem = (f'unknown keys {extra}' if extra else f'got {arch!r}')
        raise ValueError(f'Custom {family} arch needs a dict with keys '
                         f'{sorted(essential)}' +
                         (f' (optional: {sorted(optional)})' if optional else '') +
                         f'; {problem}')
    return dict(arch)


def is_int(value):
    """An int and not a bool (``True`` is an int to Python, never an index or a count
    to a config)."""
    return isinstance(value, int) and not isinstance(value, bool)


def build_norm(norm_cfg, num_features):
    """Build a norm layer from an mmcv config (``dict(type='BN')``, ``'SyncBN'``, ...)."""
    return build_norm_layer(norm_cfg, num_features)[1]


def check_input(x, min_size, family):
    """Reject what would otherwise fail deep inside the network, or silently spread NaN
    through the Newton–Raphson iterations: wrong rank, too small, non-finite values
    (the last on CPU only: see below)."""
    if x.dim() != 4:
        raise ValueError(f'{family} expects a (B, C, H, W) batch, got shape '
                         f'{tuple(x.shape)}')
    if min(x.shape[-2:]) < min_size:
        raise ValueError(f'{family} needs inputs of at least {min_size}×{min_size} pixels, '
                         f'got {tuple(x.shape[-2:])}')
    # The finiteness check reads a value back from the device: on a GPU that is a
    # host-device synchronization in every forward (and a graph break for torch.compile,
    # illegal inside CUDA-graph capture), so it runs on CPU tensors only.
    if (x.device.type != 'cpu' or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
            or is_compiling()):
        return
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f'{family} input contains NaN or inf values')


def check_depths(ckpt_depths, model_depths, family):
    """Raise a ValueError naming the mismatch if a checkpoint's depths differ from ours."""
    if list(ckpt_depths) != list(model_depths):
        raise ValueError(f'{family} checkpoint has depths {list(ckpt_depths)} but the model '
                         f'arch has depths {list(model_depths)}: choose the arch the '
                         f'checkpoint was trained with')


def eval_batch_norms(module):
    """Put every BatchNorm layer of ``module`` in eval mode: normalize with the running
    statistics and stop updating them (``norm_eval=True`` of mmdet backbones)."""
    for m in module.modules():
        if isinstance(m, _BatchNorm):
            m.eval()


class Backbone(BaseModule):
    """Base of the mmsoft backbones: what ``init_weights``, ``train`` and activation
    checkpointing do, and the checks of the arguments every family has, are the same for
    every family (MMDetection's Swin/PVT habits).

    A subclass sets ``min_input_size``, calls ``_parse_out_indices`` and, once it knows
    how many stages (or blocks) it builds, ``_check_frozen_stages``, and overrides
    ``adapt_checkpoint`` (its official checkpoints -> its own keys), ``_frozen_parts``
    and, to add to it, ``_init_random``.

    Args:
        frozen_stages (int): what ``_frozen_parts`` freezes; -1 freezes nothing.
        norm_eval (bool): keep the BatchNorm layers in eval mode while training.
        with_cp (bool): activation checkpointing of every block.
        drop_path_rate (float): stochastic depth rate, in [0, 1).
        pretrained (str, optional): deprecated, as in MMDetection's and MMSegmentation's
            backbones: a checkpoint path, the same as
            ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)`` (with a warning).
        init_cfg (dict | list[dict], optional): mmengine initializers; ``Pretrained``
            loads a checkpoint last.
    """
    min_input_size = 1

    def __init__(self, frozen_stages=-1, norm_eval=False, with_cp=False, drop_path_rate=0.,
                 pretrained=None, init_cfg=None):
        family = type(self).__name__
        if pretrained is not None:
            if init_cfg is not None:
                raise ValueError(f'{family}: init_cfg and pretrained cannot both be set '
                                 '(pretrained is the deprecated form of init_cfg)')
            if not isinstance(pretrained, str):
                raise TypeError(f'{family}: pretrained must be a checkpoint path (str) or '
                                f'None, got {type(pretrained).__name__}')
            warnings.warn(f'{family}: pretrained is deprecated, use init_cfg=dict('
                          f"type='Pretrained', checkpoint={pretrained!r}) instead")
            init_cfg = dict(type='Pretrained', checkpoint=pretrained)
        super().__init__(init_cfg=init_cfg)
        if not is_int(frozen_stages) or frozen_stages < -1:
            raise ValueError(f'{family}: frozen_stages must be an int >= -1, got '
                             f'{frozen_stages!r}')
        if not isinstance(drop_path_rate, (int, float)) or not 0 <= drop_path_rate < 1:
            raise ValueError(f'{family}: drop_path_rate must be in [0, 1), got '
                             f'{drop_path_rate!r}')
        for name, value in (('norm_eval', norm_eval), ('with_cp', with_cp)):
            if not isinstance(value, bool):
                raise ValueError(f'{family}: {name} must be True or False, got {value!r}')
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp
        self.drop_path_rate = float(drop_path_rate)

    # -- argument checks ----------------------------------------------------------------
    def _parse_out_indices(self, out_indices, num, what, hint=None):
        """``out_indices`` (an int, or a list or tuple of ints) as a sorted tuple of
        distinct indices of ``what`` in [0, ``num`` - 1]; a negative index counts from the
        end (-1: the last), as in MMDetection's and MMPretrain's backbones. ``hint``, if
        given, is called with the bad value and may return a sentence to add to the
        error."""
        indices = ([out_indices] if is_int(out_indices) else
                   list(out_indices) if isinstance(out_indices, (list, tuple)) else None)
        valid = (bool(indices) and all(is_int(i) and -num <= i < num for i in indices)
                 and len({i % num for i in indices}) == len(indices))
        if not valid:
            extra = hint(out_indices) if hint is not None else None
            raise ValueError(f'{type(self).__name__}: out_indices must be an int or a list '
                             f'or tuple of distinct {what} indices in [0, {num - 1}] '
                             f'(negative ones count from the end), got {out_indices!r}'
                             + (f'. {extra}' if extra else ''))
        return tuple(sorted(i % num for i in indices))

    def _check_frozen_stages(self, built, what):
        """``frozen_stages`` at most ``built``, the number of ``what`` built."""
        if self.frozen_stages > built:
            raise ValueError(f'{type(self).__name__}: frozen_stages must be in [-1, {built}] '
                             f'(the number of built {what}), got {self.frozen_stages}')

    # -- initialization -----------------------------------------------------------------
    def _init_random(self):
        """Random initialization (ViT/timm habits): truncated-normal linear weights, zero
        biases, unit LayerNorms. Subclasses add their own parameters."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def init_weights(self):
        """The random initialization, then mmengine initializers of ``init_cfg`` and last
        a ``Pretrained`` checkpoint (through ``adapt_checkpoint``), so that whatever
        the checkpoint does not hold keeps a deliberate initialization."""
        cfgs = self.init_cfg or []
        cfgs = [cfgs] if isinstance(cfgs, dict) else list(cfgs)
        pretrained = [c for c in cfgs if c.get('type') == 'Pretrained']
        others = [c for c in cfgs if c.get('type') != 'Pretrained']
        self._init_random()
        if others:
            initialize(self, others)
        for cfg in pretrained:
            load_pretrained(self, cfg['checkpoint'], self.adapt_checkpoint,
                            prefix=cfg.get('prefix'))
        self._is_init = True

    def adapt_checkpoint(self, state_dict):
        """A checkpoint's state dict -> this model's keys (the family's filter)."""
        return state_dict

    # -- freezing -----------------------------------------------------------------------
    def _frozen_parts(self):
        """(modules, parameters) frozen by ``frozen_stages``."""
        return [], []

    def _freeze_stages(self):
        modules, params = self._frozen_parts()
        for m in modules:
            m.eval()
            params.extend(m.parameters())
        for p in params:
            p.requires_grad = False

    def train(self, mode=True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            eval_batch_norms(self)
        return self

    # -- forward helpers ----------------------------------------------------------------
    def _check_input(self, x):
        check_input(x, self.min_input_size, type(self).__name__)

    def _run_block(self, block, x, *args):
        """``block(x, *args)``, activation-checkpointed with ``with_cp`` whenever autograd
        records: the block's activations are recomputed in the backward pass instead of
        kept. The non-reentrant checkpoint also covers a block whose input needs no
        gradient but whose parameters do (the first trainable block after frozen ones)."""
        if self.with_cp and torch.is_grad_enabled():
            return cp.checkpoint(block, x, *args, use_reentrant=False)
        return block(x, *args)
