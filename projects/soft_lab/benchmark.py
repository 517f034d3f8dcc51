"""The lab's benchmark sections: the measurements behind SOFT's per-device plan
(``AttentionPlan`` in mmsoft/models/attention/plan.py), one section per choice of it (the
candidates are timed as paths, by the library's ``--soft-plans``). Importing this module
adds them to ``mmsoft.benchmark.SECTIONS`` ahead of the library's (``register``);
tools/analysis_tools/benchmark.py imports it with ``--import projects.soft_lab``:

  pinv    the batched 20-step pseudo-inverse alone, by landmark count m, by method (the
          formed iterate, A⁺·Z as inference computes it and with its backward as
          training does, with the last steps applied to the thin matrix, 'spectral', on
          CUDA the TF32 schedules), also on A zero-padded to aligned sizes: decides
          ``pinv`` and its ``TF32``'s options (``float32_steps``, ``pad_to``,
          ``thin_steps``)
  matmul  the rate of one m×m product in float32 and TF32: whether TF32 reaches the
          tensor cores; which call of a TF32 or float32 product (the step's or the
          product alone, cuBLAS or cuBLASLt, TunableOp) and which padded m run a
          landmark kernel fastest: ``TF32.pad_to`` and how the steps call their
          products
  dwconv  the depthwise conv on V of SOFT-S's stages 1-3 in both layouts of
          ``HeadSharedConv``: decides ``local_conv_layout``
  kernel  the kernel products κ(Q, Q̃)ᵀ·V and κ(Q, Q̃)·W of SOFT-S's stages 1-3, P
          formed once vs in row chunks, with and without backward: decides
          ``kernel_chunk`` and ``kernel_once_up_to``
"""
import math
import os
import tempfile
from contextlib import contextmanager, nullcontext
from functools import partial

import numpy as np
import torch

from mmsoft.benchmark import SECTIONS
from mmsoft.benchmark.common import build, fmt, parse_size, time_call
from mmsoft.models.attention import attention_plan
from mmsoft.models.attention.dtypes import new_tf32_flags

__all__ = ['LAB_SECTIONS', 'register', 'section_dwconv', 'section_kernel', 'section_matmul',
           'section_pinv']


# ------------------------------------------------------------------------------- pinv
ITERS = 20  # the official T


def _formed(A, float32_steps, pad_to=1):
    """The formed iterate of ``variants.tf32_schedule(T, float32_steps)``, as training
    forms it for backward (``newton.TF32.apply``'s formed path) on A zero-padded to a
    multiple of ``pad_to`` landmarks and cut back; with ``float32_steps`` (T, 0) the
    reference's float32 steps."""
    from mmsoft.models.attention import newton

    from .variants import tf32_schedule
    m = A.shape[-1]
    A3, = newton._flat_padded(A, pad_to)
    V = newton.newton_alpha(A, nonnegative=True).reshape(-1, 1, 1) * A3
    V = newton._newton_steps(A3, V, tf32_schedule(ITERS, float32_steps))
    return V[:, :m, :m].reshape(A.shape)


def _iterative_formed(A, Z, pad_to=1):
    """The reference iterate formed (``newton.newton_pinv``); padded (``_formed``), its
    T float32 steps on A zero-padded to a multiple of ``pad_to``, the same iterate."""
    from mmsoft.models.attention import newton
    if pad_to == 1:
        return newton.newton_pinv(A, ITERS, nonnegative=True)
    return _formed(A, (ITERS, 0), pad_to)


def _iterative_applied(A, Z, pad_to=1):
    """A⁺·Z by the reference ('iterative': the formed iterate times Z); padded, its T
    float32 steps through ``newton.TF32``'s padding (float32 steps only: the same
    iterate)."""
    from mmsoft.models.attention import TF32, VARIANTS
    if pad_to == 1:
        return VARIANTS['iterative'].apply(A, Z, ITERS)
    return TF32(float32_steps=(ITERS, 0), pad_to=pad_to).apply(A, Z, ITERS)


