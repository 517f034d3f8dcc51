"""Where the attention of both families computes: the dtype of its small products, the
device type and dtype autocast knows, the float32 precision of matmuls and convolutions,
and whether torch.compile is tracing it (under the names of every torch from 2.1 on). No
per-device choices here (``plan.py``)."""
import torch

__all__ = ['autocast_dtype', 'compute_dtype', 'device_type', 'float32_precision',
           'is_compiling', 'new_tf32_flags']


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


def float32_precision():
    """The float32 precision settings of matmuls and convolutions (TF32 or not), as a
    tuple to compare. torch >= 2.9 has per-backend ``fp32_precision`` flags, and reading
    the older ones (``torch.get_float32_matmul_precision``, ``cudnn.allow_tf32``) raises
    there once a program has set the new ones; older torch has only those."""
    backends = torch.backends
    if new_tf32_flags():
        return (backends.fp32_precision, backends.cuda.matmul.fp32_precision,
                backends.cudnn.conv.fp32_precision, backends.cudnn.rnn.fp32_precision)
    return (torch.get_float32_matmul_precision(), backends.cudnn.allow_tf32)


def new_tf32_flags():
    """Whether this torch has the per-backend ``fp32_precision`` flags (torch >= 2.9).
    Asked of ``torch.backends`` itself: torch 2.1's ``torch.backends.cuda.matmul``
    answers an unknown attribute with an AssertionError, which ``hasattr`` lets through."""
    return hasattr(torch.backends, 'fp32_precision')
