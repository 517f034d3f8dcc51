"""Speed, memory and scaling of the mmsoft backbones next to mmdet's Swin-T, PVT-Small,
ResNet-50 and MMPretrain's XCiT-S12/16, measured side by side in one run.

Sections (``--sections``, default all):
  pinv     the batched 20-step pseudo-inverse alone, by m: the matrix iterations (Y
           formed, as training needs), A⁺·Z for a thin Z as inference computes it,
           eigh (float64), and on CUDA the TF32 schedule; the iterations also on A
           zero-padded to a multiple of ``--pinv-pad`` landmarks (the same iterate,
           aligned sizes)
  dwconv   the depthwise conv on V of SOFT-S's three stages at each ``--sizes`` entry in
           both layouts of ``HeadSharedConv`` (forward at batch 1, forward + backward at
           ``--train-batch``): what ``LOCAL_CONV_LAYOUT`` should say for the device
  kernel   the kernel products κ(Q, Q̃)ᵀ·V and κ(Q, Q̃)·W of SOFT-S's three stages at
           each ``--sizes`` entry: P formed once vs in row chunks of 2^18 … 2^24 elements
           (inference, batch 1) and the chunk sizes with backward (``--train-batch``),
           all variants in turn for ``--rounds`` rounds: what ``KERNEL_PLAN`` should say
  speed    backbone forward (batch 1, no grad) at each ``--sizes`` entry, with ratios;
           ``--rounds K`` measures all models K times in turn (median per model)
  train    forward + backward of the SOFT-Small backbone (default and fast modes) and
           Swin-T at ``--train-batch`` images (2 by default, as a detector trains per
           GPU): a training step without the optimizer
  modes    SOFT attention modes: time, and deviation from the float64 20-step iterate on
           the parity fixture input and on a real photo (scikit-image's astronaut) and
           from the outputs the official code produced for the fixture
  memory   peak memory at the largest --sizes entry (a process per model and step): one
           forward at batch 1 and one training step at ``--train-batch`` images, for
           SOFT-S modes, the official computation order (forward only) and Swin-T
  launches ATen operators (on a GPU: kernel launches) per forward and training step of
           SOFT-S modes, XCiT-SimA and Swin-T at each ``--sizes`` entry, counted on the
           meta device with CUDA's plan (no GPU needed): eager mode's host work per step
  detector one training iteration (data → backbone → neck → head → losses → backward →
           optimizer step, batch ``--train-batch``) and one test forward per image of
           RetinaNet and Mask R-CNN from the shipped SOFT-S configs, and of the same
           configs with Swin-T as the backbone, at ``--detector-size``: the ratio a user
           sees in mmengine's ``time:`` column (needs mmcv's compiled ops)
  scaling  time and peak memory over ``--sweep`` sizes, fitted exponent vs token count,
           with vanilla softmax attention (PVT-Small without spatial reduction) as the
           quadratic baseline; ``--plot FILE.png`` draws it

``--compile MODE`` adds SOFT-S and Swin-T wrapped in ``torch.compile(mode=MODE)`` to the
speed and train sections (MODE 'default', 'reduce-overhead' — CUDA graphs on a GPU — or
'max-autotune'); each measurement compiles afresh from a reset (a static graph for its
size), and its first, compiling call is not timed.

"official order" is our own re-implementation of the official SOFT code's computation
order (P computed twice, (P·Â)·(Pᵀ·V), 20 Newton–Raphson matrix iterations); its outputs
equal the reference, only its cost differs.

Usage: python tools/benchmark.py [--device cpu|cuda] [--sections speed,modes] [--plot f.png]
"""
import argparse
import json
import logging
import math
import os
import os.path as osp
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from functools import partial

import numpy as np
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)


# ----------------------------------------------------------------------------- models
def _out_of_place_kernel(a, b):
    """exp(-||a - b||²/2) with a new tensor per step, as the official code computes it."""
    a_sq = a.pow(2).sum(-1, keepdim=True)
    b_sq = b.pow(2).sum(-1).unsqueeze(-2)
    return (a @ b.transpose(-1, -2) - 0.5 * a_sq - 0.5 * b_sq).clamp(max=0).exp()


def official_order_attention(q, landmarks, v, iters=20, normalize=True, **_):
    """The official code's order of computation (for timing; same value as ours)."""
    from mmsoft.models.attention import newton_pinv, normalize_inverse
    A = _out_of_place_kernel(landmarks, landmarks)
    # α from the m×m residual ||I - α·A·A||₁ at every halving, then 2T matrix products.
    Y = newton_pinv(A, iters=iters, method='iterative')
    if normalize:
        Y = normalize_inverse(A, Y)
    left = _out_of_place_kernel(q, landmarks) @ Y  # (P·Â): O(N·m²)
    right = _out_of_place_kernel(landmarks, q) @ v  # P computed a second time
    return left @ right


SOFT_MODES = {
    # name: (SOFT kwargs, description)
    'official order': (dict(pinv_method='iterative'), 'reference algorithm, official cost'),
    'iterative': (dict(pinv_method='iterative'), '20 iterations, P once, P·(Â·(PᵀV))'),
    'spectral': (dict(pinv_method='spectral'), 'same 20-step iterate via eigh'),
    'tf32': (dict(pinv_method='tf32'),
             'same iterate, TF32 products for 15 steps + 5 float32 steps (emulated off CUDA)'),
    'tf32x3': (dict(pinv_method='tf32x3'),
               'same iterate, each product from 3 TF32 products of split operands (emulated '
               'off CUDA)'),
    'auto': (dict(pinv_method='auto'), 'default: per device and m (PINV_AUTO)'),
    'regularized': (dict(pinv_method='regularized'),
                    'fast: Tikhonov solve (A²+μI)⁻¹A, μ = 1/(α·2^T), Cholesky'),
    'grid16': (dict(landmark_grid=16), 'fast: at most 16×16 landmarks'),
    'grid8': (dict(landmark_grid=8), 'fast: at most 8×8 landmarks'),
    'spectral, float32 eigh': (dict(pinv_method='spectral'),
                               "what 'spectral' did before: eigh in float32 (below the "
                               'accuracy floor on hard kernels, docs/numerics.md)'),
}


