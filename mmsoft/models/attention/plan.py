"""SOFT's per-device plan: every choice that depends on where the attention runs.

One immutable ``AttentionPlan`` per device type (``PLANS``; a device type not listed gets
``DEFAULT_PLAN``), with the measurement behind each value beside it. None of the choices
changes what is computed, only how (up to float rounding):

    pinv               the iterate's variants in order of preference, each up to a
                       landmark count (``dispatch.py``: the first that can run wins;
                       every list ends with the reference, 'iterative')
    tf32_float32_steps 'tf32': the float32 steps (first, last) around its TF32 steps
    pinv_pad           the iterations run on the kernel zero-padded to a multiple of
                       this many landmarks (1: none)
    thin_steps         this many of the float32 steps that end 'iterative' and 'tf32'
                       are applied to the thin matrix (one m×m product each instead of
                       two; with gradients where that costs less than forming them)
    kernel_chunk       row chunks of P = κ(Q, Q̃) of about this many elements, when P is
                       not formed whole (``soft.py``)
    kernel_once_up_to  without gradients P is formed whole up to this many elements
                       (None: always); above, the chunked products run twice
    compiled_kernel_chunks
                       under torch.compile, P in this many row chunks whatever its
                       size (one graph for every image size)
    kernel_products    how P's chunks are made, in order of preference
                       (``dispatch.KERNEL_PRODUCTS``; the library's: 'chunks')
    local_conv_layout  how ``HeadSharedConv`` runs the depthwise conv on V ('images':
                       the official grouped conv; 'channels': one depthwise conv over
                       V's h·d channels)
    order              'thin' (ours: P·(Â·(Pᵀ·V)), Â never formed) or 'official' (the
                       official code's order (P·Â)·(Pᵀ·V): the reference the fast paths
                       are checked and timed against)

``plan_for(device_type)`` is the plan in force. A SOFT attention layer reads it once per
forward (``SoftKernelAttention.forward``) and passes it down: ``soft_attention`` takes it
as an argument and the dispatch picks the variant for each call's inputs.

``attention_plan(...)`` forces choices for a block of code, in the manner of
``torch.nn.attention.sdpa_kernel`` for SDPA's backends::

    with attention_plan(pinv='spectral'):                  # every device type
        ...
    with attention_plan(kernel_chunk=2**18, device='cpu'):
        ...
    with attention_plan(PLANS['cuda'], device='meta'):     # meta runs what CUDA runs
        ...

A forced list is the list: where none of its variants can run on a call's inputs, the
call raises with each one's reasons (``dispatch.VariantNotSupported``). Unlike
``sdpa_kernel``'s backend flags, which are process-wide, a forced plan holds in the
thread that forces it only: another thread (a data loader, a second model) keeps the
plans in force there. It is safe under ``torch.compile``: Dynamo guards on the plan a
layer read and recompiles for another one.
"""
import threading
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Optional, Tuple

import torch

from . import soft  # noqa: F401  (registers the library's kernel products, 'chunks')
from .dispatch import KERNEL_PRODUCTS, VARIANTS, Inputs, pinv_methods, select_variant
from .newton import THIN_STEP_METHODS, TF32_FLOAT32_STEPS, check_pinv_options, check_thin_steps

__all__ = [
    'AttentionPlan', 'DEFAULT_PLAN', 'PINV_METHODS', 'PLANS', 'attention_plan', 'pinv_methods',
    'plan_for', 'resolve_pinv_method'
]

LAYOUTS = ('images', 'channels')
ORDERS = ('thin', 'official')


# The library's own (a package outside it may register more: ``pinv_methods()``)
PINV_METHODS = pinv_methods()


def _size_table(value, name):
    """A field chosen by the landmark count, as a tuple of (largest m, choice) pairs in
    order of preference, one of them with None (every m); a plain choice means every m."""
    table = ((None, value), ) if isinstance(value, str) else tuple(tuple(p) for p in value)
    if not table or any(len(p) != 2 for p in table) or all(p[0] is not None for p in table):
        raise ValueError(f'{name} needs (largest m, choice) pairs, one of them (None, choice) '
                         f'for every m, got {value!r}')
    return table


