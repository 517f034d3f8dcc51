"""SOFT's dispatch: which variant computes the landmark middle W = A⁺·Z, and every other
choice that depends on where the attention runs.

As PyTorch's SDPA picks a backend and xformers an operator: a variant (``newton.Variant``:
'iterative', the reference, 'tf32', 'regularized'; ``spectral.py``: 'spectral',
'tridiagonal') computes W itself with its own options and declares where it can run.
Each device type has one immutable ``AttentionPlan`` (``PLANS``; others get
``DEFAULT_PLAN``): its variants in order of preference, each from a landmark count on,
ending with the reference, and how P = κ(Q, Q̃) is chunked and the depthwise conv laid
out; none changes what is computed beyond rounding (why each value:
docs/en/notes/per_device_plans.md). ``select_variant`` is the one rule: the first that
can run on a call's inputs (a layer's ``pinv_method`` naming one asks for it alone);
where none can, ``VariantNotSupported`` names each reason, nothing falls back silently.
A SOFT layer reads ``plan_for`` once per forward and passes the plan down.
``attention_plan`` forces choices for a block of code in this thread, as
``torch.nn.attention.sdpa_kernel`` does for SDPA's backends::

    with attention_plan(pinv='spectral'):                  # every device type
        ...
    with attention_plan(PLANS['cuda'], device='meta'):     # meta runs what CUDA runs
        ...

Under torch.compile Dynamo guards on the plan a layer read. ``register_variant`` adds a
variant of a package outside the library (``projects/``), which mmsoft never imports.
"""
import threading
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Optional, Tuple

import torch

from .dtypes import is_compiling
from .newton import TF32, Iterative, Regularized, Variant
from .spectral import Spectral, Tridiagonal

__all__ = [
    'AttentionPlan', 'DEFAULT_PLAN', 'Inputs', 'PLANS', 'VARIANTS', 'VariantNotSupported',
    'attention_plan', 'pinv_methods', 'plan_for', 'register_variant', 'select_variant'
]


class VariantNotSupported(ValueError):
    """No variant asked for can run on a call's inputs; the message names every reason."""


@dataclass(frozen=True)
class Inputs:
    """What a variant's support depends on, read from a call's tensors (``of``)."""
    device: str  # device type: 'cpu', 'cuda', ...
    dtype: torch.dtype  # the landmark kernel's
    m: int  # landmarks
    grad: bool = False  # gradients are needed
    compiling: bool = False  # torch.compile's Dynamo traces the call
    tracing: bool = False  # torch.jit.trace (ONNX export) traces it
    capturing: bool = False  # a CUDA graph is being captured

    @classmethod
    def of(cls, A, Z):
        """The inputs of a call on the kernel A (..., m, m) and Z (..., m, n)."""
        compiling = is_compiling()
        return cls(device=A.device.type, dtype=A.dtype, m=A.shape[-1],
                   grad=torch.is_grad_enabled() and (A.requires_grad or Z.requires_grad),
                   compiling=compiling, tracing=torch.jit.is_tracing(),
                   capturing=(A.is_cuda and not compiling
                              and torch.cuda.is_current_stream_capturing()))


VARIANTS = {}


def register_variant(variant, replace=False):
    """Add a ``Variant`` instance to ``VARIANTS`` under its name, which layers'
    ``pinv_method`` and plans may then say; ``replace`` to redefine one."""
    if not isinstance(variant, Variant) or not variant.name:
        raise TypeError(f'register_variant takes a named Variant, got {variant!r}')
    if variant.name == 'auto' or (variant.name in VARIANTS and not replace):
        raise ValueError(f'a variant named {variant.name!r} exists already')
    VARIANTS[variant.name] = variant
    return variant


for _variant in (Iterative(), Spectral(), Tridiagonal(), TF32(), Regularized()):  # the library's
    register_variant(_variant)


def pinv_methods():
    """What a SOFT layer's ``pinv_method`` may say: 'auto' (the device's plan) or a
    registered variant's name."""
    return ('auto', ) + tuple(VARIANTS)


def select_variant(pinv_method, plan, inputs):
    """The ``Variant`` a layer's ``pinv_method`` runs under ``plan`` on ``inputs`` (an
    ``Inputs``), the one decision of the dispatch: for 'auto' the first of the plan's
    variants from m on that can run, for a name the plan's variant of that name (whatever
    m; CUDA's 'tf32' with its options) or else the registered one; where none can run,
    ``VariantNotSupported`` with every one's reasons."""
    if pinv_method == 'auto':
        candidates = [v for least, v in plan.pinv if inputs.m >= least]
    else:
        candidates = list(plan.may_run(pinv_method))
    tried = []
    for variant in candidates:
        reasons = variant.not_supported_reasons(inputs)
        if not reasons:
            return variant
        tried.append(f'{variant.name!r}: {"; ".join(reasons)}')
    names = tuple(v.name for v in candidates)
    what = (f"pinv_method='auto' (the plan's {names})" if pinv_method == 'auto' else
            f'pinv_method={pinv_method!r}')
    raise VariantNotSupported(
        f'{what}: nothing asked for can run on {inputs.device} '
        f'{str(inputs.dtype).replace("torch.", "")} with m = {inputs.m}'
        f'{", with gradients" if inputs.grad else ""} ({" | ".join(tried)})')


LAYOUTS = ('images', 'channels')