@contextmanager
def _swapped(module, name, value):
    """``module.name = value`` inside the block, as before afterwards."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def _official_order():
    """The SOFT backbone's attention swapped for the official computation order."""
    import mmsoft.models.backbones.soft as soft_mod
    return _swapped(soft_mod, 'soft_attention', official_order_attention)


def _float32_eigh_factors(A, alpha, iters):
    """'spectral' as it was before it decomposed in float64: eigh in A's float32."""
    from mmsoft.models.attention import newton
    lam, U = torch.linalg.eigh(A)
    return U, newton._spectral_filter(lam, alpha, iters)


def _float32_eigh():
    """'spectral' with eigh in float32 (for the modes section)."""
    from mmsoft.models.attention import newton
    return _swapped(newton, '_spectral_factors', _float32_eigh_factors)


# Modes that swap an implementation in while they run (``section_modes``).
MODE_SWAPS = {'official order': _official_order, 'spectral, float32 eigh': _float32_eigh}


def build(name, mode='auto'):
    """A backbone in eval mode, randomly initialized (timings do not depend on weights)."""
    import mmsoft  # noqa: F401
    from mmsoft.models import SOFT, XCiTSimA
    if name == 'SOFT-S':
        return SOFT(arch='small', drop_path_rate=0., **SOFT_MODES[mode][0])
    if name == 'XCiT-SimA-S12/16':
        return XCiTSimA(arch='s12', patch_size=16, drop_path_rate=0.)
    if name == 'XCiT-SimA-S12/16 trunk':  # no stride 4/8/32 pyramid, like mmpretrain's
        return XCiTSimA(arch='s12', patch_size=16, drop_path_rate=0., with_pyramid=False)
    from mmdet.models.backbones import PyramidVisionTransformer, ResNet, SwinTransformer
    if name == 'Swin-T':
        return SwinTransformer()
    if name == 'PVT-S':
        return PyramidVisionTransformer(num_layers=[3, 4, 6, 3])
    if name == 'PVT-S softmax (no SR)':
        return PyramidVisionTransformer(num_layers=[3, 4, 6, 3], sr_ratios=[1, 1, 1, 1])
    if name == 'ResNet-50':
        return ResNet(depth=50)
    if name == 'XCiT-S12/16 (mmpretrain)':
        from mmpretrain.models.backbones import XCiT
        return XCiT(embed_dims=384, depth=12, num_heads=8, out_type='featmap')
    raise KeyError(name)


AMP_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16}


def measure(model, size, device, repeat, train=False, official=False, batch=1,
            compile_mode=None, amp=None):
    """Median seconds of forward (or forward+backward) of a batch, under
    ``torch.autocast`` to ``amp`` ('bf16', 'fp16') if given.

    The first run is a warm-up (untimed) unless ``repeat`` is 0; with ``compile_mode``
    (``torch.compile(model, mode=compile_mode)``, from a reset of Dynamo's caches: a
    static graph for this size) the compiling first run is never timed.
    """
    model = model.to(device)
    model.train(train)
    run = model
    if compile_mode:
        # Dynamo caches per code object: without a reset a model compiled at a second
        # size would reuse the first's entry and recompile with dynamic shapes
        torch.compiler.reset()
        run = torch.compile(model, mode=compile_mode)
        repeat = max(repeat, 1)
    x = torch.randn(batch, 3, *size, device=device, requires_grad=False)
    times = []
    ctx = _official_order() if official else nullcontext()
    with ctx:
        for i in range(repeat + 1):
            if compile_mode == 'reduce-overhead':  # a new step for the CUDA graph trees
                torch.compiler.cudagraph_mark_step_begin()
            _sync(device)
            t0 = time.perf_counter()
            with torch.autocast(device_type=device, dtype=AMP_DTYPES.get(amp),
                                enabled=amp is not None):
                if train:
                    outs = run(x)
                    sum(o.float().mean() for o in outs).backward()
                    model.zero_grad(set_to_none=True)
                else:
                    with torch.no_grad():
                        run(x)
            _sync(device)
            if i > 0 or repeat == 0:
                times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _sync(device):
    if device == 'cuda':
        torch.cuda.synchronize()


def parse_size(s):
    h, w = s.lower().split('x')
    return int(h), int(w)


def fmt(s):
    if s < 1:
        return f'{s * 1e3:.1f} ms'
    return f'{s:.3f} s' if s < 100 else f'{s:.0f} s'


def _faster(t_other, t_ours):
    """'2.5× faster than' / '3.7× slower than': a ratio below one reads as slower."""
    r = t_other / t_ours
    return f'{r:.1f}× faster than' if r >= 1 else f'{1 / r:.1f}× slower than'