def _tf32_applied(A, Z, float32_steps=(ITERS, 0), thin_steps=0, pad_to=1):
    """A⁺·Z as inference computes it through ``newton.TF32``: TF32 products
    between ``float32_steps`` (``(T, 0)``: float32 steps only, the reference's), the last
    ``thin_steps`` applied to Z; unpadded unless ``pad_to`` says otherwise, whatever the
    plan pads."""
    from mmsoft.models.attention import TF32
    return TF32(float32_steps=tuple(float32_steps), pad_to=pad_to,
                thin_steps=thin_steps).apply(A, Z, ITERS)


def _tf32_formed(A, Z, float32_steps, pad_to=1):
    """The formed TF32 iterate (``_formed``)."""
    return _formed(A, float32_steps, pad_to)


def _trained(apply, A, Z, pad_to=1, **kwargs):
    """A⁺·Z by ``apply`` and its backward (Eq. 16, with ∇W = Z), as a training step
    computes them (padding as above): with thin steps, thin where that costs less than
    forming them (``newton._thin_pays_in_training``)."""
    with torch.enable_grad():
        A = A.detach().requires_grad_()
        W = apply(A, Z, pad_to=pad_to, **kwargs)
        W.backward(Z)
    return W.detach()


def _spectral(A, Z):
    """A⁺·Z by one eigendecomposition (``spectral.spectral_apply``)."""
    from mmsoft.models.attention.spectral import spectral_apply
    return spectral_apply(A, Z, ITERS, nonnegative=True)


def pinv_columns(args):
    """{column: fn(A, Z)} of the pinv section: every way the plan can compute the
    iterate on this device, with m zero-padded to a multiple of ``--pinv-pad`` too.
    'iterative, last 4 thin, training' is the reference's float32 steps with the last 4
    thin (``TF32`` with float32 steps (16, 4): no TF32 step)."""
    cols = {
        'iterative': _iterative_formed,
        'iterative, applied': _iterative_applied,
        'iterative, training': partial(_trained, _iterative_applied),
        'iterative, last 4 thin, training': partial(
            _trained, _tf32_applied, float32_steps=(ITERS - 4, 4), thin_steps=4),
        'spectral': _spectral,
    }
    if args.device == 'cuda':  # elsewhere TF32 is only emulated
        for first, last in args.tf32_schedules:
            name = f'tf32 {first}+{ITERS - first - last}+{last}'
            steps = (first, last)
            cols[f'{name}, applied'] = partial(_tf32_applied, float32_steps=steps)
            cols[name] = partial(_tf32_formed, float32_steps=steps)
            if last:
                cols[f'{name}, last {last} thin'] = partial(
                    _tf32_applied, float32_steps=steps, thin_steps=last)
                cols[f'{name}, training'] = partial(_trained, _tf32_applied,
                                                    float32_steps=steps)
                cols[f'{name}, last {last} thin, training'] = partial(
                    _trained, _tf32_applied, float32_steps=steps, thin_steps=last)
    k = args.pinv_pad
    if k > 1:  # the iterations again on sizes padded to a multiple of k
        for name in [c for c in cols if not c.startswith('spectral')]:
            cols[f'{name}, m padded to ×{k}'] = partial(cols[name], pad_to=k)
    return cols


