"""Which way computes SOFT's landmark middle, W = A⁺·Z, for one call: the dispatch.

How it chooses (as PyTorch's SDPA picks a backend and xformers an operator):

- A **variant** is one way to compute W (``Variant``): it declares where it can run
  (device types, dtypes, landmark counts, with or without gradients, under tracing or a
  CUDA graph capture, what it needs installed) and says why it cannot
  (``not_supported_reasons``, a list of sentences; empty: it can).
- Each device's plan (``plan.py``) lists variants in order of preference, each for
  landmark counts up to a bound (``AttentionPlan.pinv``). With ``pinv_method='auto'``
  the first listed variant for m that can run on the call's inputs wins; every device's
  list ends with 'iterative', the reference (the official 20-step iterate, paper Alg. 2),
  which runs everywhere.
- Forcing one (a layer's ``pinv_method``, or a plan forced by ``attention_plan``) goes
  through the same check: where it cannot run, ``VariantNotSupported`` names each reason;
  nothing falls back silently.

``select_variant`` is that rule; ``VARIANTS`` holds the variants of the library
('iterative', 'spectral', 'tridiagonal', 'tf32', and the fast mode 'regularized', which
is not the iterate). A package outside the library (``projects/``) adds its own with
``register_variant``; mmsoft never imports it.

P's products (``soft.py``) are dispatched the same way among ``KERNEL_PRODUCTS`` (the
library's: 'chunks'), by the plan's ``kernel_products`` list.
"""
import importlib.util
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .dtypes import is_compiling
from .newton import newton_pinv_apply, regularized_apply
from .spectral import tridiagonal_apply

__all__ = [
    'Inputs', 'KERNEL_PRODUCTS', 'KernelProducts', 'VARIANTS', 'Variant', 'VariantNotSupported',
    'pinv_methods', 'register_kernel_products', 'register_variant', 'select', 'select_variant'
]


_INSTALLED = {}


def _installed(module):
    """Whether ``module`` can be imported (found once per process)."""
    if module not in _INSTALLED:
        _INSTALLED[module] = importlib.util.find_spec(module) is not None
    return _INSTALLED[module]


class VariantNotSupported(ValueError):
    """No variant asked for can run on a call's inputs; the message names every reason."""


@dataclass(frozen=True)
class Inputs:
    """What a variant's support depends on, read from a call's tensors (``of``)."""
    device: str  # device type: 'cpu', 'cuda', ...
    dtype: torch.dtype  # the landmark kernel's (float32 or float64)
    m: int  # landmarks
    grad: bool  # gradients are needed
    compiling: bool  # torch.compile's Dynamo traces the call
    tracing: bool  # torch.jit.trace (ONNX export) traces it
    capturing: bool  # a CUDA graph is being captured

    @classmethod
    def of(cls, A, *others, m=None):
        """The inputs of a call on A (..., m, m) (and the other tensors it takes); ``m``
        where A's last dimension is not the landmarks' (P's queries (..., N, d))."""
        tensors = (A, ) + others
        compiling = is_compiling()
        return cls(device=A.device.type, dtype=A.dtype, m=A.shape[-1] if m is None else m,
                   grad=torch.is_grad_enabled() and any(t.requires_grad for t in tensors),
                   compiling=compiling, tracing=torch.jit.is_tracing(),
                   capturing=(A.is_cuda and not compiling
                              and torch.cuda.is_current_stream_capturing()))


