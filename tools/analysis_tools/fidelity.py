"""SOFT's fidelity where users see it: each output map of a SOFT backbone, and one training
step's parameter gradients, under each way of computing its attention, against the
float64 computation in the official order.

The floor a default path keeps: every output map within 1e-5 (max |Δ| / max |ref|) on
every image, flat ones included, and every parameter's gradient within 1e-4 (‖Δ‖ /
‖ref‖), BatchNorm in eval mode; each within twice the float32
official order's deviation where that is larger (the maps' bound column): float32
alone can miss 1e-5 on a map. A ReLU input within rounding of 0 that lands on the other
side than in float64 moves the whole gradient through it on any path, the float32
official order's too: the gradients are compared with the float64 step along the
float32 step's branches there, and such flips are counted beside them
(docs/en/notes/numerics.md). The paths (``--paths``, ``mmsoft.benchmark.common.path_plan``):

  default                 the plan of the device the tool runs on
  cpu, cuda               a device type's plan (CUDA's on the CPU: TF32 emulated)
  official                the official computation order in float32 (what the
                          official code computes: float32's own rounding)
  iterative               the formed float32 iterate
  spectral                one eigendecomposition (float32 where a first-order bound
                          allows it, else float64)
  tf32-F-L                TF32 products between F float32 steps first and L last, e.g.
                          tf32-1-2; tf32-F-L-padN: with m zero-padded to a multiple of N;
                          ...-thinK: the last K float32 steps applied to the thin matrix
                          (in training too where that costs less)

each followed by modifiers +X, X a registered inverse variant in place of the plan's
'tf32' (e.g. cuda+tf32-guarded). ``--import MODULE ...`` imports modules before anything
runs, as mmengine's ``custom_imports`` do: ``--import projects.soft_lab`` registers the
lab's candidates ('tf32-guarded', 'tf32-horner'). Run from the
repository root: a module of projects/ that is not on sys.path is looked for in the
working directory (or put the root on PYTHONPATH).

Examples:
  python tools/analysis_tools/fidelity.py --size 640x640
  python tools/analysis_tools/fidelity.py --size 800x1344 --paths cpu cuda tf32-1-8 --gradients
  python tools/analysis_tools/fidelity.py --size 512x512 --crop 32,32,448,448 --seed 1 \\
      --images coffee --gradients --gradient-images coffee --paths official cpu cuda
  python tools/analysis_tools/fidelity.py --device cuda --size 800x1344 --gradients \\
      --paths default iterative tf32-1-4 tf32-1-6 tf32-1-8 --json fidelity.json
  python tools/analysis_tools/fidelity.py --device cuda --import projects.soft_lab \\
      --paths default default+tf32-guarded default+tf32-horner

Without --checkpoint the weights are random (--seed, default 0): the tool says so.
Images: the scikit-image photos, silhouette and text page of
``mmsoft.testing.FIDELITY_IMAGES`` and a near-blank wall, resized to --size (and cut to
--crop).
"""
import json
import sys
import time
from contextlib import nullcontext

import torch

from mmsoft.apis import cli
from mmsoft.benchmark.common import import_modules, path_plan

# The lab (projects/soft_lab/), whose candidates --import registers
LAB = 'projects.soft_lab'


def build_parser():
    """The argument parser of this tool."""
    from mmsoft.testing import FIDELITY_IMAGES, NATURAL_IMAGES
    parser = cli.tool_parser(__doc__)
    cli.add_model_args(parser)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--import', nargs='+', dest='imports', default=[], metavar='MODULE',
                        help=f'import these modules first, e.g. --import {LAB}: the '
                        "lab's candidates for --paths")
    parser.add_argument('--size', default='640x640', metavar='HxW',
                        help='the images are resized to this size')
    parser.add_argument('--crop', metavar='TOP,LEFT,H,W',
                        help='then cropped to this window of the resized image')
    parser.add_argument('--seed', type=int, default=0,
                        help='the random weights\' seed (without --checkpoint)')
    parser.add_argument('--paths', nargs='+', default=['default', 'cpu', 'cuda'])
    parser.add_argument('--images', nargs='+', default=list(FIDELITY_IMAGES),
                        choices=sorted(FIDELITY_IMAGES))
    parser.add_argument('--gradients', action='store_true',
                        help="also one training step's gradients, on --gradient-images")
    parser.add_argument('--gradient-images', nargs='+', default=list(NATURAL_IMAGES),
                        choices=sorted(FIDELITY_IMAGES),
                        help='images of the gradient floor (default: the natural photos '
                        f'{", ".join(NATURAL_IMAGES)}; any image works, flat ones '
                        'included)')
    parser.add_argument('--tf32-convolutions', action='store_true',
                        help="CUDA: keep PyTorch's default TF32 convolutions (they alone move "
                        'the outputs by ~5e-4, whatever computes the attention; off by '
                        "default, so that the paths' own rounding is measured)")
    parser.add_argument('--json', help='write the deviations to this JSON file')
    return parser


