"""Speed, memory and scaling of the mmsoft backbones next to mmdet's Swin-T, PVT-Small,
ResNet-50 and MMPretrain's XCiT-S12/16, measured side by side in one run.

Sections (``--sections``, default all that are registered). The first four are the
lab's (projects/soft_lab/benchmark.py, registered by ``--import projects.soft_lab``):
  pinv     the batched 20-step pseudo-inverse alone, by m: the matrix iterations (Y
           formed, as training needs), A⁺·Z for a thin Z as inference computes it,
           'spectral', and on CUDA the TF32 schedules of ``--tf32-schedules``, also
           with their last steps applied to the thin Z; the iterations also on A
           zero-padded to a multiple of ``--pinv-pad`` landmarks (the same iterate,
           aligned sizes): what the plan's ``pinv`` list and its ``TF32`` options
           (float32 steps, padding, thin steps) should say
  matmul   one batched m×m product of the iteration in float32 and TF32 at
           ``--matmul-sizes``, in ms and TFLOP/s: whether TF32 reaches the tensor cores;
           then each way to call a TF32 and a float32 product, per padded m
  dwconv   the depthwise conv on V of SOFT-S's three stages at each ``--sizes`` entry in
           both layouts of ``HeadSharedConv`` (forward at batch 1, forward + backward at
           ``--train-batch``): what the plan's ``local_conv_layout`` should say for the
           device
  kernel   the kernel products κ(Q, Q̃)ᵀ·V and κ(Q, Q̃)·W of SOFT-S's three stages at
           each ``--sizes`` entry: P formed once vs in row chunks of 2^18 … 2^24 elements
           (inference, batch 1) and the chunk sizes with backward (``--train-batch``),
           all variants in turn for ``--rounds`` rounds: what the plan's
           ``kernel_chunk`` and ``kernel_once_up_to`` should say
  speed    backbone forward (batch 1, no grad) at each ``--sizes`` entry, with ratios;
           ``--rounds K`` measures all models K times in turn (median per model)
  train    forward + backward of the SOFT-Small backbone (default and fast modes),
           XCiT-SimA-S12/16 and Swin-T at ``--train-batch`` images (2 by default, as a
           detector trains per GPU): a training step without the optimizer
  modes    SOFT attention modes: time, and deviation from the float64 20-step iterate on
           the parity fixture input and on a real photo (scikit-image's astronaut) and
           from the outputs the official code produced for the fixture
  memory   peak memory at the largest --sizes entry (a process per model and step): one
           forward at batch 1 and one training step at ``--train-batch`` images, for
           SOFT-S modes, the official computation order (forward only), XCiT-SimA-S12/16
           and Swin-T (``--models``: SOFT-S's default and the backbones named)
  launches ATen operators (on a GPU: kernel launches) per forward and training step of
           SOFT-S modes, XCiT-SimA and Swin-T at each ``--sizes`` entry, counted on the
           meta device with CUDA's plan (no GPU needed): eager mode's host work per step;
           and the floating-point operations of their matrix products
  detector one training iteration (data → backbone → neck → head → losses → backward →
           optimizer step, batch ``--train-batch``) and one test forward per image of
           RetinaNet and Mask R-CNN from the shipped SOFT-S configs (the exact ones and
           the fast mode's ``*_soft-s-grid16_fpn_1x_coco.py``), and of the exact configs
           with Swin-T as the backbone, at ``--detector-size``: the ratio a user
           sees in mmengine's ``time:`` column (needs mmcv's compiled ops)
  profile  SOFT-S's forward (batch 1) and training step (``--train-batch``) at each
           ``--sizes`` entry, under its default plan and each ``--soft-plans`` path, by
           kernel (``torch.profiler``; on a CPU the operators' own time): where the time
           goes
  scaling  time and peak memory over ``--sweep`` sizes, fitted exponent vs token count,
           with vanilla softmax attention (PVT-Small without spatial reduction) as the
           quadratic baseline; ``--plot FILE.png`` draws it

``--compile MODE`` adds SOFT-S and Swin-T wrapped in ``torch.compile(mode=MODE)`` to the
speed and train sections (MODE 'default', 'reduce-overhead' — CUDA graphs on a GPU — or
'max-autotune'); each measurement compiles afresh from a reset (a static graph for its
size), and its first, compiling call is not timed (it is printed). ``--models`` keeps
the speed, train and memory sections to the backbones named (and Swin-T).
``--soft-plans`` adds SOFT-S under other attention plans to speed and train (and to the
profile), by the names of
tools/analysis_tools/fidelity.py's paths (e.g. ``iterative tf32-1-8 tf32-1-2-pad32``, or
with the lab's candidates ``default+tf32-guarded``): the time of each candidate plan
beside the floor that fidelity.py measures for it.

``--import MODULE ...`` imports modules before anything runs, as mmengine's
``custom_imports`` do, and each package's ``benchmark`` module where it has one (its
sections). ``--import projects.soft_lab`` registers the lab's candidates (the inverse
variants 'tf32-guarded' and 'tf32-horner', for path modifiers) and its sections pinv,
matmul, dwconv and kernel.
Run from the repository root: a module of projects/ that is not on sys.path is looked
for in the working directory (or put the root on PYTHONPATH).

"official order" is the official SOFT code's computation order (P computed twice,
(P·Â)·(Pᵀ·V), 20 Newton–Raphson matrix iterations), run by ``mmsoft.testing.official_order``
(``mmsoft.models.attention.official_order_attention``); its outputs
equal the reference, only its cost differs.

The plan is ``AttentionPlan`` in mmsoft/models/attention/plan.py; the sections live in
``mmsoft.benchmark`` (one module per group of sections) and the lab's in
``projects.soft_lab.benchmark``; this file is the command line.

Usage: python tools/analysis_tools/benchmark.py [--device cpu|cuda] [--sections speed,modes]
       [--plot f.png]
       python tools/analysis_tools/benchmark.py --import projects.soft_lab --sections pinv
"""
import argparse
import json
import shlex
import sys