def section_pinv(args, out):
    """Batched 20-step pseudo-inverse of Gaussian-kernel matrices, by method."""
    from mmsoft.models.attention import gaussian_kernel
    cols = pinv_columns(args)
    lines = ['| m | batch | ' + ' | '.join(cols) + ' |', '|---|---|' + '---|' * len(cols)]
    rows = {}
    for m in args.pinv_sizes:
        x = torch.randn(20, m, 32, device=args.device) * 0.3
        A = gaussian_kernel(x, x)
        Z = torch.randn(20, m, 32, device=args.device)
        t = {}
        with torch.no_grad():
            for name, fn in cols.items():
                t[name] = time_call(args, lambda: fn(A, Z))
        rows[m] = t
        lines.append(f'| {m} | 20 | ' + ' | '.join(f'{v * 1e3:.1f} ms' for v in t.values())
                     + ' |')
    out['pinv'] = rows
    lines.append("\n'iterative' forms the iterate (2T products, what training keeps for "
                 "backward); 'applied' is A⁺·Z for a thin 32-column Z as inference "
                 "computes it (the formed iterate times Z); 'spectral': one "
                 'eigendecomposition (float32 where a first-order bound allows it, else '
                 "float64) and A⁺·Z; 'tf32 F+M+L': F float32 steps, M with TF32 products, "
                 "L float32 steps; 'last L thin': those L applied to Z (L m×m products "
                 "instead of 2L; 'iterative, last 4 thin': the reference's float32 steps, "
                 "the last 4 applied to Z); 'training': A⁺·Z and its backward (Eq. 16), "
                 'thin where that costs less than forming the steps.')
    if args.pinv_pad > 1:
        lines.append(f"'padded': A with zero rows and columns up to a multiple of "
                     f'{args.pinv_pad} (the same iterate on its block; aligned sizes for '
                     'the matrix products), the result cut back.')
    return lines


# ----------------------------------------------------------------------------- matmul
def _product(kind, a, b):
    """One batched product of the iteration's shape (2a - a·b), as ``kind`` runs it."""
    from mmsoft.models.attention import newton
    if kind == 'float32':
        return torch.baddbmm(a, a, b, beta=2, alpha=-1)
    with newton.cuda_tf32_matmuls():  # 'tf32': what a TF32 step of 'tf32' runs
        return torch.baddbmm(a, a, b, beta=2, alpha=-1)


def _gpu_kernels(fn):
    """The names of the GPU kernels one call of ``fn`` launches (torch.profiler), or
    why they could not be traced (a profiler that cannot trace: the times stand)."""
    from torch.profiler import ProfilerActivity, profile
    try:
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    except RuntimeError as e:
        return [f'(not traced: {e})']
    return sorted({e.key for e in prof.key_averages()
                   if getattr(e, 'device_type', None) == torch.autograd.DeviceType.CUDA})


def _cut_tf32(x):
    """float32 values cut to TF32 (the 13 low mantissa bits zeroed), still float32."""
    return (x.contiguous().view(torch.int32) & -0x2000).view(torch.float32)


def _tf32_conversion(m, device):
    """{conversion: max |Δ| / max |product|} of one batched TF32 product against the
    float64 product of its operands rounded to nearest (``round_tf32``), cut
    (``_cut_tf32``) or left as they are."""
    from mmsoft.models.attention import newton
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(8, m, m, device=device, generator=g) for _ in range(2))
    with newton.cuda_tf32_matmuls():
        c = torch.bmm(a, b).double()
    scale = c.abs().max()
    return {name: ((c - torch.bmm(conv(a).double(), conv(b).double())).abs().max()
                   / scale).item()
            for name, conv in (('rounded', newton.round_tf32), ('cut', _cut_tf32),
                               ('float32', lambda t: t))}


# -------------------------------------------------------- matmul: the product's calls
# The batches of the call sweep (``_call_sweep``): SOFT-S's landmark kernels per layer at
# 800×1344 are 2, 4 and 10 per image in stages 1-3 (its heads), twice that in a training
# step at batch 2.
CALL_BATCHES = (2, 4, 10, 20)
# the batch whose GPU kernels the sweep traces (stage 3's, 70 of SOFT-S's 84 kernels)
TRACED_BATCH = 10


@contextmanager
def _blas_library(name):
    """torch's preferred BLAS library for CUDA products ('cublas' or 'cublaslt') inside
    the block, restored after (a process-wide setting)."""
    library = torch.backends.cuda.preferred_blas_library
    old = library()
    library(name)
    try:
        yield
    finally:
        library(old)