# ----------------------------------------------------------------------------- sections
def section_speed(args, out):
    names = ['SOFT-S', 'Swin-T', 'PVT-S', 'ResNet-50', 'XCiT-SimA-S12/16',
             'XCiT-SimA-S12/16 trunk', 'XCiT-S12/16 (mmpretrain)']
    rounds = {}  # name -> size -> [seconds per round]
    for r in range(args.rounds):
        for size in args.sizes:
            hw = parse_size(size)
            timed = {}
            for name in names:
                timed[name] = measure(build(name), hw, args.device, args.repeat, amp=args.amp)
            if not args.skip_official:
                timed['SOFT-S official order'] = measure(
                    build('SOFT-S', 'official order'), hw, args.device,
                    # above 600² one warm-up and one timed run (it is slow on a CPU)
                    min(args.repeat, 1) if hw[0] * hw[1] > 600 * 600 else args.repeat,
                    official=True, amp=args.amp)
            timed.update(_measure_compiled(args, hw, train=False))
            for name, t in timed.items():
                rounds.setdefault(name, {}).setdefault(size, []).append(t)
            print(f'  measured {size}' + (f' (round {r + 1}/{args.rounds})'
                                          if args.rounds > 1 else ''), flush=True)
    rows = {name: {s: float(np.median(ts)) for s, ts in r.items()}
            for name, r in rounds.items()}
    lines = ['| backbone | ' + ' | '.join(args.sizes) + ' | ' +
             ' | '.join(f'vs Swin-T @{s}' for s in args.sizes) + ' |',
             '|---|' + '---|' * (2 * len(args.sizes))]
    for name, r in rows.items():
        lines.append(f'| {name} | ' + ' | '.join(fmt(r[s]) for s in args.sizes) + ' | ' +
                     ' | '.join(f'{r[s] / rows["Swin-T"][s]:.2f}×' for s in args.sizes) +
                     ' |')
    if 'SOFT-S official order' in rows:
        lines.append('')
        for s in args.sizes:
            lines.append(f'SOFT-S (default mode) is '
                         f'{_faster(rows["SOFT-S official order"][s], rows["SOFT-S"][s])} '
                         f'the official computation order at {s}.')
    lines += _compiled_lines(args, rows)
    for s in args.sizes:
        ratio = rows['XCiT-SimA-S12/16 trunk'][s] / rows['XCiT-S12/16 (mmpretrain)'][s]
        lines.append(f'XCiT-SimA-S12/16 trunk / MMPretrain XCiT-S12/16 at {s}: {ratio:.2f} '
                     '(both without a pyramid; the pyramid adds its transposed convolutions).')
    out['speed'] = rows
    return lines


def _measure_compiled(args, hw, train, batch=1):
    """--compile: {'NAME [compiled: MODE]': seconds} for SOFT-S (default mode) and Swin-T
    under torch.compile; {} without --compile."""
    if not args.compile:
        return {}
    return {f'{name} [compiled: {args.compile}]': measure(
        build(name), hw, args.device, args.repeat, train=train, batch=batch,
        compile_mode=args.compile, amp=args.amp) for name in ('SOFT-S', 'Swin-T')}


def _compiled_lines(args, rows, soft_row='SOFT-S'):
    """What torch.compile changed, per model and size (eager time / compiled time);
    ``soft_row`` is the row of SOFT-S's eager default mode."""
    if not args.compile:
        return []
    lines = ['']
    for name in ('SOFT-S', 'Swin-T'):
        eager_row = rows[soft_row if name == 'SOFT-S' else name]
        compiled_row = rows[f'{name} [compiled: {args.compile}]']
        for s in args.sizes:
            lines.append(f'{name} with torch.compile(mode={args.compile!r}) is '
                         f'{_faster(eager_row[s], compiled_row[s])} eager at {s}.')
    return lines


def _soft_modes(args, modes):
    """The SOFT modes worth timing on this device ('tf32', 'tf32x3': only emulated off
    CUDA)."""
    return [m for m in modes if m not in ('tf32', 'tf32x3') or args.device == 'cuda']


def section_train(args, out):
    rows = {}
    b = args.train_batch
    for size in args.sizes:
        hw = parse_size(size)
        for mode in _soft_modes(args, ('auto', 'tf32', 'tf32x3', 'regularized', 'grid16')):
            rows.setdefault(f'SOFT-S [{mode}]', {})[size] = measure(
                build('SOFT-S', mode), hw, args.device, args.repeat, train=True, batch=b,
                amp=args.amp)
        rows.setdefault('Swin-T', {})[size] = measure(build('Swin-T'), hw, args.device,
                                                      args.repeat, train=True, batch=b,
                                                      amp=args.amp)
        for name, t in _measure_compiled(args, hw, train=True, batch=b).items():
            rows.setdefault(name, {})[size] = t
    lines = [f'| forward+backward, batch {b} (train mode) | ' + ' | '.join(args.sizes) +
             ' | ' + ' | '.join(f'vs Swin-T @{s}' for s in args.sizes) + ' |',
             '|---|' + '---|' * (2 * len(args.sizes))]
    for name, r in rows.items():
        lines.append(f'| {name} | ' + ' | '.join(fmt(r[s]) for s in args.sizes) + ' | ' +
                     ' | '.join(f'{r[s] / rows["Swin-T"][s]:.2f}×' for s in args.sizes) +
                     ' |')
    lines += _compiled_lines(args, rows, soft_row='SOFT-S [auto]')
    out['train'] = rows
    return lines


def _fixture_soft(**kwargs):
    """The parity fixture's SOFT (official weights, random) in eval mode."""
    from mmsoft.models import SOFT
    fixture = osp.join(ROOT, 'tests', 'data', 'soft_public_checkpoint.pth')
    arch = dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4], depths=[1, 1, 2, 1])
    model = SOFT(arch=arch, drop_path_rate=0., init_cfg=dict(type='Pretrained',
                                                               checkpoint=fixture), **kwargs)
    model.init_weights()
    return model.eval()