import torch

from mmsoft.benchmark import SECTIONS
from mmsoft.benchmark.common import (AMP_DTYPES, device_label, import_modules, path_plan,
                                     run_record)
from mmsoft.models.attention import PLANS

# The lab (projects/soft_lab/): its candidates and the plan's sections, by --import
LAB = 'projects.soft_lab'
LAB_SECTIONS = ('pinv', 'matmul', 'dwconv', 'kernel')


def _schedule(text):
    """'F,L' -> (F, L): float32 steps before and after 'tf32''s TF32 steps."""
    try:
        first, last = (int(v) for v in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected F,L (two ints), got {text!r}')
    if first < 0 or last < 0 or first + last > 20:
        raise argparse.ArgumentTypeError(f'F and L must be >= 0 with F + L <= 20, got {text!r}')
    return first, last


def build_parser():
    """The argument parser of this tool."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split('\n\n', 1)[1])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--import', nargs='+', dest='imports', default=[], metavar='MODULE',
                        help='import these modules first (and each package\'s benchmark '
                        f'module), e.g. --import {LAB}: the lab\'s candidates and its '
                        f'sections {", ".join(LAB_SECTIONS)}')
    parser.add_argument('--sections', help='comma-separated (default: every registered '
                        'section, in order)')
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
    parser.add_argument('--tf32-schedules', nargs='+', type=_schedule, metavar='F,L',
                        default=[PLANS['cuda'].may_run('tf32')[0].float32_steps],
                        help="pinv (CUDA): 'tf32' with F float32 steps first and L last "
                        "(default: CUDA's plan's)")
    parser.add_argument('--matmul-sizes', nargs='+', type=int,
                        default=[1024, 1025, 1050, 1056],
                        help='landmark counts m of the matmul section')
    parser.add_argument('--skip-official', action='store_true',
                        help='skip the (slow) official computation order')
    parser.add_argument('--softmax-max-pixels', type=int, default=600 * 600,
                        help='largest input (H·W) for the vanilla softmax baseline')
    parser.add_argument('--series', type=int, metavar='K',
                        help='scaling: only the first K series (SOFT-S default, SOFT-S '
                        'grid16, XCiT-SimA, PVT-S softmax, Swin-T)')
    parser.add_argument('--models', nargs='+', metavar='NAME',
                        help='speed and train: only these backbones (Swin-T, the reference '
                        'of the ratios, always; SOFT-S in its default mode only), e.g. '
                        '--models SOFT-S Swin-T')
    parser.add_argument('--soft-plans', nargs='+', metavar='PATH', default=[],
                        help='speed, train and profile: also time SOFT-S under these plans '
                        '(the paths of tools/analysis_tools/fidelity.py, e.g. '
                        f'tf32-1-8-pad32; the lab\'s, e.g. default+tf32-guarded, with '
                        f'--import {LAB})')
    parser.add_argument('--compile', choices=['default', 'reduce-overhead', 'max-autotune'],
                        help='speed and train: also time SOFT-S and Swin-T under '
                        'torch.compile with this mode')
    parser.add_argument('--amp', choices=sorted(AMP_DTYPES),
                        help='speed, train: run the models under torch.autocast to bfloat16 '
                        "or float16 (SOFT's pseudo-inverse stays float32)")
    parser.add_argument('--plot', help='write the scaling plot to this PNG')
    parser.add_argument('--json', help='write all numbers to this JSON file')
    return parser


def _import(parser, names):
    """``--import``: each module, then each package's ``benchmark`` module where it has
    one (``import_modules``); a module that cannot be imported is a command-line error."""
    import importlib.util
    try:
        import_modules(names)
        import_modules([f'{n}.benchmark' for n in names
                        if hasattr(sys.modules[n], '__path__')
                        and importlib.util.find_spec(f'{n}.benchmark') is not None])
    except ImportError as e:
        parser.error(f'--import: {e} (run from the repository root, or put it on '
                     'PYTHONPATH)')


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    _import(parser, args.imports)
    sections = args.sections.split(',') if args.sections else list(SECTIONS)
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        lab = [s for s in unknown if s in LAB_SECTIONS]
        parser.error(f'unknown sections {unknown}; choose from {list(SECTIONS)}'
                     + (f' ({", ".join(lab)}: the lab\'s sections, registered by --import '
                        f'{LAB})' if lab else ''))
    if args.models:
        from mmsoft.benchmark.speed import SPEED_MODELS
        bad = set(args.models) - set(SPEED_MODELS)
        if bad:
            parser.error(f'unknown --models {sorted(bad)}; choose from {list(SPEED_MODELS)}')
    for path in args.soft_plans:
        try:
            if path != 'official':  # the official order, no plan
                path_plan(path, args.device)
        except ValueError as e:
            lab = '+' in path and LAB not in sys.modules
            parser.error(f'--soft-plans: {e}' + (f" (the lab's candidates, e.g. "
                                                 f'+tf32-guarded, need --import {LAB})'
                                                 if lab else ''))
    dev = device_label(args.device)
    precision = (f'autocast to {AMP_DTYPES[args.amp]} in speed and train'
                 if args.amp else 'float32')
    print(f'# mmsoft benchmark: {dev}, torch {torch.__version__}, {precision}')
    argv = sys.argv[1:] if argv is None else list(argv)
    out = dict(device=dev, run=run_record(
        shlex.join(['python', 'tools/analysis_tools/benchmark.py', *argv]), dev))
    for name in sections:
        print(f'\n## {name}', flush=True)
        print('\n'.join(SECTIONS[name](args, out)), flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(out, f, indent=1, default=float)
    return out


if __name__ == '__main__':
    main()