@contextmanager
def _tunable_op():
    """torch's TunableOp on, tuning included, inside the block: each new product shape
    is timed once with every implementation TunableOp has for it (on CUDA cuBLASLt's
    heuristic candidates), the fastest kept; results in a temporary file. Its settings
    are restored after, except that the results are no longer written at exit (the
    file is gone by then; torch has no getter for that setting)."""
    tunable = torch.cuda.tunable
    old = (tunable.is_enabled(), tunable.tuning_is_enabled(), tunable.get_filename())
    with tempfile.TemporaryDirectory() as tmp:
        try:  # restored whatever step of switching it on raises
            tunable.set_filename(os.path.join(tmp, 'tunableop_results.csv'))
            if hasattr(tunable, 'write_file_on_exit'):
                tunable.write_file_on_exit(False)
            tunable.enable(True)
            tunable.tuning_enable(True)
            yield
        finally:
            tunable.tuning_enable(old[1])
            tunable.enable(old[0])
            tunable.set_filename(old[2])


@contextmanager
def _tuned_lt():
    """cuBLASLt preferred and TunableOp on (``_blas_library``, ``_tunable_op``); the
    library is restored even where TunableOp refuses to start."""
    with _blas_library('cublaslt'), _tunable_op():
        yield


def _step_call(c, a, b):
    """2c - a·b: the Newton step's call (``newton._newton_steps``; c is V, a·b V·X)."""
    return torch.baddbmm(c, a, b, beta=2, alpha=-1)


def _product_call(c, a, b):
    """a·b alone: no epilogue, so no copy of c into the result first."""
    return torch.bmm(a, b)


def _transposed_call(c, a, b):
    """a·b as (bᵀ·aᵀ)ᵀ: the same sums in the other operand layout (a transposed view)."""
    return torch.bmm(b.mT, a.mT).mT


def _calls(device):
    """{column: (fn(c, a, b), is_step, context)} for the ways ``device`` can make one
    batched product of the iteration, each called inside ``context()``: the step's call
    (is_step: 2c - a·b), the product alone, in the other operand layout; on CUDA also
    through cuBLASLt (torch's preferred_blas_library) and through TunableOp's choice
    among cuBLASLt's candidates."""
    calls = {'baddbmm': (_step_call, True, nullcontext),
             'bmm': (_product_call, False, nullcontext),
             'bmm, transposed': (_transposed_call, False, nullcontext)}
    if device == 'cuda' and hasattr(torch.backends.cuda, 'preferred_blas_library'):
        lt = partial(_blas_library, 'cublaslt')
        calls['baddbmm, cuBLASLt'] = (_step_call, True, lt)
        calls['bmm, cuBLASLt'] = (_product_call, False, lt)
        if hasattr(torch.cuda, 'tunable'):
            calls['bmm, cuBLASLt, TunableOp'] = (_product_call, False, _tuned_lt)
    return calls