def section_modes(args, out):
    """Each mode's deviation from the float64 20-step iterate (the exact answer) and,
    on the fixture input, from the outputs the official code produced."""
    from mmsoft.analysis import relative_deviation
    expected = torch.load(osp.join(ROOT, 'tests', 'data', 'soft_public_expected.pth'))
    official = [expected[k] for k in ('stage1', 'stage2', 'stage3', 'stage4_norm')]
    inputs = {'fixture 128×160': expected['input']}
    try:
        from skimage import data as skdata
        photo = torch.from_numpy(skdata.astronaut()).permute(2, 0, 1).float()[None]
        photo = (photo - photo.mean()) / photo.std()
        inputs['astronaut 800×800'] = torch.nn.functional.interpolate(
            photo, size=(800, 800), mode='bilinear')
    except ImportError:
        pass
    # The float64 iterate (eigh and the iterations agree to ~1e-12 in float64; eigh is
    # far cheaper at the photo's m ≈ 1000).
    model_ref = _fixture_soft(pinv_method='spectral').double()
    with torch.no_grad():
        refs = {k: model_ref(x.double()) for k, x in inputs.items()}
    hw = parse_size(args.sizes[-1])
    lines = [f'| mode | what | SOFT-S time @{args.sizes[-1]} | ' +
             ' | '.join(f'max rel. deviation from the float64 iterate, {k}'
                        for k in inputs) + ' | vs official outputs, fixture |',
             '|---|---|---|' + '---|' * (len(inputs) + 1)]
    rows = {}
    for mode, (kwargs, what) in SOFT_MODES.items():
        is_official = mode == 'official order'
        if is_official and args.skip_official:
            continue
        model = _fixture_soft(**kwargs)
        devs = []
        with torch.no_grad(), MODE_SWAPS.get(mode, nullcontext)():
            for k, x in inputs.items():
                outs = model(x)
                devs.append(max(map(relative_deviation, outs, refs[k])))
                if k.startswith('fixture'):
                    dev_official = max(map(relative_deviation, outs, official))
        t = None
        if mode in _soft_modes(args, [mode]):
            with MODE_SWAPS.get(mode, nullcontext)():
                t = measure(build('SOFT-S', mode), hw, args.device,
                            0 if is_official else args.repeat)
        rows[mode] = dict(time=t, deviation=devs, official=dev_official)
        lines.append(f'| {mode} | {what} | {fmt(t) if t else "– (emulated)"} | ' +
                     ' | '.join(f'{d:.1e}' for d in devs) + f' | {dev_official:.1e} |')
        print(f'  mode {mode} done', flush=True)
    out['modes'] = rows
    return lines


def _child_measure(name, mode, size, device, repeat, train=False, batch=1):
    """Run one measurement in a fresh process: time and peak memory of the step.

    A crashed child (out of memory, say) is reported with the end of its stderr and
    returns None, so a table shows 'failed' rather than a silent gap."""
    code = ('import json,sys;sys.path.insert(0,%r);import tools.benchmark as b;'
            'print(json.dumps(b.child(%r,%r,%r,%r,%d,%r,%d)))' % (
                ROOT, name, mode, size, device, repeat, train, batch))
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         cwd=ROOT)
    if res.returncode != 0:
        print(f'  {name} [{mode}] at {size} failed (exit {res.returncode}):\n'
              + res.stderr[-2000:], flush=True)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def child(name, mode, size, device, repeat, train=False, batch=1):
    official = mode == 'official order'
    model = build(name, mode).to(device)
    model.train(False)  # some mmdet backbones' train() returns None: no chaining
    hw = parse_size(size)
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with torch.no_grad():  # a small warm-up so that library start-up is not counted
            model(torch.randn(1, 3, 64, 64, device=device))
        _reset_peak_rss()
        base = _proc_status_bytes('VmRSS')
    t = measure(model, hw, device, repeat, train=train, official=official, batch=batch)
    if device == 'cuda':
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = _proc_status_bytes('VmHWM') - base
    return dict(time=t, peak_mb=peak / 2**20)


def _proc_status_bytes(key):
    """VmRSS / VmHWM (peak resident set) of this process, from /proc (Linux).

    Not ``resource.getrusage().ru_maxrss``: a child process inherits its parent's peak
    there, so every child of a large benchmark process would report the parent's.
    """
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f'{key} not in /proc/self/status')