@dataclass(frozen=True)
class AttentionPlan:
    """How SOFT's attention runs on one device type (module docstring).

    Args:
        pinv (tuple[tuple[int | None, str]] | str): (largest m, variant) pairs in order
            of preference, at least one with None (every m); a name means every m.
        tf32_float32_steps (tuple[int, int]): float32 steps before and after 'tf32''s
            TF32 steps.
        pinv_pad (int): zero-pad the kernel to a multiple of this many landmarks.
        thin_steps (int): float32 steps applied to the thin matrix.
        kernel_chunk (int): elements per row chunk of P.
        kernel_once_up_to (int | None): P formed whole without gradients up to this
            many elements; None: always.
        compiled_kernel_chunks (int): row chunks of P under torch.compile.
        kernel_products (tuple[str] | str): names of ``dispatch.KERNEL_PRODUCTS`` in
            order of preference.
        local_conv_layout (str): 'images' or 'channels'.
        order (str): 'thin' or 'official'.
    """
    pinv: Tuple[Tuple[Optional[int], str], ...] = ((None, 'iterative'), )
    tf32_float32_steps: Tuple[int, int] = TF32_FLOAT32_STEPS
    pinv_pad: int = 1
    thin_steps: int = 0
    kernel_chunk: int = 2**24
    kernel_once_up_to: Optional[int] = None
    compiled_kernel_chunks: int = 4
    kernel_products: Tuple[str, ...] = ('chunks', )
    local_conv_layout: str = 'images'
    order: str = 'thin'

    def __post_init__(self):
        pinv = _size_table(self.pinv, 'pinv')
        object.__setattr__(self, 'pinv', pinv)
        for _, name in pinv:
            if name not in VARIANTS:
                raise ValueError(f'pinv variants must be among {tuple(VARIANTS)}, got '
                                 f'{name!r}')
        object.__setattr__(self, 'tf32_float32_steps', check_pinv_options(
            self.tf32_float32_steps, self.pinv_pad, pad_name='pinv_pad')['tf32_float32_steps'])
        # thin_steps holds for the methods that end in float32 steps, whether the table
        # or a layer's pinv_method names them (the others take none: ``thin_steps_for``),
        # at most 'tf32''s last ones; the layer's iteration count is checked when it runs
        check_thin_steps(self.thin_steps, 'tf32', self.tf32_float32_steps)
        if not isinstance(self.kernel_chunk, int) or self.kernel_chunk < 1:
            raise ValueError(f'kernel_chunk must be a positive int, got {self.kernel_chunk!r}')
        chunks = self.compiled_kernel_chunks
        if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
            raise ValueError(f'compiled_kernel_chunks must be a positive int, got {chunks!r}')
        products = self.kernel_products
        products = (products, ) if isinstance(products, str) else tuple(products)
        object.__setattr__(self, 'kernel_products', products)
        if not products or any(p not in KERNEL_PRODUCTS for p in products):
            raise ValueError(f'kernel_products must name some of {tuple(KERNEL_PRODUCTS)}, '
                             f'got {self.kernel_products!r}')
        once = self.kernel_once_up_to
        if once is not None and (not isinstance(once, int) or once < 0):
            raise ValueError(f'kernel_once_up_to must be None or an int >= 0, got {once!r}')
        if self.local_conv_layout not in LAYOUTS:
            raise ValueError(f'local_conv_layout must be one of {LAYOUTS}, got '
                             f'{self.local_conv_layout!r}')
        if self.order not in ORDERS:
            raise ValueError(f'order must be one of {ORDERS}, got {self.order!r}')

    def variants_for(self, m):
        """The variants 'auto' tries for m landmarks, in order (``dispatch.select_variant``)."""
        names = [name for max_m, name in self.pinv if max_m is None or m <= max_m]
        return tuple(dict.fromkeys(names))

    def thin_steps_for(self, method, iters):
        """The thin steps a layer running ``method`` for ``iters`` steps takes from this
        plan: ``thin_steps`` where the method ends in float32 steps (a layer's
        ``pinv_method`` may name another), after at least one formed step."""
        if method not in THIN_STEP_METHODS:
            return 0
        return min(self.thin_steps, max(iters - 1, 0))