def _call_sweep(args, sizes, precision, batches=CALL_BATCHES):
    """One ``precision`` product ('tf32' or 'float32'; TF32 on CUDA only) made by every
    call of ``_calls`` at every m of ``sizes`` and batch of ``batches``: {'times': {m:
    {batch: {column: seconds}}}, 'deviations': {m: {column: max |Δ| / max |ref|}},
    'kernels': {column: {m: GPU kernels at batch ``TRACED_BATCH``}}, 'tuned':
    TunableOp's choices, 'failed': {column: the error that stopped it}} (a failed
    column's times None from there on). A deviation is the call's result against
    float64 (the first batch): ~1e-4 to 1e-3 for TF32 products, ~1e-6 for float32 ones,
    so it says which precision ran."""
    from mmsoft.models.attention import newton
    calls = _calls(args.device)
    out = {'times': {}, 'deviations': {}, 'kernels': {}, 'tuned': [], 'failed': {}}
    tf32 = newton.cuda_tf32_matmuls if precision == 'tf32' else nullcontext
    g = torch.Generator(device=args.device).manual_seed(0)
    for m in sizes:
        times = out['times'][m] = {}
        for batch in batches:
            a, b = (torch.randn(batch, m, m, device=args.device, generator=g) / m**0.5
                    for _ in range(2))
            ref = torch.bmm(a.double(), b.double()) if batch == batches[0] else None
            times[batch] = {}
            for name, (fn, step, context) in calls.items():
                times[batch][name] = None
                if name in out['failed']:
                    continue
                try:
                    with tf32(), context():
                        times[batch][name] = time_call(args, partial(fn, a, a, b), runs=20)
                        if ref is not None:
                            r = 2 * a.double() - ref if step else ref
                            d = (fn(a, a, b).double() - r).abs().max() / r.abs().max()
                            out['deviations'].setdefault(m, {})[name] = d.item()
                        if args.device == 'cuda' and batch == TRACED_BATCH:
                            out['kernels'].setdefault(name, {})[m] = _gpu_kernels(
                                partial(fn, a, a, b))
                        if context is _tuned_lt:
                            out['tuned'] = [', '.join(map(str, r))
                                            for r in torch.cuda.tunable.get_results()]
                except RuntimeError as e:  # an experimental library path: the others stand
                    out['failed'][name] = f'{type(e).__name__}: {str(e)[:300]}'
    return out


def _call_lines(sweep, precision):
    """A ``_call_sweep``'s table (µs per kernel and TFLOP/s per column, by m and batch),
    its deviations, traced kernels and TunableOp's choices, as the matmul section
    prints them."""
    times, deviations, kernels = sweep['times'], sweep['deviations'], sweep['kernels']
    first = next(iter(times.values()))  # {batch: {column: seconds}} of the first m
    first_batch = next(iter(first))  # the batch the deviations were measured at
    names = list(first[first_batch])
    lines = ['', '| m | batch | ' + ' | '.join(f'{n}: µs per kernel, TFLOP/s'
                                                for n in names) + ' |',
             '|---|---|' + '---|' * len(names)]
    for m, rows in times.items():
        for batch, t in rows.items():
            lines.append(f'| {m} | {batch} | ' + ' | '.join(
                '–' if t[n] is None else
                f'{t[n] / batch * 1e6:.0f}, {2 * batch * m**3 / t[n] / 1e12:.3g}'
                for n in names) + ' |')
    shown = {'tf32': 'TF32', 'float32': 'float32'}[precision]
    lines.append(
        f"\nOne batched {shown} product of the iteration (a·b, or the step's 2a - a·b), "
        'each way it can be called, in µs per landmark kernel: for a batch, the m with '
        'the least time is the padding that runs a kernel of fewer landmarks fastest; '
        "TFLOP/s counts 2m³ per product. baddbmm: the Newton step's call (torch copies a "
        "into the result, which the product's epilogue then updates); bmm: the product "
        "alone; transposed: (bᵀ·aᵀ)ᵀ; cuBLASLt: torch's preferred_blas_library; "
        "TunableOp: torch.cuda.tunable's fastest of cuBLASLt's candidates for the shape "
        '(tuned once, before the timing).')
    lines.append(f'\nDeviation from the float64 result (max |Δ| / max |ref|, batch '
                 f'{first_batch}): ~1e-4 to 1e-3 where TF32 products ran (operands '
                 'rounded to 10 bits), ~1e-6 for float32 ones.\n')
    lines += [f'- m = {m}: ' + ', '.join(f'{n} {v:.1e}' for n, v in d.items())
              for m, d in deviations.items()]
    if kernels:
        lines.append('')
        lines += [f'GPU kernels of {n} at m = {m}, batch {TRACED_BATCH}: '
                  + ', '.join(f'`{k}`' for k in ks)
                  for n, per_m in kernels.items() for m, ks in per_m.items()]
    lines += [f'- {n} failed (–): {why}' for n, why in sweep['failed'].items()]
    if sweep['tuned']:
        lines.append(f"\nTunableOp's choices, {shown} (operator, shape, solution, ms): "
                     + '; '.join(sweep['tuned']))
    return lines