def _reset_peak_rss():
    """Set VmHWM to the current resident set (Linux ≥ 4.0: write 5 to clear_refs)."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        pass  # VmHWM then also counts the warm-up, which is small


def section_scaling(args, out):
    series = [('SOFT-S', 'auto'), ('SOFT-S', 'grid16'), ('XCiT-SimA-S12/16', None),
              ('PVT-S softmax (no SR)', None), ('Swin-T', None)]
    if args.series:
        series = series[:args.series]
    results = {}
    for name, mode in series:
        label = name + (f' [{mode}]' if mode else '')
        for size in args.sweep:
            h, w = parse_size(size)
            if 'softmax' in name and h * w > args.softmax_max_pixels:
                r = 'skipped'  # N² attention matrices would not fit in memory
            else:
                r = _child_measure(name, mode or 'auto', size, args.device, args.repeat)
                r = 'failed' if r is None else r
            results.setdefault(label, {})[size] = r
        print(f'  swept {label}', flush=True)
    tokens = {s: parse_size(s)[0] * parse_size(s)[1] / 16 for s in args.sweep}
    lines = ['| backbone | ' + ' | '.join(args.sweep) + ' | exponent (time ∝ N^k) |',
             '|---|' + '---|' * (len(args.sweep) + 1)]
    for label, r in results.items():
        ok = [s for s in args.sweep if isinstance(r[s], dict)]
        k = float('nan')
        if len(ok) >= 2:
            k = np.polyfit(np.log([tokens[s] for s in ok]),
                           np.log([r[s]['time'] for s in ok]), 1)[0]
        cells = [f'{fmt(r[s]["time"])}, {r[s]["peak_mb"]:.0f} MB' if s in ok
                 else ('– (N² too large)' if r[s] == 'skipped' else 'failed')
                 for s in args.sweep]
        note = '' if len(ok) == len(args.sweep) else f' (fitted on {len(ok)} sizes)'
        lines.append(f'| {label} | ' + ' | '.join(cells) + f' | {k:.2f}{note} |')
        results[label]['exponent'] = k
    out['scaling'] = results
    if args.plot:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for label, r in results.items():
            ok = [s for s in args.sweep if isinstance(r.get(s), dict)]
            xs = [tokens[s] for s in ok]
            ax1.loglog(xs, [r[s]['time'] for s in ok], 'o-', label=label)
            ax2.loglog(xs, [max(r[s]['peak_mb'], 1e-3) for s in ok], 'o-', label=label)
        ax1.set(xlabel='tokens at stride 4 (H·W/16)', ylabel='forward time (s)')
        ax2.set(xlabel='tokens at stride 4 (H·W/16)', ylabel='peak memory (MB)')
        ax1.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        lines.append(f'\nplot written to {args.plot}')
    return lines


def section_memory(args, out):
    """Peak memory at the largest ``--sizes`` entry, each model and step in its own
    process: a forward at batch 1 and a training step at ``--train-batch`` images."""
    size, b = args.sizes[-1], args.train_batch
    series = [('SOFT-S', m) for m in _soft_modes(args, ('auto', 'tf32', 'regularized',
                                                        'grid16'))] + [('Swin-T', 'auto')]
    if not args.skip_official:
        series.insert(1, ('SOFT-S', 'official order'))
    lines = [f'| backbone @{size} | forward, batch 1 | peak memory | forward+backward, '
             f'batch {b} | peak memory | training peak vs Swin-T |',
             '|---|---|---|---|---|---|']
    rows = {}
    for name, mode in series:
        label = name + (f' [{mode}]' if name == 'SOFT-S' else '')
        # the official order: one warm-up and one timed run (it is slow on a CPU)
        repeat = min(args.repeat, 1) if mode == 'official order' else args.repeat
        fwd = _child_measure(name, mode, size, args.device, repeat)
        trn = None
        if mode != 'official order':  # a re-implementation for timing, no training
            trn = _child_measure(name, mode, size, args.device, repeat, train=True,
                                 batch=b)
        rows[label] = dict(forward=fwd, train=trn)
        print(f'  measured {label}', flush=True)
    swin = (rows['Swin-T']['train'] or {}).get('peak_mb')
    for label, r in rows.items():
        cells = []
        for step in ('forward', 'train'):
            m = r[step]
            if m:
                cells += [fmt(m['time']), f'{m["peak_mb"]:.0f} MB']
            elif step == 'train' and 'official' in label:
                cells += ['–', '–']  # not measured
            else:
                cells += ['failed', '–']
        ratio = (f'{r["train"]["peak_mb"] / swin:.2f}×' if r['train'] and swin else '–')
        lines.append(f'| {label} | ' + ' | '.join(cells) + f' | {ratio} |')
    out['memory'] = rows
    return lines


def _zero_padded(fn, multiple, formed):
    """fn(A, Z) run on A padded with zero rows and columns (and Z with zero rows) to a
    multiple of ``multiple`` landmarks, the result cut back: the same iterate (A's block
    does not mix with the zero block; α is unchanged), with aligned matrix sizes.
    ``formed``: fn returns the (m, m) iterate, else the (m, n) product with Z."""
    import torch.nn.functional as F

    def run(A, Z):
        m = A.shape[-1]
        pad = -m % multiple
        if not pad:
            return fn(A, Z)
        out = fn(F.pad(A, (0, pad, 0, pad)), F.pad(Z, (0, 0, 0, pad)))
        return out[..., :m, :m] if formed else out[..., :m, :]

    return run


def _pinv_applied(A, Z, method):
    """A⁺·Z as inference computes it (a column of the pinv section)."""
    from mmsoft.models.attention import newton_pinv_apply
    return newton_pinv_apply(A, Z, method=method, nonnegative=True)


def section_pinv(args, out):
    """Batched 20-step pseudo-inverse of Gaussian-kernel matrices, by method."""
    from mmsoft.models.attention import gaussian_kernel, newton_pinv
    cols = {
        'iterative': lambda A, Z: newton_pinv(A, method='iterative', nonnegative=True),
        'iterative, applied': partial(_pinv_applied, method='iterative'),
        'spectral (eigh)': partial(_pinv_applied, method='spectral'),
    }
    if args.device == 'cuda':  # elsewhere TF32 is only emulated
        for method in ('tf32', 'tf32x3'):
            cols[f'{method}, applied'] = partial(_pinv_applied, method=method)
    k = args.pinv_pad
    if k > 1:  # the iterations again on sizes padded to a multiple of k
        for name in [c for c in cols if c != 'spectral (eigh)']:
            cols[f'{name}, m padded to ×{k}'] = _zero_padded(cols[name], k,
                                                             formed=name == 'iterative')
    lines = ['| m | batch | ' + ' | '.join(cols) + ' |', '|---|---|' + '---|' * len(cols)]
    rows = {}
    for m in args.pinv_sizes:
        x = torch.randn(20, m, 32, device=args.device) * 0.3
        A = gaussian_kernel(x, x)
        Z = torch.randn(20, m, 32, device=args.device)
        t = {}
        with torch.no_grad():
            for name, fn in cols.items():
                t[name] = _time_call(args, lambda: fn(A, Z))
        rows[m] = t
        lines.append(f'| {m} | 20 | ' + ' | '.join(f'{v * 1e3:.1f} ms' for v in t.values())
                     + ' |')
    out['pinv'] = rows
    lines.append("\n'iterative' forms the iterate (2T products, what training keeps for "
                 "backward); 'applied' is A⁺·Z for a thin 32-column Z as inference "
                 'computes it (the formed iterate times Z); spectral: eigh (in float64) '
                 'and A⁺·Z.')
    if k > 1:
        lines.append(f"'padded': A with zero rows and columns up to a multiple of {k} "
                     '(the same iterate on its block; aligned sizes for the matrix '
                     'products), the result cut back.')
    return lines


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
                    t[layout] = _time_call(args, lambda: _dwconv_step(conv, v, hw, layout,
                                                                      step == 'train'))
                rows[f'{size} stage{s + 1} {step}'] = t
                lines.append(f'| {size} | {s + 1} | {step} (batch {batch}) | '
                             + ' | '.join(fmt(t[k]) for k in layouts)
                             + f' | {t["images"] / t["channels"]:.2f} |')
    out['dwconv'] = rows
    lines.append(f'\nLOCAL_CONV_LAYOUT on {args.device}: the faster column (both compute the '
                 'same sums).')
    return lines


KERNEL_CHUNKS = (18, 20, 22, 24)  # log2 of the chunk sizes the kernel section tries


def section_kernel(args, out):
    """SOFT-S's kernel products per stage: P once vs chunked, and chunk sizes in training."""
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
                tensors = [t.requires_grad_(train) for t in (q, lm, v, w)]
                fns = {} if train else {'once': partial(_kernel_once, *tensors)}
                for c in KERNEL_CHUNKS:
                    fns[f'2^{c}'] = partial(_kernel_chunked, args.device, 2**c, train,
                                            *tensors)
                elements = math.log2(B * h * N * m)
                cases[f'{size} stage{s + 1} {step} (batch {B}, N={N}, m={m}: P has '
                      f'2^{elements:.1f} elements)'] = fns
    times = {name: {k: [] for k in fns} for name, fns in cases.items()}
    for r in range(args.rounds):
        for name, fns in cases.items():
            for k, fn in fns.items():
                times[name][k].append(_time_call(args, fn, runs=1, warmup=r == 0))
    cols = ['once'] + [f'2^{c}' for c in KERNEL_CHUNKS]
    lines = ['| case | ' + ' | '.join(cols) + ' |', '|---|' + '---|' * len(cols)]
    rows = {}
    for name, t in times.items():
        rows[name] = {k: float(np.median(v)) for k, v in t.items()}
        lines.append(f'| {name} | ' + ' | '.join(
            fmt(rows[name][k]) if k in rows[name] else '–' for k in cols) + ' |')
    out['kernel'] = rows
    lines.append(f'\nMedian of {args.rounds} round(s), all variants in turn. inference: κᵀ·V '
                 'and κ·W with P formed once, or in row chunks of 2^k elements (P made '
                 'twice); train: the same with backward (P recomputed chunk by chunk). '
                 f'KERNEL_PLAN on {args.device}: the fastest chunk, and up to which size '
                 'of P once wins.')
    return lines


