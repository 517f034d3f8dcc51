"""What the backbone families share: the ``Backbone`` base class (initialization,
pretrained loading, freezing, ``norm_eval``, activation checkpointing), arch parsing,
the MLP, input checks and checkpoint loading."""
import logging
import re

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks import DropPath
from mmengine.logging import MMLogger, print_log
from mmengine.model import BaseModule
from mmengine.model.weight_init import initialize, trunc_normal_
from mmengine.runner.checkpoint import CheckpointLoader
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = [
    'Backbone', 'DropPath', 'Mlp', 'build_norm', 'check_depths', 'check_input',
    'eval_batch_norms', 'extract_state_dict', 'load_pretrained', 'parse_arch',
    'summarize_keys'
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
            or torch.compiler.is_compiling()):
        return
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f'{family} input contains NaN or inf values')


def check_depths(ckpt_depths, model_depths, family):
    """Raise a ValueError naming the mismatch if a checkpoint's depths differ from ours."""
    if list(ckpt_depths) != list(model_depths):
        raise ValueError(f'{family} checkpoint has depths {list(ckpt_depths)} but the model '
                         f'arch has depths {list(model_depths)}: choose the arch the '
                         f'checkpoint was trained with')


# Where the weights sit in the checkpoint formats users bring, in order of preference:
# timm training checkpoints (``state_dict_ema`` is what evaluation uses), mmengine,
# official XCiT / SimA files.
STATE_DICT_ENTRIES = ('state_dict_ema', 'state_dict', 'model')
# Prefixes that ``prefix=`` is suggested for when a checkpoint matches nothing.
COMMON_PREFIXES = ('module.', 'backbone.', 'model.', 'encoder.', 'student.', 'teacher.')


def _unwrap(checkpoint):
    """(state dict, name of the entry it came from or None)."""
    if isinstance(checkpoint, dict):
        for key in STATE_DICT_ENTRIES:
            if isinstance(checkpoint.get(key), dict):
                return checkpoint[key], key
    if not isinstance(checkpoint, dict):
        raise ValueError(f'checkpoint holds no state dict (got {type(checkpoint).__name__})')
    return checkpoint, None


def _strip_module(key):
    return key[len('module.'):] if key.startswith('module.') else key


def _select(state, prefix=None):
    """(the backbone's entries, the prefix used, the keys left outside it)."""
    state = {_strip_module(k): v for k, v in state.items()}
    if prefix is None and any(k.startswith('backbone.') for k in state):
        prefix = 'backbone.'
    if not prefix:
        return state, None, []
    prefix = _strip_module(prefix)
    prefix = prefix if prefix.endswith('.') else prefix + '.'
    inside = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return inside, prefix, [k for k in state if not k.startswith(prefix)]


def extract_state_dict(checkpoint, prefix=None):
    """The backbone weights of a checkpoint in any of the formats users bring.

    - timm training checkpoints: ``state_dict_ema`` (what evaluation uses), else
      ``state_dict``;
    - official XCiT / SimA files: ``{'model': ...}``;
    - mmengine checkpoints of whole detectors / segmentors: keys under ``backbone.``;
    - plain state dicts. A ``module.`` prefix (DataParallel) is removed, then ``prefix``
      (when given) selects and strips the entries under it.
    """
    return _select(_unwrap(checkpoint)[0], prefix)[0]


def _examples(keys, n=4):
    """Up to n keys spread over ``keys`` (first, last and between), in their order."""
    keys = list(keys)
    if len(keys) <= n:
        return keys
    return [keys[round(i * (len(keys) - 1) / (n - 1))] for i in range(n)]


def _index_ranges(ids):
    """[0, 1, 2, 5] -> '{0-2,5}'; [3] -> '3'."""
    ids, parts = sorted(ids), []
    for i in ids:
        if parts and i == parts[-1][1] + 1:
            parts[-1][1] = i
        else:
            parts.append([i, i])
    text = ','.join(str(a) if a == b else f'{a}-{b}' for a, b in parts)
    return text if len(ids) == 1 else '{' + text + '}'


def summarize_keys(keys, all_keys=()):
    """A short description of ``keys``, a subset of the state dict ``all_keys``: a whole
    top-level module as ``'head.*'``, whole numbered blocks as ``'blocks.{8-11}.*'``, the
    rest with their indices starred (``'blocks.*.attn.temperature'``)."""
    keys = set(keys)
    # BatchNorm fills in a missing num_batches_tracked itself: never reported missing.
    universe = {k for k in all_keys if not k.endswith('num_batches_tracked')} | keys

    def under(prefix):
        return {k for k in universe if k == prefix or k.startswith(prefix + '.')}

    out, rest = [], set(keys)
    for top in sorted({k.split('.')[0] for k in keys}):
        if under(top) <= keys:
            out.append(top if under(top) == {top} else top + '.*')
            rest -= under(top)
    blocks = {}
    for k in sorted(rest):
        parts = k.split('.')
        if len(parts) > 2 and parts[1].isdigit() and under('.'.join(parts[:2])) <= rest:
            blocks.setdefault(parts[0], set()).add(int(parts[1]))
    for top, ids in sorted(blocks.items()):
        out.append(f'{top}.{_index_ranges(ids)}.*')
        rest -= {k for i in ids for k in under(f'{top}.{i}')}
    out += sorted({re.sub(r'(?<=\.)\d+(?=\.|$)', '*', k) for k in rest})
    return out


