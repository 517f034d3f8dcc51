"""SOFT's per-device plan: every choice that depends on where the attention runs.

One immutable ``AttentionPlan`` per device type (``PLANS``; a device type not listed gets
``DEFAULT_PLAN``), with the measurement behind each value beside it. None of the choices
changes what is computed, only how (up to float rounding):

    pinv               how 'auto' computes the 20-step Newton–Raphson iterate, by the
                       landmark count m (``newton.py``)
    eigh_dtype         'spectral': the eigendecomposition's dtype for a float32 kernel
                       ('float64', 'float32', or 'mixed': float32 where a first-order
                       error bound allows it, float64 elsewhere)
    tf32_float32_steps 'tf32': the float32 steps (first, last) around its TF32 steps
    tf32_first_steps   'tf32': its first float32 steps for every batch of kernels
                       ('always') or only for a batch with a kernel that may sit near
                       the step size's boundary ('guarded': a bound on A's top
                       eigenvalue, read on the host; otherwise TF32 steps)
    pinv_pad           the iterations run on the kernel zero-padded to a multiple of
                       this many landmarks (1: none)
    float32_products   the iterations' float32 m×m products ('iterative''s and 'tf32''s
                       float32 steps, the thin steps' X_k), and with 'fused' kernel
                       products the forward kernels' products with P, with
                       'triton_chunks' the products that make P and G: 'float32' (the
                       library's, CUDA cores), 'tf32x3' (three TF32 tensor-core
                       products of split operands, float32's accuracy: on CUDA one
                       Triton kernel per product, ``iterate_matmul.py``; emulated
                       elsewhere, slow) or 'fp16x3' (the same split as three fp16
                       products, operands scaled by powers of two: twice the rate; on
                       CUDA cuBLAS's fp16 products of operands converted once, or
                       with torch < 2.8 the Triton kernel; the Triton kernels'
                       products of P split as 'tf32x3')
    tf32_products      'tf32''s TF32 products: 'tf32' (the library's) or 'fp16'
                       (TF32's rounding from fp16 tensor cores, twice TF32's rate:
                       each operand matrix scaled by a power of two, then rounded to
                       fp16; on CUDA made as 'fp16x3''s, ``iterate_matmul.py``;
                       elsewhere emulated)
    thin_steps         this many of the float32 steps that end 'iterative' and 'tf32'
                       are applied to the thin matrix (one m×m product each instead of
                       two; with gradients where that costs less than forming them, on
                       large kernels one for all of them; at most 'tf32''s last float32
                       steps)
    thin_horner        where the thin steps run as one sum by Horner's rule (one m×m
                       product for all of them) where that costs less than one by one
                       (large kernels): 'training' (with gradients only) or 'always'
                       (in inference too)
    spectral_inference without gradients, how 'spectral' applies its filter, by the
                       landmark count m: 'eigh' (eigenvectors) or 'tridiagonal' (A's
                       tridiagonal form, about half an eigendecomposition but more
                       Python and LAPACK calls per kernel; needs SciPy; its filter is
                       the iterate's within 2.6e-7 at T = 20, not only up to rounding)
    kernel_chunk       row chunks of P = κ(Q, Q̃) of about this many elements, when P is
                       not formed whole (``soft.py``)
    kernel_once_up_to  without gradients P is formed whole up to this many elements
                       (None: always); above, the chunked products run twice
    compiled_kernel_chunks
                       under torch.compile, P in this many row chunks whatever its
                       size (one graph for every image size)
    kernel_products    'chunks' (library products over P's row chunks, above; each chunk
                       made by three library operators), 'triton_chunks' (the same
                       products, each chunk, and in backward G = ∇P ⊙ P with it,
                       written by one Triton kernel: ``triton_chunks.py``) or 'fused'
                       (Triton kernels that compute P block by block and never write
                       it: ``fused.py``); the Triton kernels for float32 on CUDA, eager;
                       otherwise the chunks
    local_conv_layout  how ``HeadSharedConv`` runs the depthwise conv on V ('images':
                       the official grouped conv; 'channels': one depthwise conv over
                       V's h·d channels)
    order              'thin' (ours: P·(Â·(Pᵀ·V)), Â never formed) or 'official' (the
                       official code's order (P·Â)·(Pᵀ·V): the reference the fast paths
                       are checked and timed against)

``plan_for(device_type)`` is the plan in force. A SOFT attention layer reads it once per
forward (``SoftKernelAttention.forward``) and passes it down: ``soft_attention`` takes it
as an argument, and ``newton.py``'s functions take each choice as a plain argument.

``attention_plan(...)`` forces choices for a block of code, in the manner of
``torch.nn.attention.sdpa_kernel`` for SDPA's backends::

    with attention_plan(pinv='spectral'):                  # every device type
        ...
    with attention_plan(kernel_chunk=2**18, device='cpu'):
        ...
    with attention_plan(PLANS['cuda'], device='meta'):     # meta runs what CUDA runs
        ...

Unlike ``sdpa_kernel``'s backend flags, which are process-wide, a forced plan holds in
the thread that forces it only: another thread (a data loader, a second model) keeps the
plans in force there. It is safe under ``torch.compile``: Dynamo guards on the plan a
layer read and recompiles for another one.
"""
import importlib.util
import threading
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Optional, Tuple