def _kernel_once(q, lm, v, w):
    from mmsoft.models.attention import gaussian_kernel
    with torch.no_grad():
        P = gaussian_kernel(q, lm)
        P.transpose(-1, -2) @ v
        return P @ w


def _kernel_chunked(device, chunk, train, q, lm, v, w):
    from mmsoft.analysis import table_entry
    from mmsoft.models.attention import KERNEL_PLAN, kernel_matmul
    with table_entry(KERNEL_PLAN, device, (chunk, None)), torch.set_grad_enabled(train):
        z = kernel_matmul(q, lm, v, transpose=True)
        out = kernel_matmul(q, lm, w)
        if train:
            (z.sum() + out.sum()).backward()
            for t in (q, lm, v, w):
                t.grad = None


def _dwconv_step(conv, v, hw, layout, train):
    if not train:
        with torch.no_grad():
            return conv(v, hw, layout)
    conv(v, hw, layout).sum().backward()
    conv.zero_grad(set_to_none=True)
    v.grad = None


LAUNCH_MODELS = (('Swin-T', 'auto'), ('SOFT-S', 'auto'), ('SOFT-S', 'grid16'),
                 ('SOFT-S', 'regularized'), ('XCiT-SimA-S12/16', 'auto'))


def section_launches(args, out):
    """ATen operators per forward and training step, with CUDA's plan, on the meta device."""
    from mmsoft.analysis import LaunchCounter, device_plan
    lines = ['| model | size | forward (batch 1) | vs Swin-T | training step (batch '
             f'{args.train_batch}) | vs Swin-T |', '|---|---|---|---|---|---|']
    rows = {}
    with device_plan('meta', like='cuda'):
        for size in args.sizes:
            H, W = parse_size(size)
            for name, mode in LAUNCH_MODELS:
                model = build(name, mode).to('meta')
                n = {}
                for step, batch in (('forward', 1), ('train', args.train_batch)):
                    model.train(step == 'train')
                    x = torch.zeros(batch, 3, H, W, device='meta')
                    with LaunchCounter() as count, torch.set_grad_enabled(step == 'train'):
                        outs = model(x)
                        if step == 'train':
                            sum(o.mean() for o in outs).backward()
                    n[step] = count.total
                label = name if name != 'SOFT-S' else f'SOFT-S ({mode})'
                rows[f'{label} {size}'] = n
                base = rows[f'Swin-T {size}']
                lines.append(f'| {label} | {size} | {n["forward"]} | '
                             f'{n["forward"] / base["forward"]:.2f} | {n["train"]} | '
                             f'{n["train"] / base["train"]:.2f} |')
    out['launches'] = rows
    lines.append('\nATen operators run below autograd (views and allocations not counted), '
                 "counted on PyTorch's data-less meta device with the CUDA entries of "
                 'PINV_AUTO, KERNEL_PLAN and LOCAL_CONV_LAYOUT: on a GPU each launches one '
                 'or more kernels, so in eager mode they are the host work per step.')
    return lines


