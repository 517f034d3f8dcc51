"""Accuracy of SOFT's pseudo-inverse paths on landmark kernels that are hard for float32.

For each kernel (``mmsoft.testing.hard_landmarks``: clustered, pooled, duplicated,
near-rank-1, near-identity landmarks), size m and seed: the output deviation of A⁺·Z from
the float64 20-step iterate of the same float32 kernel, for the official code's float32
iteration (the floor) and, as a ratio to it, for each ``pinv_method`` without gradients
(inference) and with them (training). A default path must stay within 2× of the floor
(tests/models/attention/test_attention.py). 'tf32' and 'tf32x3' are emulated off CUDA.

Examples:
  python tools/analysis_tools/pinv_accuracy.py
  python tools/analysis_tools/pinv_accuracy.py --sizes 64 196 400 --seeds 0 1 2 3
  OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default python tools/analysis_tools/pinv_accuracy.py
"""
from mmsoft.apis import cli


def main(argv=None):
    from mmsoft import testing
    parser = cli.tool_parser(__doc__)
    parser.add_argument('--kinds', nargs='+', default=list(testing.HARD_KERNELS),
                        choices=testing.HARD_KERNELS)
    parser.add_argument('--sizes', nargs='+', type=int, default=[64, 196],
                        help='landmarks m (multiples of 4 that are squares: 64, 196, 400)')
    parser.add_argument('--seeds', nargs='+', type=int, default=[0])
    methods = ['iterative', 'spectral', 'tf32', 'tf32x3']
    parser.add_argument('--methods', nargs='+', default=methods, choices=methods)
    args = parser.parse_args(argv)
    rows = []
    for kind in args.kinds:
        for m in args.sizes:
            for seed in args.seeds:
                r = testing.pinv_accuracy(kind, m, seed, methods=args.methods)
                rows.append(dict(kind=kind, m=m, seed=seed, **r))
    cols = [c for c in rows[0] if c not in ('kind', 'm', 'seed', 'floor')]
    print('| kernel | m | seed | official float32 | ' + ' | '.join(cols) + ' |')
    print('|---|---|---|---|' + '---|' * len(cols))
    for r in rows:
        print(f"| {r['kind']} | {r['m']} | {r['seed']} | {r['floor']:.1e} | "
              + ' | '.join(f'{r[c]:.2f}×' for c in cols) + ' |')
    print('\nworst: ' + ', '.join(f'{c} {max(r[c] for r in rows):.2f}×' for c in cols))
    return rows


if __name__ == '__main__':
    main()
