"""Keep torch's ``weights_only`` checkpoint loading on, and teach it what legitimate
checkpoints contain.

torch >= 2.6 loads with ``weights_only=True`` by default; mmengine 0.10.7 calls
``torch.load`` without the argument, so its own checkpoints (numpy arrays and scalars in the
message hub, ``HistoryBuffer`` objects whose statistics methods are pickled as
``getattr(HistoryBuffer, 'min')``) and timm checkpoints (``args``: an
``argparse.Namespace``) are refused. Instead of turning the protection off, this module adds
exactly those classes to torch's allow-list. The weights-only unpickler still refuses to
call anything that is not allow-listed, so a crafted file that reaches e.g. ``os.system``
stays refused.
"""
import argparse
import builtins

import numpy as np
import torch

__all__ = ['mmengine_checkpoint_globals', 'allow_mmengine_checkpoints']


def mmengine_checkpoint_globals():
    """The classes and functions found in mmengine and timm checkpoints."""
    from mmengine.logging.history_buffer import HistoryBuffer
    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar
    dtype_classes = []
    if hasattr(np, 'dtypes'):  # numpy >= 1.25 pickles dtypes through their DType class
        dtype_classes = [getattr(np.dtypes, name) for name in dir(np.dtypes)
                         if name.endswith('DType')]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes, HistoryBuffer,
            builtins.getattr, argparse.Namespace]


def allow_mmengine_checkpoints():
    """Add ``mmengine_checkpoint_globals()`` to torch's weights-only allow-list."""
    add = getattr(torch.serialization, 'add_safe_globals', None)
    if add is not None:  # torch < 2.4 has no weights_only default to satisfy
        add(mmengine_checkpoint_globals())