from .dtypes import triton_available
from .newton import (EIGH_DTYPE, EXACT_PINV_METHODS, THIN_HORNER, THIN_STEP_METHODS,
                     TF32_FIRST_STEPS, TF32_FLOAT32_STEPS, check_pinv_options,
                     check_spectral_inference, check_thin_steps)

__all__ = [
    'AttentionPlan', 'DEFAULT_PLAN', 'PINV_METHODS', 'PLANS', 'attention_plan', 'plan_for',
    'resolve_pinv_method'
]

# What a SOFT layer's ``pinv_method`` may say: 'auto' (the device's plan, by m), one of
# the exact ways of ``newton.py`` (a plan picks among those), or the fast mode
# 'regularized' (not the T-step iterate: ``newton.regularized_apply``).
PINV_METHODS = ('auto', ) + EXACT_PINV_METHODS + ('regularized', )
LAYOUTS = ('images', 'channels')
KERNEL_PRODUCTS = ('chunks', 'triton_chunks', 'fused')
ORDERS = ('thin', 'official')


def _size_table(value, name):
    """A field chosen by the landmark count, as a tuple of (largest m, choice) pairs
    tried in order, the last with None (every m); a plain choice means every m."""
    table = ((None, value), ) if isinstance(value, str) else tuple(tuple(p) for p in value)
    if not table or any(len(p) != 2 for p in table) or table[-1][0] is not None:
        raise ValueError(f'{name} needs (largest m, choice) pairs, the last (None, choice) '
                         f'for every m, got {value!r}')
    return table


def _for_size(table, m):
    """The choice of a ``_size_table`` for m landmarks."""
    for max_m, choice in table:
        if max_m is None or m <= max_m:
            return choice