# The measurements behind the values (tools/analysis_tools/benchmark.py; docs/en/benchmarks.md,
# docs/en/notes/per_device_plans.md; the GPU reports under docs/benchmark/).
#
# pinv
# - cpu: 'iterative' up to 128 landmarks, 'spectral' above. 2-core x86 CPU, torch
#   2.14.1, `benchmark.py --sections pinv --pinv-sizes 100 128 196 256 400 --pinv-pad 1`
#   (batch 20, spectral vs the formed iterate): 10.6 / 7.1 ms, 18.3 / 15.7, 38.5 / 47.4,
#   65.5 / 88.5, 166 / 323; at m = 1025 2.40 s vs 14.6 s. 'spectral' decomposes a float32
#   kernel in float32 where a first-order error bound allows it, the Perron pair split
#   off in float64 first (``spectral._mixed_spectral_factors``): SOFT-S's forward at
#   800×1344, float64 eigh 11.94 s, this 8.35 s (3 rounds alternated in one process);
#   on near-rank-1 landmarks within 0.53 of the hard-kernel bound, as float64 eigh.
#   Above 448 landmarks, without gradients, 'tridiagonal' (the same filter through A's
#   tridiagonal form, SciPy's LAPACK; with gradients, without SciPy, compiled or traced:
#   'spectral'). SOFT-S's forward at 800×1344 on a 2-core AMD EPYC (AVX-512), medians of
#   4 interleaved rounds (`benchmark.py --sections speed --models SOFT-S Swin-T --sizes
#   800x1344 --repeat 1 --rounds 4 --skip-official --soft-plans spectral cpu`; the
#   default and the `cpu` path run the same plan; docs/benchmark/
#   cpu_tridiagonal_2026-12-02.json): this plan 8.179 s and 8.424 s (3.49× and 3.59×
#   Swin-T's 2.345 s), 'spectral' through eigenvectors 10.944 s (4.67×). Below ~450
#   landmarks eigh wins (2-core Xeon, AVX-512, docs/benchmark/
#   cpu_spectral_inference_2026-11-29.json: 512×512, m = 256, 884.0 ms with eigh against
#   1.074 s; m = 400 1.583 against 1.724 s): the kernels pay the tridiagonal form's fixed
#   cost (nine banded solves through SciPy, two Householder applications, two Sturm
#   counts in Python). The floor (`tools/analysis_tools/fidelity.py --paths spectral
#   cpu`), worst map eigh / tridiagonal: 640×640 3.3e-6 / 3.7e-6 (7 images), 800×1344
#   3.9e-6 / 4.5e-6 (astronaut, page, blank).
# - cuda: 'iterative' up to 196 landmarks, 'tf32' above. NVIDIA H200, torch 2.11 + CUDA
#   13 (docs/benchmark/cuda_h200/report.md), `--sections pinv --pinv-sizes 196 256 400
#   1050 --pinv-pad 32` (batch 20): at m = 1050 'iterative' 47.0 ms, 'tf32' with 1+15+4
#   steps on m padded to 1056 19.6 ms; at m = 400 4.0 ms against 2.1-2.8 ms; at m = 196
#   and 256 every method 1.3-2.0 ms (launch-bound), so the float32 iterate, the more
#   accurate, stays there. SOFT-S at 800×1344 against Swin-T (`--sections speed,train
#   --models SOFT-S Swin-T --soft-plans iterative`): forward 109.3 ms against 225.8 ms
#   with the float32 iterate, training step at batch 2 340.0 against 568.7 ms. The floor
#   on CUDA (tools/analysis_tools/fidelity.py --device cuda, 7 images, real TF32):
#   384×640 worst map 4.0e-6, 640×640 2.5e-6, 800×1344 8.8e-6 (the float32 iterate
#   8.2e-6), gradients within their bound; hard kernels within half the bound.
# - other device types (``DEFAULT_PLAN``): the formed float32 iterate with CUDA's other
#   choices: it needs no eigendecomposition, which not every backend has, and no TF32
#   products, which only CUDA runs natively.
#
# tf32_float32_steps ('tf32'): the first float32 step keeps kernels near the step size's
#   boundary from diverging (the 'boundary' kernels of mmsoft.testing: without it 15× the
#   hard-kernel bound); the last ones remove TF32 rounding where Newton's step
#   converges.
# - cuda: (1, 4), the fewest that keep the floor on CUDA itself at 384×640, 640×640 and
#   800×1344 (with 2 last steps, 1.3e-5 at 384×640 and 1.8e-5 at 640×640).
# - elsewhere (1, 8) (``newton.TF32_FLOAT32_STEPS``, for 'tf32' emulated): with 4 or 6
#   last steps the emulation left the cat photo 5.6e-5 / 5.2e-5 from float64 at 640×640
#   on the CPU (`tools/analysis_tools/fidelity.py --size 640x640 --gradients
#   --gradient-images astronaut coffee chelsea rocket --paths default cuda tf32-1-4
#   tf32-1-6 tf32-1-8`); with 8, maps 4.4e-6 at worst (float32 'iterative': 3.7e-6),
#   gradients 5.8e-6.
#
# pinv_pad: 32 on CUDA, 1 elsewhere. On the H200 one batched TF32 product (20 × m×m) at
#   m = 1024 / 1056 / 1088 ran cuBLAS's sm90 kernel at 134-154 TFLOP/s, at m = 1025 / 1050
#   an sm80 one at 74-76; the pinv entry above: 'tf32' at m = 1050 27.0-34.1 ms unpadded,
#   16.0-27.0 ms padded to 1056. Zero padding changes no value: the iterate of the padded
#   block is the same.
#
# thin_steps: 4 on CUDA (the float32 steps that end 'tf32', on CUDA cores, ~4.5 TF32
#   products' time each), 0 elsewhere (the CPU's large kernels run 'spectral', other
#   devices the formed float32 iterate). In inference one m×m product each instead of
#   two: H100 (docs/benchmark/cuda_h100_2026-11-27/report.md, `benchmark.py --device cuda
#   --sections speed --models SOFT-S Swin-T --sizes 512x512 800x1344 --rounds 5
#   --skip-official --soft-plans tf32-1-4-pad32`): SOFT-S's forward at 800×1344 96.5 ms
#   against 115.0 ms formed. In a training step at 800×1344 (m = 1056) 4 float32 m×m
#   products instead of 10 (X₀, then Horner's rule on the steps' sum, X₀ again in
#   backward: newton._NewtonPinvThin); H200 (docs/benchmark/cuda_h200_2026-11-28/
#   report.md): SOFT-S's training step at batch 2 280.5 ms against 320.8 ms formed. At
#   512×512 (m = 256), where launches cost more than the flops, training forms them
#   (newton._thin_pays_in_training). The floor on CUDA (7 images, worst map): 384×640
#   4.3e-6, 640×640 4.1e-6, 800×1344 7.0e-6 (formed 8.7e-6).
#
# kernel_chunk, kernel_once_up_to: `--sections kernel --sizes 512x512 640x640 800x1344
#   --rounds 3 --train-batch 1` (SOFT-S's stages 1-3)
# - cpu: a fresh tensor of tens of MB costs page faults on every forward (torch.abs of a
#   44 MB tensor: 19 ms into a new one, 2.2 ms with out=); 4 MB chunks are used while in
#   cache and reuse the same memory. With backward 2^20 was the fastest chunk or within
#   3 % of it at every stage (800×1344 stage 1: 2.92 s, 2^24: 4.38 s). Inference, P once
#   vs 2^20 chunks: up to 2^23.3 elements once wins or they are within noise (512×512
#   stage 3: 7.1 vs 11.2 ms; 640×640 stage 2: 38.6 vs 41.2 ms; 512×512 stage 1: 37.7 vs
#   36.5 ms), from 2^24.3 chunks win (640×640 stage 1: 95 vs 76 ms; 800×1344 stage 2,
#   2^26.1: 444 vs 354 ms; stage 1, 2^27.1: 785 vs 648).
# - cuda (H100, `--device cuda --sections kernel --sizes 512x512 800x1344 --rounds 3`,
#   train batch 2): with backward 2^24 was the fastest chunk tried in all six cases
#   (800×1344 stage 1: 31.5 ms; 2^22 36.3, 2^20 138, 2^18 509). Inference, P once was
#   fastest or within 0.1 ms of the fastest chunk at every stage and size (800×1344
#   stage 1, P of 2^27.1 elements: 4.1 ms vs 6.1 ms with 2^24 chunks).
#
# compiled_kernel_chunks: 4 on every device (docs/benchmark/cpu_compile_2026-11-27.md).
#   Under torch.compile a chunk count from the size (eager's) made Dynamo compile a graph
#   per count, each slowly: SOFT-T's training step at 4 sizes on the CPU, the second size
#   104 s and the third 177 s, against 26 s for the second with 4 chunks, which the next
#   sizes reused.
#
# kernel_products: the library's chunks on every device (P's chunks written by one Triton
#   kernel is a candidate in projects/, not measured on a GPU).
#
# local_conv_layout: `--sections dwconv --sizes 512x512 800x1344` (stages 1-3)
# - cpu: 'channels' faster at every stage and size, most at stage 1 (800×1344: forward
#   7.6 ms vs 177 ms; training step at batch 2 0.36 s vs 1.39 s). Outputs equal.
# - cuda (H100, `--device cuda --sections dwconv --rounds 3`): 'images' faster in 11 of
#   the 12 cases (800×1344 stage 1: forward 0.3 ms vs 1.5 ms, training step at batch 2
#   3.5 ms vs 7.6 ms); 'channels' only in stage 2's training step at 800×1344 (0.7 vs
#   0.9 ms).
_PLANS = {
    'cpu': AttentionPlan(pinv=((128, 'iterative'), (448, 'spectral'), (None, 'tridiagonal'),
                               (None, 'spectral'), (None, 'iterative')),
                         kernel_chunk=2**20, kernel_once_up_to=2**24,
                         local_conv_layout='channels'),
    'cuda': AttentionPlan(pinv=((196, 'iterative'), (None, 'tf32'), (None, 'iterative')),
                          tf32_float32_steps=(1, 4), pinv_pad=32, thin_steps=4,
                          kernel_chunk=2**24, kernel_once_up_to=None,
                          local_conv_layout='images'),
}
PLANS = MappingProxyType(_PLANS)  # read-only; plan_for reads the dict (torch 2.1's
# Dynamo cannot trace a mappingproxy's get)
DEFAULT_PLAN = replace(PLANS['cuda'], pinv='iterative', pinv_pad=1,
                       tf32_float32_steps=TF32_FLOAT32_STEPS, thin_steps=0)