class Variant:
    """One way to compute a call's result, and where it can run.

    Class attributes declare the support; ``not_supported_reasons`` derives from them
    (a subclass may add reasons). ``None`` means no restriction.
    """
    name: str = ''
    devices: Optional[Tuple[str, ...]] = None  # device types
    dtypes: Optional[Tuple[torch.dtype, ...]] = (torch.float32, torch.float64)
    min_m: int = 1
    max_m: Optional[int] = None
    gradients: bool = True  # runs where gradients are needed
    compilable: bool = True  # runs under torch.compile (graph breaks allowed)
    traceable: bool = True  # runs under torch.jit.trace
    capturable: bool = True  # runs inside a CUDA graph capture
    requires: Tuple[str, ...] = ()  # modules it imports

    def not_supported_reasons(self, inputs):
        """Why this variant cannot run on ``inputs`` (an ``Inputs``): [] where it can."""
        reasons = []
        if self.devices is not None and inputs.device not in self.devices:
            reasons.append(f'runs on {", ".join(self.devices)}, not {inputs.device}')
        if self.dtypes is not None and inputs.dtype not in self.dtypes:
            names = ', '.join(str(d).replace('torch.', '') for d in self.dtypes)
            reasons.append(f'takes {names} kernels, not '
                           f'{str(inputs.dtype).replace("torch.", "")}')
        if inputs.m < self.min_m or (self.max_m is not None and inputs.m > self.max_m):
            top = 'any' if self.max_m is None else self.max_m
            reasons.append(f'takes {self.min_m} to {top} landmarks, not {inputs.m}')
        if inputs.grad and not self.gradients:
            reasons.append('computes no gradients')
        if inputs.compiling and not self.compilable:
            reasons.append('runs eagerly only, not under torch.compile')
        if inputs.tracing and not self.traceable:
            reasons.append('cannot be traced by torch.jit.trace')
        if inputs.capturing and not self.capturable:
            reasons.append('reads values on the host, which a CUDA graph capture cannot')
        reasons += [f'needs {module}, which is not installed' for module in self.requires
                    if not _installed(module)]
        return reasons

    def __repr__(self):
        return f'{type(self).__name__}({self.name!r})'


# ------------------------------------------------------------------ the inverse's variants
class InverseVariant(Variant):
    """W = A⁺·Z (or its fast-mode stand-in) for A (..., m, m), the symmetric nonnegative
    landmark kernel, and Z (..., m, n) in A's dtype."""

    def apply(self, A, Z, iters, plan):
        """W (..., m, n); ``plan``: the ``AttentionPlan`` in force (its iterate options)."""
        raise NotImplementedError


class Iterative(InverseVariant):
    """The reference: the formed float32 iterate, 2T m×m products (paper Alg. 2), on A
    padded to the plan's ``pinv_pad`` and with its ``thin_steps`` (same iterate)."""
    name = 'iterative'

    def apply(self, A, Z, iters, plan):
        return newton_pinv_apply(A, Z, iters, 'iterative', nonnegative=True,
                                 pad_to=plan.pinv_pad,
                                 thin_steps=plan.thin_steps_for('iterative', iters))


class Spectral(InverseVariant):
    """The same iterate through one eigendecomposition of A (``newton._NewtonInverse``):
    float32 where a first-order bound allows it, float64 elsewhere. LAPACK / cuSOLVER:
    the CPU and CUDA; reads values on the host."""
    name = 'spectral'
    devices = ('cpu', 'cuda')
    traceable = False  # its host reads would become constants of a traced graph
    capturable = False

    def apply(self, A, Z, iters, plan):
        return newton_pinv_apply(A, Z, iters, 'spectral', nonnegative=True)


class Tridiagonal(InverseVariant):
    """'spectral''s filter applied through A's tridiagonal form instead of its
    eigenvectors (``spectral.tridiagonal_apply``: about half an eigendecomposition, then
    banded solves on the thin matrix): inference on the CPU, float32, eager code; SciPy's
    LAPACK (which torch does not expose)."""
    name = 'tridiagonal'
    devices = ('cpu', )
    dtypes = (torch.float32, )
    gradients = False
    compilable = False
    traceable = False
    requires = ('scipy', )

    def apply(self, A, Z, iters, plan):
        return tridiagonal_apply(A, Z, iters, nonnegative=True)


class TF32(InverseVariant):
    """The iterate with TF32 tensor-core products between float32 steps (the plan's
    ``tf32_float32_steps``), on A padded to ``pinv_pad``, the last ``thin_steps`` float32
    steps applied thin. Native on CUDA; elsewhere its rounding is emulated (slow: for
    checking numerics). Tensor cores round float32 operands: float32 kernels only."""
    name = 'tf32'
    dtypes = (torch.float32, )

    def apply(self, A, Z, iters, plan):
        return newton_pinv_apply(A, Z, iters, 'tf32', nonnegative=True,
                                 tf32_float32_steps=plan.tf32_float32_steps,
                                 pad_to=plan.pinv_pad,
                                 thin_steps=plan.thin_steps_for('tf32', iters))


