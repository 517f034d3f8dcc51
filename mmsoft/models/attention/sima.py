"""SimA (the SimA paper's attention): softmax-free, with L1-normalized queries and keys."""
import torch
import torch.nn.functional as F

from .dtypes import compute_dtype, device_type

__all__ = ['sima_attention']


def sima_attention(q, k, v, order='auto'):
    """SimA: L1-normalize q and k over the token axis, then (q̂·k̂ᵀ)·v without softmax.

    The products always run in (at least) float32, also under autocast, and the result
    stays float32: its magnitude shrinks like d/N and would underflow half precision at
    detection resolutions.

    Args:
        q, k, v (Tensor): (..., N, d)
        order (str): 'auto' picks the cheaper product — (q̂·k̂ᵀ)·v if N < d, else
            q̂·(k̂ᵀ·v) — as the official code does; 'qk_first' / 'kv_first' force one.
    Returns:
        Tensor: (..., N, d), float32 (float64 for float64 inputs).
    """
    if order not in ('auto', 'qk_first', 'kv_first'):
        raise ValueError(f"order must be 'auto', 'qk_first' or 'kv_first', got {order!r}")
    with torch.autocast(device_type=device_type(q), enabled=False):
        dtype = compute_dtype(q)
        q = F.normalize(q.to(dtype), p=1, dim=-2)
        k = F.normalize(k.to(dtype), p=1, dim=-2)
        v = v.to(dtype)
        N, d = q.shape[-2], q.shape[-1]
        if order == 'qk_first' or (order == 'auto' and N < d):
            out = (q @ k.transpose(-1, -2)) @ v
        else:
            out = q @ (k.transpose(-1, -2) @ v)
    return out
