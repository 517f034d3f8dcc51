"""Multi-process training and testing on CPUs (torchrun, gloo backend).

mmengine 0.10 assumes a GPU per process when a launcher is given: its ``init_dist`` calls
``torch.cuda.set_device`` and its default model wrapper passes ``device_ids`` to
DistributedDataParallel, which DDP refuses for a CPU module. ``setup_cpu_distributed``
(called by tools/train.py and tools/test.py when CUDA is absent) opens the gloo process
group itself, so mmengine skips its own initialization, and selects
``CPUDistributedDataParallel``. BatchNorm cannot be synchronized on CPUs (torch's
SyncBatchNorm needs a GPU): use ``norm_eval=True`` (frozen BN) there.
"""
from datetime import timedelta

import torch
import torch.distributed as dist
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS

from .registry import register_in

__all__ = ['CPUDistributedDataParallel', 'setup_cpu_distributed']


class CPUDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` for a model on the CPU: no ``device_ids``."""

    def __init__(self, module, device_ids=None, **kwargs):
        # mmengine's Runner passes device_ids=[LOCAL_RANK] to every DDP wrapper.
        super().__init__(module=module, device_ids=None, **kwargs)


register_in(MODEL_WRAPPERS, CPUDistributedDataParallel)


def setup_cpu_distributed(cfg):
    """Prepare ``cfg`` (launcher already set) for a multi-process run without CUDA.

    Returns:
        bool: whether anything was changed (False with CUDA or without a launcher).
    """
    launcher = cfg.get('launcher', 'none')
    if launcher == 'none' or torch.cuda.is_available():
        return False
    if launcher != 'pytorch':
        raise ValueError(f'multi-process runs without CUDA support --launcher pytorch '
                         f'(torchrun, gloo backend) only, got --launcher {launcher}')
    dist_cfg = cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})
    dist_cfg['backend'] = 'gloo'
    if not dist.is_initialized():
        # torchrun's environment (MASTER_ADDR, RANK, WORLD_SIZE, ...) gives the rendezvous.
        dist.init_process_group('gloo', timeout=timedelta(seconds=dist_cfg.get(
            'timeout', 1800)))
    wrapper = dict(cfg.get('model_wrapper_cfg') or {})
    if wrapper.get('type', 'MMDistributedDataParallel') not in (
            'MMDistributedDataParallel', 'CPUDistributedDataParallel'):
        raise ValueError(f"model_wrapper_cfg type {wrapper['type']!r} cannot run on CPUs "
                         '(use the default MMDistributedDataParallel)')
    wrapper['type'] = 'CPUDistributedDataParallel'
    # The same defaults as mmengine's own DDP wrapping.
    wrapper.setdefault('broadcast_buffers', False)
    wrapper.setdefault('find_unused_parameters', cfg.get('find_unused_parameters', False))
    cfg.model_wrapper_cfg = wrapper
    return True
