"""Newton–Raphson convergence and the effect of attention normalization, per SOFT layer.

- Fig. 4 of the SOFT paper: ||A·A_k·A − A||₂ / ||A||₂ against the iteration k for every
  SOFT layer, averaged over the given images (``convergence.csv``, ``convergence.png``).
- Fig. 5b: the spectral norm of A⁺ with and without attention normalization against the
  number of landmarks m, by running the images at several sizes (``inverse_norm.csv``,
  ``inverse_norm.png``).

Example:
  python tools/analysis/newton_convergence.py --backbone SOFT:small --checkpoint soft_small.pth \\
      --images astronaut coffee chelsea --sizes 224 320 448 640 --out-dir nr
"""
import csv
import os
import os.path as osp
import sys

import numpy as np

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def main(argv=None):
    from tqdm import tqdm

    from mmsoft import analysis
    parser = analysis.tool_parser(__doc__)
    analysis.add_backbone_args(parser)
    parser.add_argument('--images', nargs='+', default=['astronaut', 'coffee', 'chelsea'])
    parser.add_argument('--size', type=int, default=224, help='short side for Fig. 4')
    parser.add_argument('--sizes', nargs='+', type=int, default=[128, 224, 320, 448],
                        help='short sides for Fig. 5b (more landmarks at larger sizes)')
    parser.add_argument('--iters', type=int, default=20)
    parser.add_argument('--out-dir', default='newton_convergence')
    args = parser.parse_args(argv)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    model = analysis.build_backbone(args.backbone, args.config, args.checkpoint)
    os.makedirs(args.out_dir, exist_ok=True)

    # Fig. 4 -------------------------------------------------------------------------
    per_layer = {}
    rows = []
    for img in tqdm(args.images, desc='convergence', file=sys.stderr):
        x = analysis.to_tensor(analysis.load_image(img, args.size))
        for layer, r in analysis.newton_convergence(model, x, args.iters).items():
            per_layer.setdefault(layer, []).append(r['errors'])
            rows += [(layer, img, r['m'], k, e) for k, e in enumerate(r['errors'])]
    with open(osp.join(args.out_dir, 'convergence.csv'), 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['layer', 'image', 'landmarks', 'iteration', 'relative_error'])
        w.writerows(rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    for layer, errs in per_layer.items():
        ax.semilogy(range(args.iters + 1), np.mean(errs, axis=0), label=layer)
    ax.set(xlabel='Newton–Raphson iteration k', ylabel='||A·A_k·A − A||₂ / ||A||₂',
           title='Newton–Raphson convergence per SOFT layer')
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(osp.join(args.out_dir, 'convergence.png'), dpi=120)

    # Fig. 5b ------------------------------------------------------------------------
    norm_rows = []
    for size in tqdm(args.sizes, desc='inverse norms', file=sys.stderr):
        for img in args.images:
            x = analysis.to_tensor(analysis.load_image(img, size))
            for layer, r in analysis.inverse_spectral_norms(model, x).items():
                norm_rows.append((layer, img, size, r['m'], r['plain'], r['normalized']))
    with open(osp.join(args.out_dir, 'inverse_norm.csv'), 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['layer', 'image', 'short_side', 'landmarks', 'norm_pinv',
                    'norm_normalized_pinv'])
        w.writerows(norm_rows)
    fig2, ax2 = plt.subplots(figsize=(6, 4))
    ms = sorted({r[3] for r in norm_rows})
    for col, label in ((4, 'without normalization'), (5, 'with normalization')):
        ax2.loglog(ms, [np.mean([r[col] for r in norm_rows if r[3] == m]) for m in ms], 'o-',
                   label=label)
    ax2.set(xlabel='number of landmarks m', ylabel='||A⁺||₂ (mean over layers, heads)',
            title='Spectral norm of the attention inverse')
    ax2.legend()
    fig2.tight_layout()
    fig2.savefig(osp.join(args.out_dir, 'inverse_norm.png'), dpi=120)
    print(f'wrote convergence.csv/png and inverse_norm.csv/png to {args.out_dir}')
    return dict(convergence=per_layer, inverse_norm=norm_rows, figures=(fig, fig2))


if __name__ == '__main__':
    main()