def _guess_prefix(found, expected):
    """The prefix that, stripped from the found keys, gives expected keys; else None."""
    counts = {}
    for k in found:
        parts = k.split('.')
        for j in range(1, min(4, len(parts))):
            if '.'.join(parts[j:]) in expected:
                p = '.'.join(parts[:j]) + '.'
                counts[p] = counts.get(p, 0) + 1
                break
    return max(counts, key=counts.get) if counts else None


def _no_match_message(model, path, raw_keys, state, prefix, source):
    """Why a checkpoint fits none of ``model``'s parameters, and what would fix it."""
    name = type(model).__name__
    expected = [k for k, _ in model.named_parameters()]
    where = f" (entry '{source}')" if source else ''
    msg = (f'{name}: checkpoint {path}{where} matches none of the model\'s '
           f'{len(expected)} parameters')
    nested = sorted(k for k, v in state.items() if isinstance(v, dict))
    guess = _guess_prefix(raw_keys, set(expected))
    if nested:
        msg += (f'. Its state dict nests further dicts under {nested[:4]}: the weights are '
                f'probably one level down')
    elif guess is not None:
        msg += (f". Its keys carry the prefix '{guess}' (e.g. "
                f"'{next(k for k in raw_keys if k.startswith(guess))}'): pass "
                f"init_cfg=dict(type='Pretrained', checkpoint=..., prefix='{guess}')")
    elif prefix:
        msg += f" under the prefix '{prefix}'"
    common = sorted({p for p in COMMON_PREFIXES for k in raw_keys if k.startswith(p)})
    if common and guess is None:
        msg += f'. Its keys start with {common}'
    return (f'{msg}. Expected keys like {_examples(expected)}; found keys like '
            f'{_examples(raw_keys)}')


def load_pretrained(model, path, filter_fn=None, prefix=None, logger='current',
                    min_fraction=0.5):
    """Load ``path`` into ``model`` through ``filter_fn(state_dict)``.

    Fails (ValueError) when the checkpoint fits none of the model's parameters (naming
    expected and found keys, and a prefix or nesting that would explain it), when a shape
    differs (naming the first mismatching parameter) and when less than ``min_fraction``
    of the model's parameter elements would be loaded. One INFO line says what was loaded,
    which checkpoint keys were ignored (classification head, ...) and which parameters
    the checkpoint did not hold. Loading keeps torch's ``weights_only`` protection (see
    ``mmsoft.checkpoint``).
    """
    name = type(model).__name__
    log = MMLogger.get_current_instance() if logger == 'current' else logger
    checkpoint = CheckpointLoader.load_checkpoint(path, map_location='cpu', logger=logger)
    raw, source = _unwrap(checkpoint)
    state, used_prefix, outside = _select(raw, prefix)
    own = model.state_dict()
    params = dict(model.named_parameters())
    if not any(k in params for k in state):
        raise ValueError(_no_match_message(model, path, list(raw), raw, used_prefix,
                                           source))
    kept = filter_fn(state) if filter_fn is not None else state
    for k, v in kept.items():
        if k in own and tuple(own[k].shape) != tuple(v.shape):
            raise ValueError(f'{name}: checkpoint {path} does not match the arch: '
                             f'parameter {k} has shape {tuple(v.shape)} in the checkpoint '
                             f'but {tuple(own[k].shape)} in the model')
    total = sum(p.numel() for p in params.values())
    loaded = sum(p.numel() for k, p in params.items() if k in kept)
    if loaded < min_fraction * total:
        missing = [k for k in own if k not in kept]
        raise ValueError(f'{name}: checkpoint {path} holds only {loaded / total:.0%} of the '
                         f"model's parameter values (at least {min_fraction:.0%} expected); "
                         f'missing: {summarize_keys(missing, own)}; the checkpoint has keys '
                         f'like {_examples(state)}')
    missing, unexpected = model.load_state_dict(kept, strict=False)
    used = set(kept) - set(unexpected)
    ignored = [k for k in state if k not in used]
    summary = [(used_prefix or '') + p for p in summarize_keys(ignored, state)]
    summary += summarize_keys(outside, outside)
    where = f" ('{source}')" if source else ''
    print_log(f'{name}: loaded {len(used)} of {len(state) + len(outside)} tensors from '
              f'{path}{where}; ignored checkpoint keys: {summary or "none"}; not in the '
              f'checkpoint (initialized): {summarize_keys(missing, own) or "none"}',
              logger=log, level=logging.INFO)
    return missing, [(used_prefix or '') + k for k in ignored] + outside


def eval_batch_norms(module):
    """Put every BatchNorm layer of ``module`` in eval mode: normalize with the running
    statistics and stop updating them (``norm_eval=True`` of mmdet backbones)."""
    for m in module.modules():
        if isinstance(m, _BatchNorm):
            m.eval()


class Backbone(BaseModule):
    """Base of the mmsoft backbones: what ``init_weights``, ``train`` and activation
    checkpointing do is the same for every family (MMDetection's Swin/PVT habits).

    A subclass sets ``min_input_size`` and overrides ``adapt_checkpoint`` (its official
    checkpoints -> its own keys), ``_frozen_parts`` and, to add to it, ``_init_random``.
    """
    min_input_size = 1

    def __init__(self, frozen_stages=-1, norm_eval=False, with_cp=False, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp

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
        """``block(x, *args)``, activation-checkpointed when ``with_cp`` and training."""
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(block, x, *args, use_reentrant=False)
        return block(x, *args)