class _Forced(threading.local):
    """The plans forced in this thread: None, or {device type: plan} with the key None
    for device types not named."""

    def __init__(self):
        # Set on the instance (each thread runs this once), never left to the class
        # attribute: Dynamo guards a thread-local's attribute through the instance's
        # dict, and read from the class it missed the first plan forced after a compile
        # (tests/models/attention/test_plan.py, one graph per plan).
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
        **choices: ``AttentionPlan`` fields to replace, e.g. ``pinv='spectral'``,
            ``kernel_chunk=2**18``, ``local_conv_layout='images'``, ``order='official'``.
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


def resolve_pinv_method(method, m, device_type='cpu', dtype=torch.float32, grad=False):
    """The variant name a layer's ``pinv_method`` runs for m landmarks on a device type,
    under the plan in force there, for a kernel of ``dtype`` (eager code, no CUDA graph
    capture): 'auto' is the plan's first variant for m that can run
    (``dispatch.select_variant``), another name itself (or ``VariantNotSupported``)."""
    if method not in pinv_methods():
        raise ValueError(f'pinv_method must be one of {pinv_methods()}, got {method!r}')
    inputs = Inputs(device=device_type, dtype=dtype, m=m, grad=grad, compiling=False,
                    tracing=False, capturing=False)
    return select_variant(method, plan_for(device_type), inputs).name