def main(argv=None):
    from mmsoft.testing import (GRADIENT_TOL, OUTPUT_TOL, check_crop, fidelity_image,
                                gradient_deviations, official_order, output_bounds,
                                output_deviations, reference_gradients, reference_outputs)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        import_modules(args.imports)
    except ImportError as e:
        parser.error(f'--import: {e} (run from the repository root, or put it on '
                     'PYTHONPATH)')
    cli.setup_logging()
    try:
        H, W = (int(v) for v in args.size.lower().split('x'))
    except ValueError:
        parser.error(f'--size must be HxW, got {args.size!r}')
    crop = None
    if args.crop:
        try:
            crop = check_crop(args.crop.split(','), (H, W))
        except ValueError as e:
            parser.error(f'--crop {args.crop}: {e}')
    plans = {}  # path: its plan, None for 'official'
    for name in args.paths:
        try:
            plans[name] = None if name == 'official' else path_plan(name, args.device)
        except ValueError as e:
            lab = '+' in name and LAB not in sys.modules
            parser.error(f'--paths: {e}' + (f" (the lab's candidates, e.g. +tf32-guarded, "
                                            f'need --import {LAB})' if lab else ''))
    if not args.tf32_convolutions:
        torch.backends.cudnn.allow_tf32 = False  # no effect off CUDA
    torch.manual_seed(args.seed)
    model, weights = cli.backbone_from_args(args)
    model = model.to(args.device).eval()
    device_type = torch.device(args.device).type
    convs = ('' if device_type != 'cuda' else ', TF32 convolutions '
             + ('on' if torch.backends.cudnn.allow_tf32 else 'off'))
    at = f'{H}×{W}' + (f', cropped to {crop[2]}×{crop[3]} at ({crop[0]}, {crop[1]})'
                          if crop else '')
    print(f'# fidelity of {cli.model_name(args)} ({weights}, seed {args.seed}) at {at} on '
          f'{args.device}'
          f'{convs}, torch {torch.__version__}: worst output map (max |Δ| / max |ref|) '
          f'against the float64 official order; floor {OUTPUT_TOL:g}, or twice the float32 '
          "official order's where that is larger (the bound column)\n")
    print('| image | bound | ' + ' | '.join(args.paths) + ' |')
    print('|---|---|' + '---|' * len(args.paths))
    results = dict(size=[H, W], crop=crop, seed=args.seed, device=args.device,
                   weights=weights, outputs={}, gradients={})
    for image in args.images:
        x = fidelity_image(image, (H, W), crop).to(args.device)
        refs = reference_outputs(model, x)
        bounds = output_bounds(model, x, refs)
        row = {}
        for name, plan in plans.items():
            t = time.perf_counter()
            with official_order() if plan is None else nullcontext():
                devs = output_deviations(model, x, refs, plan, device_type)
            row[name] = dict(maps=devs, seconds=time.perf_counter() - t,
                             misses=any(d > b for d, b in zip(devs, bounds)))
        results['outputs'][image] = row
        results.setdefault('output_bounds', {})[image] = bounds
        print(f'| {image} | {max(bounds):.1e} | ' + ' | '.join(
            f'{max(r["maps"]):.1e}{" (misses)" if r["misses"] else ""}'
            for r in row.values()) + ' |', flush=True)
    if args.gradients:
        print(f'\nWorst parameter gradient (‖Δ‖ / ‖ref‖) of one training step, BatchNorm '
              f'in eval mode, against the float64 step along the float32 step\'s branches '
              f'at ReLU inputs within rounding of 0; bound: {GRADIENT_TOL:g}, or twice the '
              'float32 official order\'s where that is larger. "flips": such inputs on the '
              'other side of 0 than in float64, and the worst deviation with their float64 '
              'branch (each flip moves the whole gradient through it, on any path)\n')
        print('| image | float32 official order | bound | ' + ' | '.join(args.paths) + ' |')
        print('|---|---|---|' + '---|' * len(args.paths))
        for image in args.gradient_images:
            x = fidelity_image(image, (H, W), crop).to(args.device)
            ref = reference_gradients(model, x)

            def measured(plan):
                with official_order() if plan is None else nullcontext():
                    r = gradient_deviations(model, x, ref, plan, device_type)
                worst = max(r.deviations, key=r.deviations.get)
                return dict(gradients=r.deviations, worst=worst, flips=r.flips,
                            largest_flip=r.largest_flip,
                            with_flips=max(r.with_flips.values()),
                            beyond_rounding=r.beyond_rounding)

            base = measured(None)  # the float32 official order
            bound = max(GRADIENT_TOL, 2 * base['gradients'][base['worst']])

            def cell(r):
                dev = r['gradients'][r['worst']]
                n = r['flips']
                flipped = (f', {n} flip{"s" if n > 1 else ""} (with {"them" if n > 1 else "it"} '
                           f'{r["with_flips"]:.1e})' if n else '')
                beyond = (f', {r["beyond_rounding"]} ReLU inputs off beyond rounding'
                          if r['beyond_rounding'] else '')
                return (f'{dev:.1e} ({r["worst"]}){" (misses)" if dev > bound else ""}'
                        f'{flipped}{beyond}')

            row = {name: measured(plan) for name, plan in plans.items()}
            results['gradients'][image] = dict(bound=bound, official=base, paths=row)
            print(f'| {image} | {cell(base)} | {bound:.1e} | '
                  + ' | '.join(cell(r) for r in row.values()) + ' |', flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == '__main__':
    main()
