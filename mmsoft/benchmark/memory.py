"""Peak memory, each measurement in a fresh process (``common.child_measure``):

  memory   at the largest ``--sizes`` entry: one forward at batch 1 and one training step
           at ``--train-batch`` images, for SOFT-S modes, the official computation order
           (forward only), XCiT-SimA-S12/16 and Swin-T (``--models``: those named)
  scaling  time and peak memory over the ``--sweep`` sizes, with the exponent of time vs
           token count fitted; vanilla softmax attention (PVT-Small without spatial
           reduction) is the quadratic baseline; ``--plot FILE.png`` draws it
"""
import numpy as np

from .common import TRAINED_BESIDE, child_measure, fmt, parse_size, soft_modes

SCALING_SERIES = (('SOFT-S', 'auto'), ('SOFT-S', 'grid16'), ('XCiT-SimA-S12/16', None),
                  ('PVT-S softmax (no SR)', None), ('Swin-T', None))


def section_scaling(args, out):
    series = list(SCALING_SERIES)
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
                r = child_measure(name, mode or 'auto', size, args.device, args.repeat)
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
    process: a forward at batch 1 and a training step at ``--train-batch`` images, for
    SOFT-S's modes (its default alone with ``--models``), XCiT-SimA-S12/16 (unless
    ``--models`` leaves it out) and Swin-T."""
    size, b = args.sizes[-1], args.train_batch
    named = getattr(args, 'models', None)
    modes = ('auto', ) if named else ('auto', 'tf32', 'regularized', 'grid16')
    series = ([('SOFT-S', m) for m in soft_modes(args, modes)]
              if not named or 'SOFT-S' in named else [])
    series += [(n, 'auto') for n in TRAINED_BESIDE if not named or n in named]
    series.append(('Swin-T', 'auto'))
    if not args.skip_official and (not named or 'SOFT-S' in named):
        series.insert(1, ('SOFT-S', 'official order'))
    lines = [f'| backbone @{size} | forward, batch 1 | peak memory | forward+backward, '
             f'batch {b} | peak memory | training peak vs Swin-T |',
             '|---|---|---|---|---|---|']
    rows = {}
    for name, mode in series:
        label = name + (f' [{mode}]' if name == 'SOFT-S' else '')
        # the official order: one warm-up and one timed run (it is slow on a CPU)
        repeat = min(args.repeat, 1) if mode == 'official order' else args.repeat
        fwd = child_measure(name, mode, size, args.device, repeat)
        trn = None
        if mode != 'official order':  # the reference order, timed for inference only
            trn = child_measure(name, mode, size, args.device, repeat, train=True,
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