@dataclass(frozen=True)
class AttentionPlan:
    """How SOFT's attention runs on one device type (module docstring).

    Args:
        pinv (tuple[tuple[int | None, str]] | str): (largest m, method) pairs tried in
            order, the last with None (every m); a method name means every m.
        eigh_dtype (str): 'float64', 'float32' or 'mixed'.
        tf32_float32_steps (tuple[int, int]): float32 steps before and after 'tf32''s
            TF32 steps.
        tf32_first_steps (str): 'always' or 'guarded'.
        pinv_pad (int): zero-pad the kernel to a multiple of this many landmarks.
        float32_products (str): 'float32', 'tf32x3' or 'fp16x3'.
        tf32_products (str): 'tf32' or 'fp16'.
        thin_steps (int): float32 steps applied to the thin matrix.
        thin_horner (str): 'training' or 'always'.
        spectral_inference (tuple[tuple[int | None, str]] | str): (largest m, 'eigh' or
            'tridiagonal') pairs tried in order, as ``pinv``; a name means every m.
        kernel_chunk (int): elements per row chunk of P.
        kernel_once_up_to (int | None): P formed whole without gradients up to this
            many elements; None: always.
        compiled_kernel_chunks (int): row chunks of P under torch.compile.
        kernel_products (str): 'chunks', 'triton_chunks' or 'fused'.
        local_conv_layout (str): 'images' or 'channels'.
        order (str): 'thin' or 'official'.
    """
    pinv: Tuple[Tuple[Optional[int], str], ...] = ((None, 'iterative'), )
    eigh_dtype: str = EIGH_DTYPE
    tf32_float32_steps: Tuple[int, int] = TF32_FLOAT32_STEPS
    tf32_first_steps: str = TF32_FIRST_STEPS
    pinv_pad: int = 1
    float32_products: str = 'float32'
    tf32_products: str = 'tf32'
    thin_steps: int = 0
    thin_horner: str = THIN_HORNER
    spectral_inference: Tuple[Tuple[Optional[int], str], ...] = ((None, 'eigh'), )
    kernel_chunk: int = 2**24
    kernel_once_up_to: Optional[int] = None
    compiled_kernel_chunks: int = 4
    kernel_products: str = 'chunks'
    local_conv_layout: str = 'images'
    order: str = 'thin'

    def __post_init__(self):
        pinv = _size_table(self.pinv, 'pinv')
        object.__setattr__(self, 'pinv', pinv)
        for _, method in pinv:
            if method not in EXACT_PINV_METHODS:
                raise ValueError(f'pinv methods must be among {EXACT_PINV_METHODS}, got '
                                 f'{method!r}')
        spectral = _size_table(self.spectral_inference, 'spectral_inference')
        object.__setattr__(self, 'spectral_inference', spectral)
        for _, how in spectral:
            check_spectral_inference(how)
        object.__setattr__(self, 'tf32_float32_steps', check_pinv_options(
            self.eigh_dtype, self.tf32_float32_steps, self.pinv_pad, pad_name='pinv_pad',
            float32_products=self.float32_products, tf32_products=self.tf32_products,
            tf32_first_steps=self.tf32_first_steps)['tf32_float32_steps'])
        # thin_steps holds for the methods that end in float32 steps, whether the table
        # or a layer's pinv_method names them (the others take none: ``thin_steps_for``),
        # at most 'tf32''s last ones, after a formed float32 step; the layer's iteration
        # count is checked when it runs
        check_thin_steps(self.thin_steps, 'tf32', self.tf32_float32_steps,
                         thin_horner=self.thin_horner)
        if not isinstance(self.kernel_chunk, int) or self.kernel_chunk < 1:
            raise ValueError(f'kernel_chunk must be a positive int, got {self.kernel_chunk!r}')
        chunks = self.compiled_kernel_chunks
        if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
            raise ValueError(f'compiled_kernel_chunks must be a positive int, got {chunks!r}')
        if self.kernel_products not in KERNEL_PRODUCTS:
            raise ValueError(f'kernel_products must be one of {KERNEL_PRODUCTS}, got '
                             f'{self.kernel_products!r}')
        if self.kernel_products != 'chunks' and not triton_available():
            raise ValueError(f'kernel_products={self.kernel_products!r} needs Triton 3 or '
                             'later (installed with PyTorch on Linux with CUDA), which '
                             'cannot be imported here')
        once = self.kernel_once_up_to
        if once is not None and (not isinstance(once, int) or once < 0):
            raise ValueError(f'kernel_once_up_to must be None or an int >= 0, got {once!r}')
        if self.local_conv_layout not in LAYOUTS:
            raise ValueError(f'local_conv_layout must be one of {LAYOUTS}, got '
                             f'{self.local_conv_layout!r}')
        if self.order not in ORDERS:
            raise ValueError(f'order must be one of {ORDERS}, got {self.order!r}')

    def pinv_method(self, m):
        """The method 'auto' runs for m landmarks."""
        return _for_size(self.pinv, m)

    def spectral_inference_for(self, m):
        """How 'spectral' applies its filter without gradients for m landmarks."""
        return _for_size(self.spectral_inference, m)

    def resolve(self, pinv_method, m):
        """The concrete method a layer's ``pinv_method`` means for m landmarks under this
        plan: 'auto' is ``pinv_method(m)``, any other of ``PINV_METHODS`` itself."""
        if pinv_method not in PINV_METHODS:
            raise ValueError(f'pinv_method must be one of {PINV_METHODS}, got '
                             f'{pinv_method!r}')
        return self.pinv_method(m) if pinv_method == 'auto' else pinv_method

    def thin_steps_for(self, method, iters):
        """The thin steps a layer running ``method`` for ``iters`` steps takes from this
        plan: ``thin_steps`` where the method ends in float32 steps (a layer's
        ``pinv_method`` may name another), after at least one formed step."""
        if method not in THIN_STEP_METHODS:
            return 0
        return min(self.thin_steps, max(iters - 1, 0))

    def pinv_options(self):
        """How the iterate is computed besides its method, as ``newton_pinv_apply``'s
        keyword arguments."""
        return dict(eigh_dtype=self.eigh_dtype, tf32_float32_steps=self.tf32_float32_steps,
                    pad_to=self.pinv_pad, float32_products=self.float32_products,
                    tf32_products=self.tf32_products, tf32_first_steps=self.tf32_first_steps)