class Regularized(InverseVariant):
    """Fast mode, not the iterate: a Tikhonov solve (A² + μI)⁻¹·A·Z with μ = 1/(α·2^T)
    (``newton.regularized_apply``)."""
    name = 'regularized'

    def apply(self, A, Z, iters, plan):
        return regularized_apply(A, Z, iters)


VARIANTS = {}


def register_variant(variant, replace=False):
    """Add an ``InverseVariant`` instance to ``VARIANTS`` under its name (which layers'
    ``pinv_method`` and plans' ``pinv`` may then say); ``replace`` to redefine one."""
    if not isinstance(variant, InverseVariant) or not variant.name:
        raise TypeError(f'register_variant takes a named InverseVariant, got {variant!r}')
    if variant.name == 'auto' or (variant.name in VARIANTS and not replace):
        raise ValueError(f'a variant named {variant.name!r} exists already')
    VARIANTS[variant.name] = variant
    return variant


for _variant in (Iterative(), Spectral(), Tridiagonal(), TF32(), Regularized()):
    register_variant(_variant)


def pinv_methods():
    """What a SOFT layer's ``pinv_method`` may say: 'auto' (the device's plan, by m) or a
    registered variant (``VARIANTS``: the library's, and any a package outside it
    registered)."""
    return ('auto', ) + tuple(VARIANTS)


# ------------------------------------------------------------------ P's products
class KernelProducts(Variant):
    """How each row chunk of P = κ(Q, Q̃) (and, in backward, G = ∇P ⊙ P with it) is made
    from the kernel features (``soft.py``): flat (b, rows, K) and (b, m, K), in the
    queries' dtype (half precision under autocast)."""
    dtypes = None

    def form(self, fq, fl):
        """P (b, rows, m)."""
        raise NotImplementedError

    def form_with_grad(self, fq, fl, left, right, keep_p):
        """(P or None, G) with G = (left·rightᵀ) ⊙ P; P only where ``keep_p``."""
        raise NotImplementedError


KERNEL_PRODUCTS = {}


def register_kernel_products(products, replace=False):
    """Add a ``KernelProducts`` instance to ``KERNEL_PRODUCTS`` under its name."""
    if not isinstance(products, KernelProducts) or not products.name:
        raise TypeError(f'register_kernel_products takes a named KernelProducts, got '
                        f'{products!r}')
    if products.name in KERNEL_PRODUCTS and not replace:
        raise ValueError(f'kernel products named {products.name!r} exist already')
    KERNEL_PRODUCTS[products.name] = products
    return products


# ------------------------------------------------------------------ the rule
def select(names, inputs, registry, what):
    """The first of ``names`` (in order) in ``registry`` that can run on ``inputs``;
    ``VariantNotSupported`` with every one's reasons where none can. ``what`` names the
    choice in the message."""
    tried = []
    for name in names:
        reasons = registry[name].not_supported_reasons(inputs)
        if not reasons:
            return registry[name]
        tried.append(f'{name!r}: {"; ".join(reasons)}')
    raise VariantNotSupported(
        f'{what}: nothing asked for can run on {inputs.device} '
        f'{str(inputs.dtype).replace("torch.", "")} with '
        f'm = {inputs.m}{", with gradients" if inputs.grad else ""} ({" | ".join(tried)})')


def select_variant(pinv_method, plan, inputs):
    """The ``InverseVariant`` a layer's ``pinv_method`` runs under ``plan`` on ``inputs``
    (module docstring): 'auto', the plan's list for m; another name, that variant."""
    names = plan.variants_for(inputs.m) if pinv_method == 'auto' else (pinv_method, )
    what = 'pinv_method=' + (f"'auto' (the plan's {names})" if pinv_method == 'auto' else
                             repr(pinv_method))
    return select(names, inputs, VARIANTS, what)