def _time_call(args, fn, runs=3, warmup=True):
    """Mean seconds of ``fn()`` over ``runs`` calls (after one untimed warm-up call)."""
    if warmup:
        fn()
    _sync(args.device)
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    _sync(args.device)
    return (time.perf_counter() - t0) / runs


# ------------------------------------------------------------------------- detector
# The shipped SOFT-S detector configs; Swin-T replaces only the backbone (and the neck's
# input widths), so neck, head, losses and optimizer are the same.
DETECTOR_CONFIGS = {'RetinaNet': 'configs/soft/retinanet_soft-s_fpn_1x_coco.py',
                    'Mask R-CNN': 'configs/soft/mask-rcnn_soft-s_fpn_1x_coco.py'}
SWIN_T_WIDTHS = (96, 192, 384, 768)


def detector_config(detector, backbone):
    """The config of ``detector`` ('RetinaNet', 'Mask R-CNN') with ``backbone`` ('SOFT-S'
    as shipped, or 'Swin-T': mmdet's SwinTransformer at the same output stages and drop
    path rate, the neck's ``in_channels`` set to its widths)."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(ROOT, DETECTOR_CONFIGS[detector]))
    if backbone == 'Swin-T':
        soft = cfg.model.backbone
        cfg.model.backbone = dict(type='SwinTransformer', out_indices=soft.out_indices,
                                  drop_path_rate=soft.drop_path_rate, convert_weights=False)
        cfg.model.neck.in_channels = [SWIN_T_WIDTHS[i] for i in soft.out_indices]
    elif backbone != 'SOFT-S':
        raise ValueError(f"backbone must be 'SOFT-S' or 'Swin-T', got {backbone!r}")
    return cfg


def detector_batch(hw, batch, masks, seed=0):
    """A packed batch as mmdet's pipeline gives it to ``train_step``: ``batch`` uint8 images
    of ``hw`` (already resized) with 8 ground-truth boxes each (and box-shaped masks)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    g = torch.Generator().manual_seed(seed)
    H, W = hw
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, H, W), generator=g, dtype=torch.uint8))
        xy = torch.rand(8, 2, generator=g) * torch.tensor([W * 0.7, H * 0.7])
        wh = (0.1 + 0.2 * torch.rand(8, 2, generator=g)) * torch.tensor([W, H])
        boxes = torch.cat([xy, xy + wh], 1)
        gt = InstanceData(bboxes=boxes, labels=torch.randint(0, 80, (8, ), generator=g))
        if masks:
            m = np.zeros((8, H, W), dtype=np.uint8)
            for k, (x0, y0, x1, y1) in enumerate(boxes.round().int().tolist()):
                m[k, y0:y1, x0:x1] = 1
            gt.masks = BitmapMasks(m, H, W)
        sample = DetDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, pad_shape=hw,
                                             scale_factor=(1., 1.), flip=False))
        sample.gt_instances = gt
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _detector_step(model, optim_wrapper, data, device, train):
    """Seconds of one ``train_step`` (with the optimizer step) or, with ``train`` False,
    of one ``test_step``; peak CUDA memory (bytes) of the call, None off CUDA."""
    model.train(train)
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    t0 = time.perf_counter()
    if train:
        model.train_step(data, optim_wrapper)
    else:
        with torch.no_grad():
            model.test_step(data)
    _sync(device)
    seconds = time.perf_counter() - t0
    return seconds, torch.cuda.max_memory_allocated() if device == 'cuda' else None