# The measurements behind the values (tools/analysis_tools/benchmark.py; docs/en/benchmarks.md,
# docs/en/notes/per_device_plans.md; the GPU report in docs/benchmark/cuda_h100/).
#
# pinv
# - cpu: 2-core x86 CPU, torch 2.14.1. One eigendecomposition beats the 2T products
#   above m = 128 (m = 1025: 2.40 s vs 14.6 s for a batch of 20). With eigh in float64
#   (``newton._spectral_factors``) still so: `--sections pinv --pinv-sizes 100 128 196
#   256 400 --pinv-pad 1`, batch 20, spectral vs the formed iterate: 10.6 / 7.1 ms,
#   18.3 / 15.7, 38.5 / 47.4, 65.5 / 88.5, 166 / 323.
# - cuda: NVIDIA H200, torch 2.11 + CUDA 13 (docs/benchmark/cuda_h200/report.md: the
#   device report's matmul, pinv, fidelity and fp32 steps, and the checks after them).
#   'tf32' above 196 landmarks, the formed float32 iterate up to there.
#   - TF32 products run on the tensor cores, but at full rate only at aligned m: one
#     batched product (20 × m×m) at m = 1024 / 1056 / 1088 ran cuBLAS's sm90 TF32 kernel
#     at 134-154 TFLOP/s, at m = 1025 / 1050 an sm80 one at 74-76 (float32: 35-44).
#     Hence ``pinv_pad`` = 32 below.
#   - `--sections pinv --pinv-sizes 196 256 400 1050 --pinv-pad 32` (batch 20): at
#     m = 1050 'iterative' 47.0 ms, 'tf32' 1+17+2 / 1+15+4 / 1+11+8 steps 27.0 / 29.3 /
#     34.1 ms, on m padded to 1056 16.0 / 19.6 / 27.0 ms; at m = 400 'iterative' 4.0 ms,
#     'tf32' 2.1-2.8 ms; at m = 196 and 256 every method 1.3-2.0 ms (launch-bound), so
#     the float32 iterate, the more accurate, stays there.
#   - The floor on CUDA (tools/analysis_tools/fidelity.py --device cuda, 7 images, real
#     TF32): 1+15+4 steps padded keeps it at 384×640 (worst map 4.0e-6), 640×640 (2.5e-6;
#     on chelsea every path of the thin order missed, the float32 iterate too, 5.1e-5:
#     α's choice at a tie, decided in float64 since: on an H100 2.9e-6-3.1e-6 there,
#     docs/benchmark/cuda_h100_2026-11-27/; docs/en/notes/numerics.md) and 800×1344
#     (1+15+4 unpadded 8.8e-6, the float32 iterate 8.2e-6), gradients within their
#     bound; 1+17+2 misses at 384×640 (1.3e-5)
#     and 640×640 (1.8e-5; gradients 3.3e-2). Hard kernels on CUDA: every schedule
#     from 1+18+1 within half the bound.
#   - SOFT-S at 800×1344 against Swin-T in one run (`--sections speed,train --models
#     SOFT-S Swin-T --soft-plans iterative`): forward 109.3 ms against 225.8 ms with the
#     float32 iterate (Swin-T 10.4 ms), training step at batch 2 340.0 ms against
#     568.7 ms (Swin-T 54.9 ms).
#   'tf32x3' keeps both floors too but was slower than float32 (H100 and H200): opt-in.
#   So do tf32_products='fp16' and float32_products='fp16x3' (H200,
#   docs/benchmark/cuda_h200_2026-11-28/report.md, `benchmark.py --device cuda --sections
#   speed,train --models SOFT-S Swin-T --sizes 800x1344 --rounds 2 --soft-plans ...`):
#   SOFT-S's forward 104.5 ms with 'fp16' (Triton's fp16 product, 80 TFLOP/s, is slower
#   than cuBLAS's TF32, 126), 90.4 ms with both against 92.6 ms for this plan (within the
#   rounds' spread), training step 288.6 against 280.5 ms: opt-in. Those were Triton's
#   fp16 products; with torch 2.8 on they are cuBLAS's fp16 products of operands
#   converted once (``iterate_matmul.fp16_gemm``), not yet timed on a GPU: the device
#   report's `matmul` step times both ways side by side, `fp32` the network.
#
# eigh_dtype ('spectral'): 'mixed' on the CPU (float64 elsewhere: no other plan runs
#   'spectral'). Plain float32 eigh keeps the output floor on real images (worst map
#   6.3e-6 at 800×1344, 6 images; `tools/analysis_tools/fidelity.py --size 800x1344
#   --paths default spectral32`) but misses the hard-kernel bound on near-rank-1
#   landmarks (1.6e-3 to 4.7e-3 from the float64 iterate, bound 1e-3;
#   `tools/analysis_tools/pinv_accuracy.py --sizes 64 196 400 --seeds 0 1 2 3`). 'mixed'
#   splits off the Perron pair in float64 first and decomposes in float64 what its error
#   estimate flags: worst deviation on those kernels 0.53 of the bound, as float64 eigh
#   (``newton._mixed_spectral_factors``). SOFT-S's forward at 800×1344 on the CPU, the
#   three alternated in one process (3 rounds, medians): float64 11.94 s, 'mixed'
#   8.35 s, float32 7.52 s; 20 of its 1050×1050 kernels: eigh float64 2.19 s, float32
#   1.19 s, 'mixed' 1.37 s.
#
# tf32_float32_steps ('tf32'): the first float32 step keeps kernels near the step size's
#   boundary from diverging (the 'boundary' kernels of mmsoft.testing: without it 15× the
#   hard-kernel bound, to inf when rounding to nearest); the last ones remove TF32
#   rounding where Newton's step converges.
# - cuda: (1, 4), the fewest that keep the floor on CUDA itself at 384×640, 640×640 and
#   800×1344 (the pinv entry above; with 2, 1.8e-5 at 640×640).
# - elsewhere (1, 8) (``newton.TF32_FLOAT32_STEPS``, for the opt-in 'tf32', emulated):
#   the emulation cuts operands to TF32 (``truncate_tf32``), which the measurement on
#   the H200 showed to be the pessimistic side (its tensor cores round to nearest:
#   2.8e-6-3.2e-6 from a rounded product, 8e-4-9e-4 from a cut one), and with 4 or 6
#   last steps cut operands left the cat photo 5.6e-5 / 5.2e-5 from float64 at 640×640
#   on the CPU (`tools/analysis_tools/fidelity.py --size 640x640 --gradients
#   --gradient-images astronaut coffee chelsea rocket --paths default cuda spectral32
#   tf32-1-4 tf32-1-6 tf32-1-8`); with 8, maps 4.4e-6 at worst (float32 'iterative':
#   3.7e-6), gradients 5.8e-6; at 800×1344 maps 2.0e-6 (6 images).
#
# tf32_first_steps: 'always' on every plan. 'guarded' (an opt-in, path modifier +guarded)
#   lets a batch of kernels off the first float32 step where α·max_j (|A|·(|A|·1))_j ≤ 1
#   bounds every αλ² (``newton.first_steps_needed``): in inference 4 float32 m×m
#   products per layer instead of 6, in a training step at 800×1344 2 instead of 4. Not
#   yet timed on a GPU (the device report's fp32 and fidelity steps: default+guarded).
#   SOFT-S's kernels on real images sit at 0.006-0.011 (random weights, 384×640); TF32
#   emulated on the CPU the floor holds as before (`tools/analysis_tools/fidelity.py
#   --size 640x640 --paths cuda cuda+guarded --gradients --gradient-images astronaut
#   chelsea`: worst map 3.6e-6 against 3.7e-6, the astronaut's gradients 9.5e-6 against
#   1.0e-5; docs/en/notes/numerics.md).
#
# pinv_pad: 32 on CUDA (the aligned TF32 kernels above; zero padding changes no value:
#   the iterate of the padded block is the same), 1 elsewhere. Open: the matmul
#   section's call sweep (`device_report.py --part decide`, step decide-matmul) times
#   1050 landmarks padded to 1056, 1088, 1152 and 1280, each way a TF32 product can be
#   called (cuBLAS, cuBLASLt, TunableOp; the step's baddbmm or bmm alone), at SOFT-S's
#   batches: not measured yet (docs/en/notes/per_device_plans.md, "How fast one TF32
#   product runs").
#
# thin_steps: CUDA's 4 last float32 steps applied to the thin matrix (they run on CUDA
#   cores, ~4.5 TF32 products' time each). In inference one m×m product each instead
#   of two: 6 float32 m×m products per layer instead of 10. In a training step at
#   800×1344 (m = 1056) 4 instead of 10 (X₀, then Horner's rule on the steps' sum, X₀
#   again in backward: newton._NewtonPinvThin); at 512×512 (m = 256), where launches
#   cost more than the flops, training forms them (newton._thin_pays_in_training).
#   0 elsewhere (not timed: the CPU's large kernels run 'spectral', other devices the
#   formed float32 iterate).
# - Training: not yet timed on a GPU. On the CPU (2-core AVX2), `benchmark.py
#   --sections pinv --pinv-sizes 1050 --pinv-pad 1 --repeat 1`, the float32 iterate of
#   20 kernels with backward: formed 17.5 s, the last 4 thin 14.9 s (34 m×m products
#   instead of 40). Gradients (TF32 emulated, `fidelity.py --size 640x640 --gradients
#   --gradient-images astronaut --paths cuda tf32-1-4-pad32 official`, the steps thin at
#   every layer) 1.1e-5 as formed (bound 1e-4); hard kernels at m = 1024 and 1156 within
#   0.23 of the bound, as formed. Inference applies the steps one by one (thin_horner
#   below).
# - cuda, inference (H100, docs/benchmark/cuda_h100_2026-11-27/report.md): SOFT-S's
#   forward at 800×1344, `benchmark.py --device cuda --sections speed --models SOFT-S
#   Swin-T --sizes 512x512 800x1344 --rounds 5 --skip-official --soft-plans
#   tf32-1-4-pad32`:
#   96.5 ms against 115.0 ms formed (Swin-T 12.1 ms: 7.95× instead of 9.47×); at
#   512×512 28.6 against 30.1 ms. The profile at 800×1344: the float32 m×m products
#   29.4 ms in 66 launches against 49.1 ms in 110; the TF32 ones 32.7 ms either way.
#   Training then formed the iterate (362 ms either way). The floor on CUDA
#   (`tools/analysis_tools/fidelity.py --device cuda --size S --paths official default
#   tf32-1-4-pad32`, 7 images, worst map; and the device report's fidelity step):
#   384×640 4.3e-6 (formed 4.3e-6, the official order 4.3e-6), 640×640 4.1e-6 (4.0e-6,
#   4.3e-6), 800×1344 7.0e-6 (formed 8.7e-6; bound on the astronaut 1.6e-5, twice the
#   float32 official order's). TF32 emulated on the CPU it keeps the hard-kernel bound
#   (within 1.5× of the formed schedule where its last float32 steps matter;
#   tests/models/attention/test_attention.py).
#
# thin_horner: 'training' on every plan. 'always' (an opt-in, path modifier +horner)
#   applies the thin steps by Horner's rule in inference too where that costs less
#   (newton._horner_steps): at 800×1344 (m = 1056) one float32 m×m product per layer
#   for CUDA's 4 thin steps instead of 4. Not yet timed on a GPU (the device report's
#   fp32 step: default+horner; --part decide: default+guarded+horner). The steps apply
#   V first (newton._NewtonPinvThin), so Horner's rule keeps the floor as one by one
#   does: TF32 emulated on the CPU, SOFT-S at 800×1344, worst map one by one / Horner's
#   rule 2.0e-6 / 2.0e-6 (astronaut), 1.5e-6 / 1.9e-6 (page), 1.8e-6 / 1.9e-6 (blank),
#   1.8e-6 / 1.7e-6 (cat); with V applied last Horner's rule took the astronaut to
#   8.6e-6 (docs/en/notes/numerics.md).
#
# spectral_inference: on the CPU where SciPy is installed 'eigh' up to 448 landmarks,
#   'tridiagonal' above ('eigh' at every m without it; no other plan runs 'spectral').
# - By m: SOFT-S's forward, `benchmark.py --sections speed --models SOFT-S Swin-T --sizes
#   512x512 512x672 640x640 640x768 512x1024 800x1344 --soft-plans spectral-mixed
#   spectral-tridiagonal --repeat 1 --rounds 4 --skip-official` (2-core AVX-512, medians
#   of 4 interleaved rounds; docs/benchmark/cpu_spectral_inference_2026-11-29.json),
#   eigh / 'tridiagonal' at every m: m = 256 (512×512) 884.0 ms / 1.074 s, 336
#   (512×672) 1.182 / 1.349 s, 400 (640×640) 1.583 / 1.724 s, 480 (640×768) 2.340 /
#   2.609 s, 512 (512×1024) 2.592 / 2.750 s, 1050 (800×1344) 8.606 / 9.002 s; this plan
#   842.0 ms, 1.192, 1.510, 2.287, 2.593 and 9.548 s (Swin-T 524.3 ms-2.384 s). The
#   same path timed twice in that run (this plan and 'tridiagonal' above 448) differed
#   by up to 14 %: from m = 480 up the two ways are within that noise there, and on a
#   2-core AVX2 CPU the tridiagonal form won at m = 1050 (below); below ~450 eigh wins
#   by more. Small kernels pay the tridiagonal form's fixed cost per kernel (nine banded
#   solves through SciPy, two Householder applications, two Sturm counts in Python),
#   which a large kernel's reduction outweighs. The floor at 512×512, where this plan
#   now takes eigh (`tools/analysis_tools/fidelity.py --size 512x512 --paths default
#   spectral-tridiagonal`, 7 images), worst map: this plan 9.4e-7-3.7e-6, 'tridiagonal'
#   1.0e-6-3.4e-6 (gradients: eigh either way).
# - At 800×1344 (m = 1050): `benchmark.py --sections speed --models SOFT-S
#   Swin-T --sizes 800x1344 --soft-plans spectral-mixed spectral-tridiagonal --repeat 1
#   --rounds 4 --skip-official` (2-core AVX2, medians of 4 interleaved rounds): SOFT-S
#   13.27 s with 'tridiagonal' against 14.15 s and 14.19 s with eigh (the plan then,
#   and 'spectral-mixed'), Swin-T 2.75 s: 4.83× instead of 5.15×; then with SciPy's
#   LAPACK on the calling thread (newton._one_blas_thread), three runs: SOFT-S 12.34,
#   11.18 and 10.53 s, Swin-T 2.69, 2.75 and 2.89 s (4.59×, 4.07×, 3.64×; eigh 5.23×,
#   4.74×, 4.42×).
#   Timers in one forward, before that change:
#   the 84 kernels 6.2-6.8 s against 7.0-8.5 s (ssytrd 3.2-3.5 s, the two Householder
#   applications 0.95 s, the solves 0.8 s, the Perron split 0.85 s). The floor
#   (`tools/analysis_tools/fidelity.py --size 640x640 --paths spectral-mixed
#   spectral-tridiagonal`, 7 images; `--size 800x1344 --images astronaut page blank`),
#   worst map eigh / tridiagonal: 640×640 2.4e-6-3.3e-6 / 2.3e-6-3.3e-6, 800×1344
#   3.2e-6-3.9e-6 / 2.6e-6-4.5e-6; with LAPACK on one thread 640×640 2.4e-6-3.7e-6,
#   800×1344 2.9e-6-4.5e-6. On SOFT-S's kernels at 800×1344 the iterate itself
#   is closer to float64 (3e-6-4e-5 against eigh's 8e-6-2.2e-4); the hard-kernel bound
#   holds (tests/models/attention/test_attention.py).
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
#   train batch 2; the 'layout' step of device_report.py): with backward 2^24 was the
#   fastest chunk tried in all six cases (800×1344 stage 1: 31.5 ms; 2^22 36.3, 2^20 138,
#   2^18 509). Inference, P once was fastest or within 0.1 ms of the fastest chunk at
#   every stage and size (800×1344 stage 1, P of 2^27.1 elements: 4.1 ms vs 6.1 ms with
#   2^24 chunks).
#
# compiled_kernel_chunks: 4 on every device (docs/benchmark/cpu_compile_2026-11-27.md).
#   Under torch.compile a chunk count from the size (eager's) made Dynamo compile a graph
#   per count, each slowly: SOFT-T's training step at 4 sizes on the CPU, the second size
#   104 s and the third 177 s, against 26 s for the second with 4 chunks, which the next
#   sizes reused. Fewer chunks, a smaller graph: SOFT-S's training step with the chunks
#   CUDA's plan takes at 800×1344 and batch 2 (17, 9, 6 per layer in stages 1-3) 16.8k
#   ATen operators and 200 s in Inductor on the CPU, with 4 chunks 12.5k and 149 s (one:
#   9.1k). Not yet measured on a GPU: the compiled step's time and peak memory (stage 1's
#   P at 800×1344, batch 2, in chunks of 282 MB instead of 64 MB).
#
# local_conv_layout: `--sections dwconv --sizes 512x512 800x1344` (stages 1-3)
# - cpu: 'channels' faster at every stage and size, most at stage 1 (800×1344: forward
#   7.6 ms vs 177 ms; training step at batch 2 0.36 s vs 1.39 s). Outputs equal.
# - cuda (H100, `--device cuda --sections dwconv --rounds 3`, the 'layout' step):
#   'images' faster in 11 of the 12 cases (800×1344 stage 1: forward 0.3 ms vs 1.5 ms,
#   training step at batch 2 3.5 ms vs 7.6 ms); 'channels' only in stage 2's training
#   step at 800×1344 (0.7 vs 0.9 ms).
# 'tridiagonal' needs SciPy (MMDetection and MMSegmentation require it; MMPretrain not)
_CPU_SPECTRAL_INFERENCE = (((448, 'eigh'), (None, 'tridiagonal'))
                           if importlib.util.find_spec('scipy') else 'eigh')
