"""Time of whole backbones, side by side:

  speed  forward (batch 1, no grad) of SOFT-S, Swin-T, PVT-S, ResNet-50, XCiT-SimA and
         MMPretrain's XCiT-S12/16 at each ``--sizes`` entry, and SOFT-S in the official
         computation order (``mmsoft.testing.official_order``), all models in turn for
         ``--rounds`` rounds (median per model), with ratios to Swin-T
  train  forward + backward of SOFT-S (default and fast modes), XCiT-SimA and Swin-T at
         ``--train-batch`` images: a training step without the optimizer

Both time SOFT-S with ``landmark_grid=16`` too and, on CUDA, with its stages replayed from
CUDA graphs (``GRAPH_MODES``: the paper's landmarks and ``landmark_grid=16``). ``--models``
keeps both to the backbones named (with Swin-T, the ratios' base), and the train section
to SOFT-S's default and ``landmark_grid=16``. ``--soft-plans`` adds SOFT-S under other
plans (``path_plan``'s names, e.g. 'tf32-1-8-pad32'): rows 'SOFT-S [plan NAME]'.

``--compile MODE`` adds SOFT-S and Swin-T under ``torch.compile(mode=MODE)`` to both.
"""
import numpy as np

from .common import (GRAPH_MODES, TRAINED_BESIDE, build, faster, fmt, measure, measure_path,
                     parse_size, soft_modes)

SPEED_MODELS = ('SOFT-S', 'Swin-T', 'PVT-S', 'ResNet-50', 'XCiT-SimA-S12/16',
                'XCiT-SimA-S12/16 trunk', 'XCiT-S12/16 (mmpretrain)')
# SOFT-S's modes: the speed section's beside its default, and the train section's (with
# --models, 'auto' and 'grid16' and the CUDA-graph modes)
SPEED_MODES = ('grid16', ) + GRAPH_MODES
TRAIN_MODES = ('auto', 'tf32', 'regularized', 'grid16') + GRAPH_MODES


def _models(args):
    """The backbones of the speed section: --models (with Swin-T) or all."""
    models = getattr(args, 'models', None)
    if not models:
        return list(SPEED_MODELS)
    return [n for n in SPEED_MODELS if n in models or n == 'Swin-T']


def section_speed(args, out):
    names = _models(args)
    rounds = {}  # name -> size -> [seconds per round]
    for r in range(args.rounds):
        for size in args.sizes:
            hw = parse_size(size)
            timed = {}
            for name in names:
                timed[name] = measure(build(name), hw, args.device, args.repeat, amp=args.amp)
            for mode in soft_modes(args, SPEED_MODES) if 'SOFT-S' in names else ():
                timed[f'SOFT-S [{mode}]'] = measure(build('SOFT-S', mode), hw, args.device,
                                                    args.repeat, amp=args.amp)
            for path in _plans(args) if 'SOFT-S' in names else ():
                timed[f'SOFT-S [plan {path}]'] = measure_path(path, hw, args.device,
                                                              args.repeat, amp=args.amp)
            if not args.skip_official:
                timed['SOFT-S official order'] = measure(
                    build('SOFT-S', 'official order'), hw, args.device,
                    # above 600² one warm-up and one timed run (it is slow on a CPU)
                    min(args.repeat, 1) if hw[0] * hw[1] > 600 * 600 else args.repeat,
                    mode='official order', amp=args.amp)
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
                         f'{faster(rows["SOFT-S official order"][s], rows["SOFT-S"][s])} '
                         f'the official computation order at {s}.')
    lines += _compiled_lines(args, rows)
    trunks = ('XCiT-SimA-S12/16 trunk', 'XCiT-S12/16 (mmpretrain)')
    for s in args.sizes if all(t in rows for t in trunks) else []:
        ratio = rows['XCiT-SimA-S12/16 trunk'][s] / rows['XCiT-S12/16 (mmpretrain)'][s]
        lines.append(f'XCiT-SimA-S12/16 trunk / MMPretrain XCiT-S12/16 at {s}: {ratio:.2f} '
                     '(both without a pyramid; the pyramid adds its transposed convolutions).')
    out['speed'] = rows
    return lines


def _plans(args):
    """--soft-plans: the paths SOFT-S is timed under besides its modes."""
    return getattr(args, 'soft_plans', None) or ()


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
                         f'{faster(eager_row[s], compiled_row[s])} eager at {s}.')
    return lines


def section_train(args, out):
    rows = {}
    b = args.train_batch
    named = getattr(args, 'models', None)
    modes = [m for m in TRAIN_MODES if not named or m not in ('tf32', 'regularized')]
    others = [n for n in TRAINED_BESIDE if n in _models(args)]
    for size in args.sizes:
        hw = parse_size(size)
        for mode in soft_modes(args, modes) if not named or 'SOFT-S' in named else ():
            rows.setdefault(f'SOFT-S [{mode}]', {})[size] = measure(
                build('SOFT-S', mode), hw, args.device, args.repeat, train=True, batch=b,
                amp=args.amp)
        for path in _plans(args):
            rows.setdefault(f'SOFT-S [plan {path}]', {})[size] = measure_path(
                path, hw, args.device, args.repeat, train=True, batch=b, amp=args.amp)
        for name in others + ['Swin-T']:
            rows.setdefault(name, {})[size] = measure(build(name), hw, args.device,
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
