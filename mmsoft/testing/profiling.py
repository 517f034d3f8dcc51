"""Counting what a forward asks of a GPU's host: operators launched, host-device copies.

``LaunchCounter`` works on any device, also PyTorch's data-less meta device, where
``attention_plan(PLANS['cuda'], device='meta')`` runs exactly the operators CUDA would
(``mmsoft.models.attention.plan``; tools/analysis_tools/benchmark.py, section launches).
"""
from collections import Counter
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ['LaunchCounter', 'MATMULS', 'NO_KERNEL_OPS', 'forbid_host_sync']

# Operators that reach the backend but launch no kernel: allocation and metadata.
NO_KERNEL_OPS = frozenset({'empty', 'empty_like', 'empty_strided', 'new_empty', 'detach',
                           'alias', 'lift_fresh', '_unsafe_view'})
# The matrix products below autograd (``linear`` and ``matmul`` reach them; the in-place
# forms accumulate P's row chunks), and which of their arguments are the two factors.
MATMULS = {'mm': (0, 1), 'bmm': (0, 1), 'addmm': (1, 2), 'baddbmm': (1, 2), 'addmm_': (1, 2),
           'baddbmm_': (1, 2)}


class LaunchCounter(TorchDispatchMode):
    """Counts the ATen operators run below autograd (forward and backward) inside the
    block: on a GPU each launches one or more kernels, so in eager mode this is the host
    work per step. Views and ``NO_KERNEL_OPS`` are not counted. Also records every copy
    of a host tensor to another device (``transfers``): on a GPU such a copy waits for
    the device to finish its queue. 0-dim host tensors are passed as values (no copy).

    Also adds up the floating-point operations of the matrix products (``MATMULS``:
    2·M·K·N per (M×K)·(K×N) product, per batch entry), split into products of two
    square matrices of one size (SOFT's Newton–Raphson iterate runs on m×m kernels) and
    the others.

    Args:
        shapes_of (Iterable[str]): operator names (e.g. ``'exp_'``) whose output shapes
            to record, in call order.

    Attributes:
        counts (Counter): operator name -> calls.
        transfers (list[str]): the operators that copied a host tensor to a device.
        shapes (dict[str, list[tuple]]): for each name of ``shapes_of``, the shape of
            every output it produced.
        matmul_flops (Counter): 'square' and 'other' -> floating-point operations of the
            matrix products.
    """

    def __init__(self, shapes_of=()):
        super().__init__()
        self.counts, self.transfers = Counter(), []
        self.shapes = {name: [] for name in shapes_of}
        self.matmul_flops = Counter()

    @property
    def total(self):
        return sum(self.counts.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        returns = func._schema.returns
        view = bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                     for r in returns)
        if not view and name not in NO_KERNEL_OPS:
            self.counts[name] += 1
        if name in self.shapes:
            self.shapes[name].append(tuple(out.shape))
        if name in MATMULS:
            a, b = (args[i] for i in MATMULS[name])
            (m, k), n = a.shape[-2:], b.shape[-1]
            kind = 'square' if m == k == n else 'other'
            self.matmul_flops[kind] += 2 * m * k * n * (a.shape[0] if a.dim() == 3 else 1)
        host = any(isinstance(t, torch.Tensor) and t.device.type == 'cpu' and t.dim() > 0
                   for t in tree_flatten((args, kwargs))[0])
        if host and any(isinstance(t, torch.Tensor) and t.device.type != 'cpu'
                        for t in tree_flatten(out)[0]):
            self.transfers.append(name)
        return out


@contextmanager
def forbid_host_sync():
    """Inside the block a CUDA call that synchronizes the host with the GPU raises
    (``torch.cuda.set_sync_debug_mode('error')``), after the queue is drained; the mode is
    restored after. CUDA only."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode('default')