def _variant(v):
    """A variant from itself or its registered name."""
    if isinstance(v, Variant):
        return v
    if v not in VARIANTS:
        raise ValueError(f'pinv variants must be Variants or among {tuple(VARIANTS)}, got '
                         f'{v!r}')
    return VARIANTS[v]


@dataclass(frozen=True)
class AttentionPlan:
    """How SOFT's attention runs on one device type.

    Args:
        pinv: (fewest landmarks, variant) pairs in order of preference, a variant a
            ``Variant`` or a registered name; a lone variant or name means every m.
        kernel_chunk (int): row chunks of P of about this many elements where P is not
            formed whole (``soft.py``).
        kernel_once_up_to (int | None): without gradients P is formed whole up to this
            many elements (None: always); above, its products run in chunks.
        compiled_kernel_chunks (int): P's row chunks under torch.compile, whatever its
            size (one graph for every image size).
        local_conv_layout (str): ``HeadSharedConv``'s, 'images' (the official grouped
            conv) or 'channels' (one depthwise conv over V's h·d channels).
    """
    pinv: Tuple[Tuple[int, Variant], ...] = ((1, 'iterative'), )
    kernel_chunk: int = 2**24
    kernel_once_up_to: Optional[int] = None
    compiled_kernel_chunks: int = 4
    local_conv_layout: str = 'images'

    def __post_init__(self):
        pinv = self.pinv
        pinv = ((1, pinv), ) if isinstance(pinv, (str, Variant)) else tuple(pinv)
        if not pinv or any(not isinstance(p, tuple) or len(p) != 2 or not isinstance(p[0], int)
                           for p in pinv):
            raise ValueError(f'pinv needs (fewest landmarks, variant) pairs, got {self.pinv!r}')
        object.__setattr__(self, 'pinv', tuple((m, _variant(v)) for m, v in pinv))
        if min(m for m, _ in self.pinv) > 1:
            raise ValueError(f'pinv needs a variant for every m (one from 1 landmark on), '
                             f'got {self.pinv!r}')
        for name, least in (('kernel_chunk', 1), ('compiled_kernel_chunks', 1),
                            ('kernel_once_up_to', 0)):
            value = getattr(self, name)
            if not ((value is None and name == 'kernel_once_up_to')
                    or (type(value) is int and value >= least)):
                raise ValueError(f'{name} must be an int >= {least}, got {value!r}')
        if self.local_conv_layout not in LAYOUTS:
            raise ValueError(f'local_conv_layout must be one of {LAYOUTS}, got '
                             f'{self.local_conv_layout!r}')

    def may_run(self, pinv_method):
        """The variants ``pinv_method`` may run under this plan, for any m: for 'auto' the
        plan's, for a name the plan's variant of that name or else the registered one."""
        if pinv_method == 'auto':
            return tuple(v for _, v in self.pinv)
        listed = [v for _, v in self.pinv if v.name == pinv_method]
        if not listed and pinv_method not in VARIANTS:
            raise ValueError(f'pinv_method must be one of {pinv_methods()}, got '
                             f'{pinv_method!r}')
        return (listed[0] if listed else VARIANTS[pinv_method], )


_PLANS = {
    'cpu': AttentionPlan(pinv=((449, 'tridiagonal'), (129, 'spectral'), (1, 'iterative')),
                         kernel_chunk=2**20, kernel_once_up_to=2**24,
                         local_conv_layout='channels'),
    'cuda': AttentionPlan(pinv=((197, TF32(float32_steps=(1, 4), pad_to=32, thin_steps=4)),
                                (1, 'iterative')),
                          kernel_chunk=2**24, local_conv_layout='images'),
}
PLANS = MappingProxyType(_PLANS)  # read-only; plan_for reads the dict (torch 2.1's
# Dynamo cannot trace a mappingproxy's get)
DEFAULT_PLAN = replace(PLANS['cuda'], pinv='iterative')


class _Forced(threading.local):
    """The plans forced in this thread: None, or {device type: plan} (key None: the
    others). Set on the instance: Dynamo guards a thread-local through its dict."""

    def __init__(self):
        self.plans = None


_forced = _Forced()


def plan_for(device_type):
    """The ``AttentionPlan`` in force for a device type ('cpu', 'cuda', ...)."""
    plans = _forced.plans
    if plans is None:
        return _PLANS.get(device_type, DEFAULT_PLAN)
    return plans[device_type] if device_type in plans else plans[None]


@contextmanager
def attention_plan(plan=None, *, device=None, **choices):
    """Force choices of the plan inside the block (module docstring); blocks nest.

    Args:
        plan (AttentionPlan, optional): start from this plan instead of the one in force.
        device (str, optional): force it for this device type only (default: all).
        **choices: ``AttentionPlan`` fields to replace, e.g. ``pinv='spectral'``.
    """
    names = {f.name for f in fields(AttentionPlan)}
    unknown = set(choices) - names
    if unknown:
        raise TypeError(f'unknown plan choices {sorted(unknown)}; a plan has {sorted(names)}')
    if plan is not None and not isinstance(plan, AttentionPlan):
        raise TypeError(f'plan must be an AttentionPlan, got {type(plan).__name__}')
    before = _forced.plans
    plans = dict(before) if before is not None else {**PLANS, None: DEFAULT_PLAN}
    for key in ([device] if device is not None else list(plans)):
        base = plan or (plans[key] if key in plans else plans[None])
        plans[key] = replace(base, **choices)
    _forced.plans = plans
    try:
        yield plans[device]
    finally:
        _forced.plans = before
