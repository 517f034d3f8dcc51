"""Newton–Raphson convergence and the effect of attention normalization, per SOFT layer.

- Fig. 4 of the SOFT paper: ||A·A_k·A − A||₂ / ||A||₂ against the iteration k for every
  SOFT layer, averaged over the given images (``convergence.csv``, ``convergence.png``).
- Fig. 5b: the spectral norm of A⁺ with and without attention normalization against the
  number of landmarks m, by running the images at several sizes (``inverse_norm.csv``,
  ``inverse_norm.png``).
- The convergence boundary (``boundary.csv``, also printed): per layer and image, the
  share of A's eigenvalues with αλ² ≥ 1.9 (the official α allows up to 2), the largest
  αλ², and the worst shortfall |1 - αλ²|^(2^T) of the iterate on the upper side (0: it
  is 1/λ there; 1: it is 0, as for A = I). Landmarks far apart (A ≈ I) sit there and
  shrink the attention output; the iterate is the official one either way. Also how
  near α's choice came to going the other way (``alpha_margin``: a margin within
  float32 rounding, ~1e-7, is a tie, which α's float64 test decides as the float64
  reference does), and a bound on αλ² from the kernel's row sums (``first_step_bound``:
  at most 1 proves every eigenvalue far from the step size's boundary at 2).

Examples:
  # after bash scripts/quickstart.sh: its SOFT-Tiny on mini-set images
  python tools/analysis_tools/newton_convergence.py --config configs/_mini_/retinanet_soft-t_fpn_mini-coco.py \\
      --checkpoint work_dirs/quickstart
  # official ImageNet weights (docs/en/user_guides/checkpoints.md) on photos
  python tools/analysis_tools/newton_convergence.py --backbone SOFT:small --checkpoint checkpoints/soft_small_norm.pth \\
      --images astronaut coffee chelsea --sizes 224 320 448 640

--images: files or scikit-image sample names; default: the config's first three test images
when they exist, else astronaut coffee chelsea. Without --checkpoint the weights are random:
the tool warns and the titles say so. Output goes to work_dirs/newton_convergence/ unless
--out-dir says otherwise.
"""
import csv
import os
import os.path as osp
import sys

import numpy as np

from mmsoft import visualization
from mmsoft.apis import cli, inference


def convergence_figure(per_layer, iters, title):
    """Fig. 4: mean relative error per layer against the iteration (integer ticks)."""
    from matplotlib.ticker import MaxNLocator
    fig = visualization.figure(6.4, 4.2)
    ax = fig.add_subplot()
    for layer, errs in per_layer.items():
        ax.semilogy(range(iters + 1), np.mean(errs, axis=0), label=layer)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.set_xlim(0, iters)
    ax.set(xlabel='Newton–Raphson iteration k',
           ylabel=r'$\|A A_k A - A\|_2 \,/\, \|A\|_2$ (mean over images, heads)')
    ax.set_title(title, fontsize=10)
    ax.grid(True, which='major', alpha=0.3)
    ax.legend(fontsize=6, ncol=2 if len(per_layer) > 8 else 1)
    return fig


