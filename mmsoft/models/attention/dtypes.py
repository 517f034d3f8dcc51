"""Where the attention of both families computes: the dtype of its small products and
the device type autocast knows a tensor by. No per-device choices here (``plan.py``)."""
import torch

__all__ = ['compute_dtype', 'device_type']


def device_type(t):
    """The autocast device type of a tensor (autocast knows cpu, cuda, xpu, mps)."""
    return t.device.type if t.device.type in ('cuda', 'cpu', 'xpu', 'mps') else 'cpu'


def compute_dtype(t):
    """The dtype the attention's small products run in: float64 for float64, else
    float32 (also for half-precision and autocast inputs)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32