def section_detector(args, out):
    """One training iteration (data → backbone → neck → head → losses → backward →
    optimizer step) at ``--train-batch`` images and one test-time forward per image, of
    RetinaNet and Mask R-CNN with SOFT-S and with Swin-T, all in turn for ``--rounds``
    rounds (medians); the ratio is what mmengine's ``time:`` column shows."""
    from mmengine.logging import MMLogger
    from mmengine.optim import build_optim_wrapper

    from mmsoft.analysis import build_model_from_config
    hw = parse_size(args.detector_size)
    b = args.train_batch
    models = {}
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # not a line per parameter group
    try:
        for det in DETECTOR_CONFIGS:
            for backbone in ('SOFT-S', 'Swin-T'):
                cfg = detector_config(det, backbone)
                torch.manual_seed(0)
                model = build_model_from_config(cfg).to(args.device)
                models[det, backbone] = (model, build_optim_wrapper(model, cfg.optim_wrapper))
    finally:
        logger.setLevel(level)
    times = {}  # (det, backbone, step) -> [seconds]
    peaks = {}
    for _ in range(args.rounds):
        for (det, backbone), (model, optim) in models.items():
            for step, train in (('train', True), ('test', False)):
                runs = []
                for i in range(max(args.repeat, 1) + 1):  # the first run warms up
                    if train:
                        data = detector_batch(hw, b, masks=det == 'Mask R-CNN', seed=i)
                    else:
                        data = detector_batch(hw, 1, masks=False, seed=i)
                    sec, peak = _detector_step(model, optim, data, args.device, train)
                    if i:
                        runs.append(sec)
                        if peak is not None:
                            peaks[det, backbone, step] = max(
                                peak, peaks.get((det, backbone, step), 0))
                times.setdefault((det, backbone, step), []).extend(runs)
    med = {k: float(np.median(v)) for k, v in times.items()}
    rows = {}
    lines = [f'Images of {args.detector_size} (H×W, as resized by the pipeline; padded to '
             f'multiples of 32), {args.device}; training iteration at batch {b} with the '
             'optimizer step, test forward at batch 1.', '',
             f'| detector | backbone | train iteration | vs Swin-T | test forward | vs Swin-T |'
             + (' peak train memory | vs Swin-T |' if peaks else ''),
             '|---|---|---|---|---|---|' + ('---|---|' if peaks else '')]
    for det in DETECTOR_CONFIGS:
        for backbone in ('SOFT-S', 'Swin-T'):
            r = {step: med[det, backbone, step] for step in ('train', 'test')}
            base = {step: med[det, 'Swin-T', step] for step in ('train', 'test')}
            line = (f'| {det} | {backbone} | {fmt(r["train"])} | '
                    f'{r["train"] / base["train"]:.2f}× | {fmt(r["test"])} | '
                    f'{r["test"] / base["test"]:.2f}× |')
            if peaks:
                p, pb = peaks[det, backbone, 'train'], peaks[det, 'Swin-T', 'train']
                r['train peak bytes'] = p
                line += f' {p / 2**30:.2f} GiB | {p / pb:.2f}× |'
            rows[f'{det} {backbone}'] = r
            lines.append(line)
    out['detector'] = rows
    return lines


SECTIONS = {'pinv': section_pinv, 'dwconv': section_dwconv, 'kernel': section_kernel,
            'speed': section_speed, 'train': section_train, 'modes': section_modes,
            'memory': section_memory, 'scaling': section_scaling,
            'launches': section_launches, 'detector': section_detector}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split('\n\n', 1)[1])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--sections',
                        default='pinv,dwconv,kernel,speed,train,modes,memory,scaling,launches,'
                        'detector')
    parser.add_argument('--sizes', nargs='+', default=['512x512', '800x1344'])
    parser.add_argument('--sweep', nargs='+',
                        default=['256x256', '384x384', '512x512', '768x768', '1024x1344'])
    parser.add_argument('--repeat', type=int, default=3, help='timed runs (median)')
    parser.add_argument('--rounds', type=int, default=1,
                        help='speed, kernel: measure every model (variant) this many times, '
                        'in turn, and report the median of each (on a shared machine, drift '
                        'then affects all of them alike instead of the ratios)')
    parser.add_argument('--train-batch', type=int, default=2,
                        help='images per training step in the train, memory and detector '
                        'sections')
    parser.add_argument('--detector-size', default='800x1333', metavar='HxW',
                        help="detector: the images' size after the pipeline's resize (the "
                        "configs' scale: short side 800, long side 1333)")
    parser.add_argument('--pinv-sizes', nargs='+', type=int,
                        default=[16, 49, 64, 100, 128, 196, 400, 1025],
                        help='landmark counts m of the pinv section')
    parser.add_argument('--pinv-pad', type=int, default=8, metavar='K',
                        help='pinv: also time the iterations with m zero-padded to a '
                        'multiple of K (1: not)')
    parser.add_argument('--skip-official', action='store_true',
                        help='skip the (slow) official computation order')
    parser.add_argument('--softmax-max-pixels', type=int, default=600 * 600,
                        help='largest input (H·W) for the vanilla softmax baseline')
    parser.add_argument('--series', type=int, metavar='K',
                        help='scaling: only the first K series (SOFT-S default, SOFT-S '
                        'grid16, XCiT-SimA, PVT-S softmax, Swin-T)')
    parser.add_argument('--compile', choices=['default', 'reduce-overhead', 'max-autotune'],
                        help='speed and train: also time SOFT-S and Swin-T under '
                        'torch.compile with this mode')
    parser.add_argument('--amp', choices=sorted(AMP_DTYPES),
                        help='speed, train: run the models under torch.autocast to bfloat16 '
                        "or float16 (SOFT's pseudo-inverse stays float32)")
    parser.add_argument('--plot', help='write the scaling plot to this PNG')
    parser.add_argument('--json', help='write all numbers to this JSON file')
    args = parser.parse_args(argv)
    sections = args.sections.split(',')
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f'unknown sections {sorted(unknown)}; choose from {sorted(SECTIONS)}')
    if args.device == 'cuda':
        dev = (f'{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}, TF32 '
               f'convolutions {"on" if torch.backends.cudnn.allow_tf32 else "off"}')
    else:
        dev = f'CPU, {torch.get_num_threads()} threads'
    precision = (f'autocast to {AMP_DTYPES[args.amp]} in speed and train'
                 if args.amp else 'float32')
    print(f'# mmsoft benchmark: {dev}, torch {torch.__version__}, {precision}')
    out = dict(device=dev)
    for name in sections:
        print(f'\n## {name}', flush=True)
        print('\n'.join(SECTIONS[name](args, out)), flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(out, f, indent=1, default=float)
    return out


if __name__ == '__main__':
    main()