_PLANS = {
    'cpu': AttentionPlan(pinv=((128, 'iterative'), (None, 'spectral')), eigh_dtype='mixed',
                         spectral_inference=_CPU_SPECTRAL_INFERENCE, kernel_chunk=2**20,
                         kernel_once_up_to=2**24, local_conv_layout='channels'),
    'cuda': AttentionPlan(pinv=((196, 'iterative'), (None, 'tf32')),
                          tf32_float32_steps=(1, 4), pinv_pad=32, thin_steps=4,
                          kernel_chunk=2**24, kernel_once_up_to=None,
                          local_conv_layout='images'),
}
PLANS = MappingProxyType(_PLANS)  # read-only; plan_for reads the dict (torch 2.1's
# Dynamo cannot trace a mappingproxy's get)
# Device types without measurements (xpu, mps, meta, ...) run the formed float32 iterate
# with CUDA's other choices: it needs no eigendecomposition, which not every backend has,
# and no TF32 products, which only CUDA runs natively (elsewhere they are emulated).
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


def resolve_pinv_method(method, m, device_type='cpu'):
    """The concrete method a layer's ``pinv_method`` means for m landmarks on a device type:
    'auto' is the plan in force there (``plan_for(device_type).pinv_method(m)``), any
    other of ``PINV_METHODS`` itself."""
    return plan_for(device_type).resolve(method, m)