def inverse_norm_figure(norm_rows, title):
    """Fig. 5b: mean ||A⁺||₂ against m, without and with normalization. Both log axes are
    labelled at 1, 2, 5 × 10ᵏ in plain numbers, never at the crowded minor ticks."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
    fig = visualization.figure(6.4, 4.2)
    ax = fig.add_subplot()
    ms = sorted({r[3] for r in norm_rows})
    for col, label in ((4, 'without normalization'), (5, 'with normalization')):
        ax.loglog(ms, [np.mean([r[col] for r in norm_rows if r[3] == m]) for m in ms], 'o-',
                  label=label)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        axis.set_major_formatter(FormatStrFormatter('%g'))
        axis.set_minor_formatter(NullFormatter())
    ax.set(xlabel='number of landmarks m (markers: the measured m)',
           ylabel=r'$\|A^+\|_2$ (mean over layers, heads)')
    ax.set_title(title, fontsize=10)
    ax.grid(True, which='major', alpha=0.3)
    ax.legend()
    return fig


def build_parser():
    """The argument parser of this tool."""
    parser = cli.tool_parser(__doc__)
    cli.add_model_args(parser)
    parser.add_argument('--images', nargs='+', help='files or scikit-image samples')
    parser.add_argument('--size', type=int, default=224, help='short side for Fig. 4')
    parser.add_argument('--sizes', nargs='+', type=int, default=[128, 224, 320, 448],
                        help='short sides for Fig. 5b (more landmarks at larger sizes)')
    parser.add_argument('--iters', type=int, default=20)
    parser.add_argument('--out-dir', default=osp.join('work_dirs', 'newton_convergence'))
    return parser


def main(argv=None):
    from tqdm import tqdm

    from mmsoft import analysis
    args = build_parser().parse_args(argv)
    cli.setup_logging()

    model, weights = cli.backbone_from_args(args)
    images = args.images or inference.default_images(args.config, 3,
                                                   ['astronaut', 'coffee', 'chelsea'])
    cli.logger.info('images: ' + '; '.join(inference.describe(i) for i in images))
    names = [osp.basename(str(i)) for i in images]
    os.makedirs(args.out_dir, exist_ok=True)
    about = f'{cli.model_name(args)} · {weights}'

    # Fig. 4 and the convergence boundary, on the same images -------------------------
    per_layer = {}
    rows, boundary_rows = [], []
    for img, name in zip(tqdm(images, desc='convergence', file=sys.stderr), names):
        x = inference.to_tensor(inference.load_image(img, args.size))
        for layer, r in analysis.newton_convergence(model, x, args.iters).items():
            per_layer.setdefault(layer, []).append(r['errors'])
            rows += [(layer, name, r['m'], k, e) for k, e in enumerate(r['errors'])]
        for layer, r in analysis.newton_boundary(model, x, args.iters).items():
            boundary_rows.append((layer, name, r['m'], r['near_share'],
                                  r['max_alpha_lambda2'], r['worst_shortfall'],
                                  r['alpha_margin'], r['first_step_bound']))
    with open(osp.join(args.out_dir, 'convergence.csv'), 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['layer', 'image', 'landmarks', 'iteration', 'relative_error'])
        w.writerows(rows)
    fig = convergence_figure(
        per_layer, args.iters,
        f'Newton–Raphson convergence per SOFT layer\n{about} · {len(images)} images, '
        f'short side {args.size}')
    fig.savefig(osp.join(args.out_dir, 'convergence.png'), dpi=120)

    with open(osp.join(args.out_dir, 'boundary.csv'), 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['layer', 'image', 'landmarks', 'share_alpha_lambda2_ge_1.9',
                    'max_alpha_lambda2', 'worst_shortfall', 'alpha_margin',
                    'first_step_bound'])
        w.writerows(boundary_rows)
    worst = max(boundary_rows, key=lambda r: r[5])
    print(f'convergence boundary: largest αλ² {max(r[4] for r in boundary_rows):.3f}, '
          f'worst shortfall {worst[5]:.2e} ({worst[0]}, {worst[1]}); '
          f'{sum(r[3] > 0 for r in boundary_rows)} of {len(boundary_rows)} layer/image '
          'pairs have eigenvalues at αλ² ≥ 1.9 (boundary.csv)')
    tie = min(boundary_rows, key=lambda r: r[6])
    print(f"α's choice: smallest margin {tie[6]:.1e} from its bound ({tie[0]}, {tie[1]}; "
          'within float32 rounding, ~1e-7, another order of sums could choose another α)')
    far = sum(r[7] <= 1 for r in boundary_rows)
    print(f'the bound on αλ² from the row sums: at most 1 (every eigenvalue far from the '
          f'boundary) in {far} of {len(boundary_rows)} layer/image pairs (largest '
          f'{max(r[7] for r in boundary_rows):.3g})')

    # Fig. 5b ------------------------------------------------------------------------
    norm_rows = []
    for size in tqdm(args.sizes, desc='inverse norms', file=sys.stderr):
        for img, name in zip(images, names):
            x = inference.to_tensor(inference.load_image(img, size))
            for layer, r in analysis.inverse_spectral_norms(model, x).items():
                norm_rows.append((layer, name, size, r['m'], r['plain'], r['normalized']))
    with open(osp.join(args.out_dir, 'inverse_norm.csv'), 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['layer', 'image', 'short_side', 'landmarks', 'norm_pinv',
                    'norm_normalized_pinv'])
        w.writerows(norm_rows)
    fig2 = inverse_norm_figure(norm_rows,
                               f'Spectral norm of the attention inverse\n{about}')
    fig2.savefig(osp.join(args.out_dir, 'inverse_norm.png'), dpi=120)
    print(f'wrote convergence.csv/png, boundary.csv and inverse_norm.csv/png to '
          f'{args.out_dir}')
    return dict(convergence=per_layer, boundary=boundary_rows, inverse_norm=norm_rows,
                figures=(fig, fig2))


if __name__ == '__main__':
    main()