def section_matmul(args, out):
    """The rate of the iteration's m×m products: float32 and TF32, at aligned and
    unaligned m (CUDA; on another device only float32), and how the GPU converts TF32
    operands and which GEMM kernels run. Then the call sweep (``_call_sweep``): one TF32
    and one float32 product called each way torch can call it, at SOFT-S's landmark
    batches, per padded m (on another device float32 only)."""
    from mmsoft.models.attention import newton
    kinds = ('float32', 'tf32') if args.device == 'cuda' else ('float32', )
    sizes = sorted({*args.matmul_sizes})
    lines = ['| m | batch | ' + ' | '.join(f'{k}: ms, TFLOP/s' for k in kinds) + ' |',
             '|---|---|' + '---|' * len(kinds)]
    if args.device == 'cuda':
        mm = torch.backends.cuda.matmul

        def flag():
            return (f'fp32_precision={mm.fp32_precision!r}' if new_tf32_flags() else
                    f'allow_tf32={mm.allow_tf32}')

        setting = flag()
        with newton.cuda_tf32_matmuls():
            inside = flag()
        lines.insert(0, f'cuBLAS float32 products: {setting} outside the TF32 steps, '
                     f'{inside} inside them.\n')
    rows = {}
    for m in sizes:
        a = torch.randn(20, m, m, device=args.device) / m**0.5
        b = torch.randn(20, m, m, device=args.device) / m**0.5
        flops = 2 * 20 * m**3
        t = {k: time_call(args, partial(_product, k, a, b)) for k in kinds}
        rows[m] = t
        lines.append(f'| {m} | 20 | ' + ' | '.join(
            f'{t[k] * 1e3:.2f} ms, {flops / t[k] / 1e12:.0f}' for k in kinds) + ' |')
    if args.device == 'cuda':  # how tensor cores convert float32 operands to TF32
        conversion = {m: _tf32_conversion(m, args.device) for m in sizes}
        out['tf32_conversion'] = conversion
        lines.append('\nA TF32 product against the float64 product of its operands rounded '
                     'to TF32 to nearest / cut to TF32 / not converted (max |Δ| / max '
                     '|product|, 8 m×m matrices): the conversion the GPU applies is the '
                     'one near float32 summation error (~1e-6).\n')
        lines += [f'- m = {m}: ' + ', '.join(f'{k} {v:.1e}' for k, v in c.items())
                  for m, c in conversion.items()]
    if args.device == 'cuda':
        kernels = {}  # which GEMM kernels ran: tensor-core ones say 'tf32'
        for m in sizes:
            a = torch.randn(20, m, m, device=args.device)
            for k in kinds:
                kernels[f'{k} at m = {m}'] = _gpu_kernels(partial(_product, k, a, a))
        out['matmul_kernels'] = kernels
        lines.append('')
        lines += [f'GPU kernels of {name}: ' + ', '.join(f'`{n}`' for n in names)
                  for name, names in kernels.items()]
    out['matmul'] = rows
    lines.append('\nOne batched product a·b (as baddbmm 2a - a·b, the step\'s call) of 20 '
                 'm×m matrices; TFLOP/s counts 2m³ per product. TF32 tensor cores should '
                 'reach several times the float32 rate; if they do not at an aligned m, '
                 'the TF32 setting does not reach the products that run.')
    # which call of a product, and which padding, runs a landmark kernel fastest
    out['calls'] = {}
    for precision in ('tf32', 'float32') if args.device == 'cuda' else ('float32', ):
        out['calls'][precision] = sweep = _call_sweep(args, sizes, precision)
        lines += _call_lines(sweep, precision)
    return lines


