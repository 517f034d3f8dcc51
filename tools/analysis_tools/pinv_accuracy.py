"""Accuracy of SOFT's pseudo-inverse paths on landmark kernels that are hard for float32.

For each kernel (``mmsoft.testing.hard_landmarks``: clustered, pooled, duplicated,
near-rank-1, near-identity landmarks, and landmarks on the step size's boundary), size m
and seed: the output deviation of A⁺·Z from the float64 20-step iterate of the same float32
kernel, for each path (``mmsoft.testing.PINV_PATHS``) without gradients (inference) and
with them (training), next to the official code's float32 iteration. The bound every
path a plan may take keeps: finite, and within 1e-3, or within twice the official
iteration's deviation where that is larger (tests/models/attention/test_attention.py);
'>' marks a deviation beyond it. The ratio to the official iteration is reported, not
gated: fidelity is judged on the network's outputs (tools/analysis_tools/fidelity.py).
'tf32' is emulated off CUDA; ``--device cuda`` runs the paths on a GPU
(the references stay float64 on the CPU).

Examples:
  python tools/analysis_tools/pinv_accuracy.py
  python tools/analysis_tools/pinv_accuracy.py --sizes 64 196 400 --seeds 0 1 2 3
  OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default python tools/analysis_tools/pinv_accuracy.py
  python tools/analysis_tools/pinv_accuracy.py --device cuda --sizes 196 400 1024 --seeds 0 1
"""
from mmsoft.apis import cli


def build_parser():
    """The argument parser of this tool."""
    from mmsoft import testing
    parser = cli.tool_parser(__doc__)
    parser.add_argument('--kinds', nargs='+', default=list(testing.HARD_KERNELS),
                        choices=testing.HARD_KERNELS)
    parser.add_argument('--sizes', nargs='+', type=int, default=[64, 196],
                        help='landmarks m (multiples of 4 that are squares: 64, 196, 400)')
    parser.add_argument('--seeds', nargs='+', type=int, default=[0])
    parser.add_argument('--paths', nargs='+', default=list(testing.PINV_PATHS),
                        choices=list(testing.PINV_PATHS))
    parser.add_argument('--device', default='cpu', help="where the paths run ('cuda': the "
                        "GPU's own TF32)")
    return parser


def main(argv=None):
    from mmsoft import testing
    args = build_parser().parse_args(argv)
    rows = []
    for kind in args.kinds:
        for m in args.sizes:
            for seed in args.seeds:
                r = testing.pinv_accuracy(kind, m, seed, paths=args.paths,
                                          device=args.device)
                rows.append(dict(kind=kind, m=m, seed=seed, **r))
    cols = [c for c in rows[0] if c not in ('kind', 'm', 'seed', 'floor', 'bound')]
    print('Deviation of A⁺·Z from the float64 iterate (× the official float32 '
          "iteration's); '>' beyond the bound\n")
    print('| kernel | m | seed | official float32 | bound | ' + ' | '.join(cols) + ' |')
    print('|---|---|---|---|---|' + '---|' * len(cols))
    for r in rows:
        cells = [f"{'>' if r[c] > r['bound'] else ''}{r[c]:.1e} ({r[c] / r['floor']:.2g}×)"
                 for c in cols]
        print(f"| {r['kind']} | {r['m']} | {r['seed']} | {r['floor']:.1e} | "
              f"{r['bound']:.1e} | " + ' | '.join(cells) + ' |')
    print('\nworst, as a share of the bound: ' + ', '.join(
        f"{c} {max(r[c] / r['bound'] for r in rows):.2f}" for c in cols))
    return rows


if __name__ == '__main__':
    main()
