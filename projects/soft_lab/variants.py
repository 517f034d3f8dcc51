"""The candidates as mmsoft variants (``mmsoft.models.attention.plan``): each a small
declared unit, registered when this package is imported, none in any device's plan.

    'tf32-guarded'   'tf32' whose first float32 steps run only for a batch of kernels
                     with one that may sit near the step size's boundary
                     (``first_steps_needed``); one value read on the host per call
    'tf32-horner'    'tf32' whose thin steps run by Horner's rule in inference too (one
                     m×m product for CUDA's 4 thin steps at m = 1056 instead of 4)

Both are kinds of ``newton.TF32``: frozen dataclasses with its fields
(``float32_steps``, ``pad_to``, ``thin_steps``), which their ``apply`` reads. The
registered ones have TF32's defaults; CUDA's options are the plan's 'tf32''s, which a
path modifier carries over (``mmsoft.benchmark.common.path_plan('cuda+tf32-guarded',
device)``), as ``dataclasses.replace`` does::

    replace(VARIANTS['tf32-guarded'], float32_steps=(1, 4), pad_to=32, thin_steps=4)
"""
from dataclasses import dataclass

import torch

from mmsoft.models.attention import newton, register_variant
from mmsoft.models.attention.dtypes import is_compiling
from mmsoft.models.attention.newton import TF32, first_step_bound, newton_alpha

__all__ = ['FIRST_STEP_BOUND', 'GuardedTF32', 'HornerTF32', 'first_steps_needed', 'register']

# 'tf32-guarded' lets a kernel off the first float32 steps where αλ² ≤ FIRST_STEP_BOUND is
# proven for all its eigenvalues, half the boundary's 2
FIRST_STEP_BOUND = 1.


def first_steps_needed(A, alpha, nonnegative=False):
    """Whether a kernel may need 'tf32''s first float32 steps: for each matrix of A
    (..., m, m), symmetric, with step α (``newton_alpha``, (..., 1, 1)), False where
    every eigenvalue λ of A is proven to have αλ² ≤ ``FIRST_STEP_BOUND``
    (``newton.first_step_bound``).

    TF32 rounding of the first step's operands moves αλ² by about 2^-10 of itself. That
    matters only near the boundary αλ² = 2 of the official step size (1 - αλ² ≈ -1),
    where it can cross 2 and the iterate diverges; from αλ² ≤ 1 the step maps every
    eigenvalue into [0, 1] as float32 does. The bound's rounding, m·2^-24 of the sum at
    most, is far inside the margin to 2. SOFT-S's kernels on real images sit at
    0.006-0.011 (random weights, 384×640); near-identity and near-rank-1 kernels, whose
    λ_max nears the largest row sum, are not let off.

    Returns:
        Tensor: (...,) bool.
    """
    return first_step_bound(A, alpha, nonnegative) > FIRST_STEP_BOUND


def _can_synchronize(A):
    """Whether the caller may read a value of A's device on the host: not while
    torch.compile or the JIT traces, a CUDA graph is captured, or on the meta device."""
    if is_compiling() or torch.jit.is_tracing() or A.device.type == 'meta':
        return False
    return not (A.is_cuda and torch.cuda.is_current_stream_capturing())


def _repr(variant):
    """A kind of TF32 shown by its class and options (TF32's own repr says 'TF32')."""
    return (f'{type(variant).__name__}(float32_steps={variant.float32_steps}, '
            f'pad_to={variant.pad_to}, thin_steps={variant.thin_steps})')


@dataclass(frozen=True, repr=False)
class GuardedTF32(TF32):
    """'tf32' with its first float32 steps only where ``first_steps_needed`` says a
    kernel of the batch may need them (where the host cannot read it, they run); its
    options as ``TF32``'s."""
    name = 'tf32-guarded'

    def apply(self, A, Z, iters):
        first, last = self.float32_steps
        if first and _can_synchronize(A):
            alpha = newton_alpha(A.detach(), nonnegative=True)
            if not bool(first_steps_needed(A.detach(), alpha, True).any()):
                first = 0
        return TF32(float32_steps=(first, last), pad_to=self.pad_to,
                    thin_steps=self.thin_steps).apply(A, Z, iters)

    __repr__ = _repr


@dataclass(frozen=True, repr=False)
class HornerTF32(TF32):
    """'tf32' with its thin steps by Horner's rule in inference too, where that costs
    less than one by one (``newton._horner_steps``); with gradients, or without thin
    steps, 'tf32' itself (which takes Horner's rule in training)."""
    name = 'tf32-horner'

    def apply(self, A, Z, iters):
        schedule = tf32_schedule(iters, self.float32_steps)
        steps = min(self.thin_steps, schedule[-1][0], max(iters - 1, 0))
        grad = torch.is_grad_enabled() and (A.requires_grad or Z.requires_grad)
        if not steps or grad:
            return super().apply(A, Z, iters)
        return newton._NewtonPinvThin.apply(A, Z, schedule, self.pad_to, steps, True, True)

    __repr__ = _repr


def tf32_schedule(iters, float32_steps):
    """'tf32''s steps as ``newton.TF32.apply`` runs them: ((first, 'float32'), (middle,
    'tf32'), (last, 'float32')) for ``float32_steps`` = (first, last), cut to T steps."""
    first = min(float32_steps[0], iters)
    last = min(float32_steps[1], iters - first)
    return ((first, 'float32'), (iters - first - last, 'tf32'), (last, 'float32'))


def register():
    """Register the candidates with mmsoft's dispatch (once; this package's import does)."""
    from mmsoft.models.attention import VARIANTS
    for variant in (GuardedTF32(), HornerTF32()):
        if variant.name not in VARIANTS:
            register_variant(variant)
