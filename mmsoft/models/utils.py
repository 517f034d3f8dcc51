"""Helpers shared by the backbone families: norm building, drop path, checkpoint loading."""
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks import DropPath
from mmengine.logging import MMLogger, print_log
from mmengine.runner.checkpoint import CheckpointLoader

import torch

__all__ = [
    'DropPath', 'build_norm', 'check_depths', 'check_input', 'extract_state_dict',
    'load_pretrained'
]


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


def extract_state_dict(checkpoint, prefix=None):
    """The backbone weights of a checkpoint in any of the formats users bring.

    - timm training checkpoints: ``state_dict_ema`` (what evaluation uses), else
      ``state_dict``;
    - official XCiT / SimA files: ``{'model': ...}``;
    - mmengine checkpoints of whole detectors / segmentors: keys under ``backbone.``;
    - plain state dicts. A ``module.`` prefix (DataParallel) is removed.
    """
    state = checkpoint
    if isinstance(checkpoint, dict):
        for key in ('state_dict_ema', 'state_dict', 'model'):
            if isinstance(checkpoint.get(key), dict):
                state = checkpoint[key]
                break
    if not isinstance(state, dict):
        raise ValueError(f'checkpoint holds no state dict (got {type(state).__name__})')
    state = {(k[7:] if k.startswith('module.') else k): v for k, v in state.items()}
    if prefix is None and any(k.startswith('backbone.') for k in state):
        prefix = 'backbone.'
    if prefix:
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return state


def load_pretrained(model, path, filter_fn, prefix=None, logger='current'):
    """Load ``path`` into ``model`` through ``filter_fn(state_dict, model)``.

    Shape mismatches fail with the first mismatching parameter named; missing and ignored
    keys are reported in one log line. Loading keeps torch's ``weights_only`` protection
    (see ``mmsoft.checkpoint``).
    """
    checkpoint = CheckpointLoader.load_checkpoint(path, map_location='cpu', logger=logger)
    state = filter_fn(extract_state_dict(checkpoint, prefix), model)
    own = model.state_dict()
    for k, v in state.items():
        if k in own and tuple(own[k].shape) != tuple(v.shape):
            raise ValueError(f'{type(model).__name__}: checkpoint {path} does not match the '
                             f'arch: parameter {k} has shape {tuple(v.shape)} in the '
                             f'checkpoint but {tuple(own[k].shape)} in the model')
    missing, unexpected = model.load_state_dict(state, strict=False)
    print_log(f'{type(model).__name__}: loaded {len(state) - len(unexpected)} tensors from '
              f'{path}; missing keys: {missing or "none"}; ignored keys: '
              f'{unexpected or "none"}', logger=MMLogger.get_current_instance()
              if logger == 'current' else logger)
    return missing, unexpected


def eval_batch_norms(module):
    """Put every BatchNorm layer of ``module`` in eval mode: normalize with the running
    statistics and stop updating them (``norm_eval=True`` of mmdet backbones)."""
    from torch.nn.modules.batchnorm import _BatchNorm
    for m in module.modules():
        if isinstance(m, _BatchNorm):
            m.eval()
