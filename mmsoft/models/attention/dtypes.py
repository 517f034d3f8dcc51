"""Where the attention of both families computes: the dtype of its small products, the
device type and dtype autocast knows, and whether torch.compile is tracing it (under the
names of every torch from 2.1 on). No per-device choices here (``plan.py``)."""
import torch

__all__ = ['autocast_dtype', 'compute_dtype', 'device_type', 'is_compiling']


def device_type(t):
    """The autocast device type of a tensor (autocast knows cpu, cuda, xpu, mps)."""
    return t.device.type if t.device.type in ('cuda', 'cpu', 'xpu', 'mps') else 'cpu'


def compute_dtype(t):
    """The dtype the attention's small products run in: float64 for float64, else
    float32 (also for half-precision and autocast inputs)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def autocast_dtype(device):
    """The dtype autocast casts to on ``device`` ('cuda', 'cpu', ...), None where it is
    off. torch < 2.4 has per-device functions instead of the device argument."""
    if hasattr(torch, 'get_autocast_dtype'):
        return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    if device == 'cuda':
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    if device == 'cpu':
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return None


def is_compiling():
    """Whether torch.compile is tracing the caller (``torch.compiler.is_compiling`` from
    torch 2.3 on, ``torch._dynamo.is_compiling`` before)."""
    compiler = getattr(torch, 'compiler', None)
    if hasattr(compiler, 'is_compiling'):
        return compiler.is_compiling()
    from torch import _dynamo  # torch 2.1 imports it lazily
    return _dynamo.is_compiling()