# ----------------------------------------------------------------- SOFT-S's stages 1-3
def _soft_stages(soft, size):
    """(stage, heads h, head dim d, (H, W) token grid) of SOFT-S's stages 1-3 (strides 4,
    8, 16) at an input size 'HxW'."""
    H, W = parse_size(size)
    for s in range(3):
        stride = 4 * 2**s
        yield (s, soft.num_heads[s], soft.embed_dims[s] // soft.num_heads[s],
               (-(-H // stride), -(-W // stride)))


def _head_tokens(args, batch, hw, h, d):
    """Random Q or V as a SOFT block makes them: the (B, N, h·d) projection viewed as
    (B, h, N, d)."""
    return torch.randn(batch, hw[0] * hw[1], h, d, device=args.device).transpose(1, 2)


# ----------------------------------------------------------------------------- dwconv
def _dwconv_step(conv, v, hw, layout, train):
    if not train:
        with torch.no_grad():
            return conv(v, hw, layout)
    conv(v, hw, layout).sum().backward()
    conv.zero_grad(set_to_none=True)
    v.grad = None


def section_dwconv(args, out):
    """SOFT-S's depthwise conv on V, stages 1-3, in both layouts of ``HeadSharedConv``."""
    from mmsoft.models.backbones.soft import HeadSharedConv
    layouts = ('images', 'channels')
    lines = ['| size | stage | step | ' + ' | '.join(layouts) + ' | images / channels |',
             '|---|---|---|---|---|---|']
    rows = {}
    soft = build('SOFT-S')
    for size in args.sizes:
        for s, h, d, hw in _soft_stages(soft, size):
            conv = HeadSharedConv(h, d, soft.dwconv_sizes[s]).to(args.device)
            for step, batch in (('forward', 1), ('train', args.train_batch)):
                v = _head_tokens(args, batch, hw, h, d).requires_grad_(step == 'train')
                t = {}
                for layout in layouts:
                    t[layout] = time_call(args, lambda: _dwconv_step(conv, v, hw, layout,
                                                                      step == 'train'))
                rows[f'{size} stage{s + 1} {step}'] = t
                lines.append(f'| {size} | {s + 1} | {step} (batch {batch}) | '
                             + ' | '.join(fmt(t[k]) for k in layouts)
                             + f' | {t["images"] / t["channels"]:.2f} |')
    out['dwconv'] = rows
    lines.append(f"\nThe plan's local_conv_layout on {args.device}: the faster column (both "
                 'compute the same sums).')
    return lines


# ----------------------------------------------------------------------------- kernel
KERNEL_CHUNKS = (18, 20, 22, 24)  # log2 of the chunk sizes the kernel section tries


def _kernel_once(q, lm, v, w):
    from mmsoft.models.attention import gaussian_kernel
    with torch.no_grad():
        P = gaussian_kernel(q, lm)
        P.transpose(-1, -2) @ v
        return P @ w


def _kernel_chunked(device, chunk, train, q, lm, v, w):
    """κᵀ·V and κ·W in row chunks of ``chunk`` elements (the plan's ``kernel_chunk``
    forced for this device type); with backward if ``train``: then as training runs
    them, W = κᵀ·V with one G for both products (``kernel_attention``, the middle left
    out)."""
    from mmsoft.models.attention import kernel_attention, kernel_matmul
    with attention_plan(kernel_chunk=chunk, kernel_once_up_to=None,
                        device=torch.device(device).type), torch.set_grad_enabled(train):
        if train:
            kernel_attention(q, lm, v, lambda _, z: z).sum().backward()
            for t in (q, lm, v):
                t.grad = None
        else:
            kernel_matmul(q, lm, v, transpose=True)
            kernel_matmul(q, lm, w)


def _kernel_g_each(q, lm, v):
    """κᵀ·V, then κ·W with W = κᵀ·V, forward and backward, each product with its own G
    (``kernel_matmul``, as under torch.compile), at the plan's chunk."""
    from mmsoft.models.attention import kernel_matmul
    z = kernel_matmul(q, lm, v, transpose=True)
    kernel_matmul(q, lm, z).sum().backward()
    for t in (q, lm, v):
        t.grad = None


def section_kernel(args, out):
    """SOFT-S's kernel products per stage: P once vs chunked, and chunk sizes in
    training."""
    soft = build('SOFT-S')
    cases = {}  # row name -> {variant: fn}
    for size in args.sizes:
        for s, h, d, hw in _soft_stages(soft, size):
            r = soft.sr_ratios[s]
            N, m = hw[0] * hw[1], (hw[0] // r) * (hw[1] // r)
            for step, B in (('inference', 1), ('train', args.train_batch)):
                train = step == 'train'
                q, v = (_head_tokens(args, B, hw, h, d) * 0.3 for _ in range(2))
                lm, w = (torch.randn(B, h, m, d, device=args.device) * 0.3 for _ in range(2))
                tensors = [t.requires_grad_(train) for t in (q, lm, v)] + [w]
                fns = {} if train else {'once': partial(_kernel_once, *tensors)}
                for c in KERNEL_CHUNKS:
                    fns[f'2^{c}'] = partial(_kernel_chunked, args.device, 2**c, train,
                                            *tensors)
                if train:
                    fns['a G each'] = partial(_kernel_g_each, *tensors[:3])
                elements = math.log2(B * h * N * m)
                cases[f'{size} stage{s + 1} {step} (batch {B}, N={N}, m={m}: P has '
                      f'2^{elements:.1f} elements)'] = fns
    times = {name: {k: [] for k in fns} for name, fns in cases.items()}
    for r in range(args.rounds):
        for name, fns in cases.items():
            for k, fn in fns.items():
                times[name][k].append(time_call(args, fn, runs=1, warmup=r == 0))
    cols = ['once'] + [f'2^{c}' for c in KERNEL_CHUNKS] + ['a G each']
    lines = ['| case | ' + ' | '.join(cols) + ' |', '|---|' + '---|' * len(cols)]
    rows = {}
    for name, t in times.items():
        rows[name] = {k: float(np.median(v)) for k, v in t.items()}
        lines.append(f'| {name} | ' + ' | '.join(
            fmt(rows[name][k]) if k in rows[name] else '–' for k in cols) + ' |')
    out['kernel'] = rows
    lines.append(f'\nMedian of {args.rounds} round(s), all variants in turn. inference: κᵀ·V '
                 'and κ·W with P formed once, or in row chunks of 2^k elements (P made '
                 'twice); train: κᵀ·V, then κ·W with W = κᵀ·V, with backward (P recomputed '
                 'chunk by chunk), as training runs them: one G = ∇P ⊙ P for both '
                 "products, and one each ('a G each', at the plan's chunk: as under "
                 f"torch.compile). The plan's kernel_chunk on {args.device}: the fastest "
                 'chunk; its kernel_once_up_to: up to which size of P once wins.')
    return lines


# --------------------------------------------------------------------- registration
LAB_SECTIONS = {'pinv': section_pinv, 'matmul': section_matmul, 'dwconv': section_dwconv,
                'kernel': section_kernel}


def register():
    """Add ``LAB_SECTIONS`` to ``mmsoft.benchmark.SECTIONS``, ahead of the library's
    sections (the order the CLI runs them in by default); once (this module's import
    does)."""
    if all(SECTIONS.get(k) is fn for k, fn in LAB_SECTIONS.items()):
        return
    library = {k: fn for k, fn in SECTIONS.items() if k not in LAB_SECTIONS}
    SECTIONS.clear()
    SECTIONS.update(LAB_SECTIONS, **library)


register()
