"""Run the measurements a lent GPU machine is for, and write one report: the lab's command
for that machine.

Each step runs as its own process, in the repository root; a failing or slow step is
recorded and the next one runs. Every benchmark and fidelity command takes
``--import projects.soft_lab`` (the candidates, and the benchmark's plan sections). The
steps, by part (one call of a lent GPU machine each):

  --part call (the default: the call a lent GPU machine runs first, CALL_BUDGET seconds;
  what users decide with first, then the floor, then the candidates if time is left; each
  step has its own budget, the last field of STEPS)
  cuda-tests     pytest -m cuda tests/ projects/soft_lab/tests/ (the library's and the
                 candidates' GPU tests; every one is skipped without a GPU)
  backbones      benchmark --sections speed,train at 800x1344, 2 rounds: SOFT-S with the
                 device's plan, with landmark_grid=16 and with cuda_graphs (both ways),
                 XCiT-SimA-S12/16 and Swin-T, forward and training step
  detectors      benchmark --sections detector: RetinaNet and Mask R-CNN training
                 iteration (batch 2, optimizer step) and test forward at 800x1333, SOFT-S
                 (the plan, landmark_grid=16, cuda_graphs) and Swin-T, peak training
                 memory; mmcv's compiled ops served by gpu/mmcv_ops.py (torchvision or
                 PyTorch: no mmcv build on the machine), whose tally says what they took
  memory         benchmark --sections memory at 800x1344: peak memory of a forward and a
                 training step of SOFT-S, XCiT-SimA-S12/16 and Swin-T, a process each
  floor          fidelity.py at 800x1344 (astronaut, page, blank; gradients on the
                 astronaut) under the device's plan: the floor every default keeps
  decide-fp32, decide-fidelity (below): the candidates against CUDA's plan
  --part base (the measurements CUDA's plan was chosen from)
  cuda-tests     (above)
  matmul         benchmark --sections matmul: one m×m product in float32 and TF32 (ms,
                 TFLOP/s): do TF32 products reach the tensor cores? Then one TF32 and
                 one float32 product called each way (the step's baddbmm or bmm alone,
                 transposed, cuBLASLt, TunableOp) at SOFT-S's landmark batches, per
                 padded m
  fidelity-640   tools/analysis_tools/fidelity.py at 640x640 on three images, among them
                 the cat photo, whose maps a tie in α's choice moved on CUDA
                 (docs/en/notes/numerics.md); also CUDA's plan with every step formed
                 (FORMED) and with its first float32 step guarded (GUARDED)
  fp32           benchmark --sections speed,train, SOFT-S also under SPEED_PATHS
                 (--soft-plans: the float32 iterate, FORMED and each candidate): what
                 CUDA's plan gains on this GPU, what its thin steps gain, and what each
                 candidate gains
  fidelity       fidelity.py at 800x1344: SOFT-S's output maps and training gradients
                 under the candidate paths, against float64 in the official order
  profile        benchmark --sections profile at 800x1344: SOFT-S's forward and
                 training step by GPU kernel under the plan (where the time goes)
  memory-modes   benchmark --sections memory,modes
  pinv           benchmark --sections pinv: every way to compute the iterate (formed,
                 thin, 'spectral', the TF32 schedules of TF32_SCHEDULES), also
                 zero-padded: the plan's pinv and its options
  --part decide (what CUDA's plan is chosen from, lean; SOFT-S and Swin-T at 800x1344
  only, DECIDE_PATHS)
  decide-matmul   benchmark --sections matmul at 1050 landmarks padded to a multiple
                  of 32, 64, 128 and 256 (PADDED_SIZES): every way to make one product,
                  side by side, and every way to call a TF32 or a float32 one
  decide-fp32     benchmark --sections speed,train at 800x1344, 2 rounds: the plan and
                  DECIDE_PATHS against Swin-T
  decide-fidelity fidelity.py at 800x1344 (astronaut, page, blank; gradients on the
                  astronaut) for the plan and DECIDE_PATHS
  --part compile (SOFT-S and Swin-T at 800x1344; each torch.compile measurement compiles
  afresh, in one round, and prints how long compiling took, by phase)
  graphs         benchmark --sections speed,train --models SOFT-S Swin-T: SOFT-S with
                 its stages replayed from CUDA graphs (cuda_graphs; exact and
                 landmark_grid=16) against eager SOFT-S and Swin-T, three rounds
  compile        benchmark --sections speed,train --compile default
  compile-ro     the same with --compile reduce-overhead (CUDA graphs)
  --part detector: detectors (above) alone
  --part extra (measured on an H100 already; re-run on another GPU)
  layout         benchmark --sections dwconv,kernel: the plan's local_conv_layout,
                 kernel_chunk and kernel_once_up_to
  bf16, fp16     speed and training step under torch.autocast (--amp bf16 / fp16)

A path's candidate is a modifier (mmsoft.benchmark.common.path_plan): one inverse variant
of the lab in place of the plan's 'tf32', with its options. Off CUDA, where the CPU's plan
has no 'tf32' to replace, the paths with modifiers are left out.

It writes OUT/report.md (the machine, then per step as it completes: the command, its
exit status and seconds, and what it printed, mmengine's log lines left out),
OUT/report.log (everything printed), OUT/<step>.json (the numbers; a detector step's
OUT/<step>-ops.json, the tally of mmcv's ops) and OUT/report.json (the run: commit,
date, torch, CUDA, cuDNN, GPU, the packages beside torch; per step its command, status,
seconds, budget and files; the earlier calls into the same directory under 'earlier').
Each is rewritten as it goes: a call cut short keeps what it measured. The benchmark is
tools/analysis_tools/benchmark.py; the plan whose fields the steps measure is
``AttentionPlan`` in mmsoft/models/attention/plan.py. Run it from the repository root,
with mmsoft importable (installed, or the root on PYTHONPATH).

On the GPU machine (no registry, no git; projects/soft_lab/README.md): here, run
``bash projects/soft_lab/gpu/prepare.sh`` (wheels and the commit into .gpu/, which the
call carries), then one call of under 10 minutes per part:

  source projects/soft_lab/gpu/setup.sh &&
      python3 projects/soft_lab/device_report.py --device cuda --out "$OUT"   (one line)

``--budget`` (CALL_BUDGET by default) stops starting steps once its seconds are spent
and stops a step that outlasts it or its own budget, so the set-up and the report fit in
the call. report.md ends with the candidates (``candidates``: where fp32 and fidelity, or
decide-fp32 and decide-fidelity, both ran, each path's forward and training step against
Swin-T beside its distance to the floor, the table CUDA's plan is chosen from) and the
steps that did not complete; ``--steps NAME ...`` runs just those in a further call (the
report is appended to).

``--small`` runs every step at toy sizes: a check of the script on a CPU, not a
measurement.
"""
import argparse
import importlib.util
import json
import math
import os
import os.path as osp
import platform
import re
import shlex
import signal
import subprocess
import sys
import time

# projects/soft_lab/ -> the repository root: the steps run there (tools/, tests/, configs/)
ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
BENCHMARK = osp.join('tools', 'analysis_tools', 'benchmark.py')
FIDELITY = osp.join('tools', 'analysis_tools', 'fidelity.py')
# what every benchmark and fidelity command imports first: the lab's candidates, and the
# benchmark's plan sections (pinv, matmul, dwconv, kernel)
IMPORT = ['--import', 'projects.soft_lab']

# 'tf32' schedules (float32 steps first, last) the pinv and fidelity steps compare.
TF32_SCHEDULES = ((1, 2), (1, 4), (1, 6), (1, 8))
# CUDA's plan with every step formed (its default applies the last 4 float32 steps to
# the thin matrix, in training too on large kernels): what the floor (fidelity,
# fidelity-640) and the speed (fp32) of the default are compared with
FORMED = 'tf32-1-4-pad32'
# The candidates (projects/soft_lab/variants.py), each in place of CUDA's 'tf32':
# its first float32 step only for a batch of kernels that may sit near the step size's
# boundary ('tf32-guarded'; SOFT-S's kernels on real images sit far from it: TF32 steps
# instead, 2 fewer float32 m×m products per layer)
GUARDED = 'default+tf32-guarded'
# its thin steps as one sum by Horner's rule in inference too ('tf32-horner'; at 800x1344
# one float32 m×m product for the 4 steps instead of 4)
HORNER = 'default+tf32-horner'
# --part decide's candidates for CUDA's plan (the plan itself is the default)
DECIDE_PATHS = (GUARDED, HORNER)
# the tools' options that take paths
PATH_OPTIONS = ('--soft-plans', '--paths')
FIDELITY_PATHS = (['default'] + [f'tf32-{f}-{l}' for f, l in TF32_SCHEDULES]
                  + ['tf32-1-2-pad32', 'tf32-1-8-pad32', FORMED, GUARDED, HORNER])
# the plans the fp32 step times SOFT-S under besides its modes (benchmark --soft-plans):
# the float32 iterate, CUDA's plan with every step formed, and each candidate
SPEED_PATHS = ('iterative', FORMED, GUARDED, HORNER)

# SOFT-S's 1050 landmarks at 800x1344 padded to a multiple of 32 (CUDA's plan), 64, 128
# and 256: the sizes the matmul steps time one product at, each way it can be made (the
# call sweep among them: which padding and which call run a kernel fastest)
PADDED_SIZES = ('1056', '1088', '1152', '1280')

# The call a lent GPU machine runs first (--part call, the default): what users decide with
# (backbones, detectors, memory), then the floor, then the candidates if time is left. Each
# step's budget (seconds, the last field below) is at most its share of CALL_BUDGET; the
# estimates are an H100's times of the same work with a margin (docs/benchmark/cuda_h100*).
CALL_BUDGET = 540
# the backbones the call times at the detection size (the train section adds SOFT-S's
# landmark_grid=16 and, on CUDA, its stages replayed from CUDA graphs)
CALL_MODELS = ('SOFT-S', 'Swin-T', 'XCiT-SimA-S12/16')
# the runner that serves mmcv's compiled ops from torchvision / PyTorch (a detector step
# needs them; no build on the device): it writes its tally beside the step's JSON
MMCV_OPS = osp.join('projects', 'soft_lab', 'gpu', 'mmcv_ops.py')

# name -> (parts, tool, its arguments, title, budget in seconds or None: the call's
# budget alone); a benchmark step's own arguments override FULL's, SMALL's override both.
# tool: 'pytest', 'benchmark', 'detector' (the benchmark through MMCV_OPS) or 'fidelity'.
STEPS = {
    'cuda-tests': (('call', 'base'), 'pytest', [], 'pytest -m cuda', 90),
    'backbones': (('call', ), 'benchmark', ['--sections', 'speed,train', '--models',
                                            *CALL_MODELS, '--sizes', '800x1344', '--rounds',
                                            '2', '--skip-official'],
                  "forward and training step at 800x1344 with the device's plan (SOFT-S "
                  'also with landmark_grid=16 and cuda_graphs), XCiT-SimA and Swin-T', 120),
    'detectors': (('call', 'detector'), 'detector', ['--sections', 'detector', '--rounds', '2',
                                                     '--repeat', '2'],
                  'RetinaNet and Mask R-CNN: training iteration and test forward', 150),
    'memory': (('call', ), 'benchmark', ['--sections', 'memory', '--models', *CALL_MODELS,
                                         '--sizes', '800x1344', '--skip-official'],
               'peak memory of a forward and a training step, a process each', 100),
    'floor': (('call', ), 'fidelity', ['--size', '800x1344', '--images', 'astronaut', 'page',
                                       'blank', '--gradients', '--gradient-images',
                                       'astronaut', '--paths', 'default'],
              "the fidelity floor at 800x1344 under the device's plan (output maps, "
              'training gradients)', 80),
    'matmul': (('base', ), 'benchmark', ['--sections', 'matmul', '--matmul-sizes', '1024',
                                         '1025', '1050', *PADDED_SIZES],
               'one m×m product: float32 and TF32; a TF32 and a float32 product called '
               'each way (cuBLAS, cuBLASLt, TunableOp)', None),
    'fidelity-640': (('base', ), 'fidelity', ['--size', '640x640', '--images', 'chelsea',
                                              'astronaut', 'page', '--paths', 'official',
                                              'iterative', 'default', FORMED, GUARDED],
                     "the floor at 640x640, where a tie in α's choice moved the cat "
                     "photo's maps on CUDA (docs/en/notes/numerics.md)", None),
    'fp32': (('base', ), 'benchmark', ['--sections', 'speed,train', '--soft-plans',
                                       *SPEED_PATHS],
             'speed and training step, float32', None),
    'fidelity': (('base', ), 'fidelity', ['--size', '800x1344', '--gradients', '--paths',
                                          *FIDELITY_PATHS],
                 'the fidelity floor at 800x1344 (output maps, training gradients)', None),
    'profile': (('base', ), 'benchmark', ['--sections', 'profile', '--sizes', '800x1344'],
                "where SOFT-S's time goes, by kernel, under CUDA's plan", None),
    'memory-modes': (('base', ), 'benchmark', ['--sections', 'memory,modes'],
                     'peak memory; attention modes', None),
    'pinv': (('base', ), 'benchmark', ['--sections', 'pinv', '--pinv-sizes', '196', '256',
                                       '400', '1050', '--pinv-pad', '32', '--tf32-schedules']
             + [f'{f},{l}' for f, l in TF32_SCHEDULES],
             "pseudo-inverse by landmark count (the plan's pinv and its options)", None),
    # their own part (a call of its own): at the detection size, SOFT-S and Swin-T
    # only; the CUDA graphs first (cheap), then torch.compile in one round, every
    # measurement compiling its model afresh
    'graphs': (('compile', ), 'benchmark', ['--sections', 'speed,train', '--models', 'SOFT-S',
                                            'Swin-T', '--sizes', '800x1344',
                                            '--skip-official'],
               "SOFT-S with cuda_graphs (its stages replayed from CUDA graphs)", None),
    'compile': (('compile', ), 'benchmark', ['--sections', 'speed,train', '--compile',
                                             'default', '--models', 'SOFT-S', 'Swin-T',
                                             '--rounds', '1', '--sizes', '800x1344',
                                             '--skip-official'],
                'torch.compile()', None),
    'compile-ro': (('compile', ), 'benchmark', ['--sections', 'speed,train', '--compile',
                                                'reduce-overhead', '--models', 'SOFT-S',
                                                'Swin-T', '--rounds', '1', '--sizes',
                                                '800x1344', '--skip-official'],
                   "torch.compile(mode='reduce-overhead')", None),
    'layout': (('extra', ), 'benchmark', ['--sections', 'dwconv,kernel'],
               "depthwise-conv layout and kernel chunks (the plan's local_conv_layout, "
               'kernel_chunk, kernel_once_up_to)', None),
    'bf16': (('extra', ), 'benchmark', ['--sections', 'speed,train', '--amp', 'bf16'],
             'speed and training step, autocast to bfloat16', None),
    'fp16': (('extra', ), 'benchmark', ['--sections', 'speed,train', '--amp', 'fp16'],
             'speed and training step, autocast to float16', None),
    'decide-matmul': (('decide', ), 'benchmark', ['--sections', 'matmul', '--matmul-sizes',
                                                  *PADDED_SIZES],
                      'one m×m product each way, at 1050 landmarks padded 4 ways', None),
    'decide-fp32': (('decide', 'call'), 'benchmark', ['--sections', 'speed,train', '--models',
                                                      'SOFT-S', 'Swin-T', '--sizes',
                                                      '800x1344', '--rounds', '2',
                                                      '--skip-official', '--soft-plans',
                                                      *DECIDE_PATHS],
                    "speed and training step at 800x1344: CUDA's plan and its candidates",
                    100),
    'decide-fidelity': (('decide', 'call'), 'fidelity', ['--size', '800x1344', '--images',
                                                         'astronaut', 'page', 'blank',
                                                         '--gradients', '--gradient-images',
                                                         'astronaut', '--paths', 'default',
                                                         *DECIDE_PATHS],
                        "the floor at 800x1344: CUDA's plan and its candidates", 60),
}
PARTS = ('call', 'base', 'decide', 'compile', 'detector', 'extra')

# What --small changes: toy sizes for every benchmark section.
SMALL = ['--sizes', '64x64', '--repeat', '0', '--rounds', '1', '--train-batch', '1',
         '--pinv-sizes', '16', '130', '--matmul-sizes', '40', '--skip-official',
         '--detector-size', '128x160']
SMALL_FIDELITY = ['--size', '96x128', '--images', 'astronaut', 'blank', '--gradient-images',
                  'astronaut']
FULL = ['--sizes', '512x512', '800x1344', '--rounds', '3']

NO_PYTEST = ('not run: pytest is not installed here (on a GPU machine without a registry, '
             'carry its wheels: pip download --no-deps --only-binary=:all: -d .gpu/whl '
             'pytest pluggy iniconfig)')
MMENGINE_LOG = re.compile(r'^\d\d/\d\d \d\d:\d\d:\d\d - mmengine - ')
# torch's logging (W1124 10:16:31.584000 6836 torch/...) and Python's warnings
# (path:line: SomeWarning: text, then the source line indented)
TORCH_LOG = re.compile(r'^[DIWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ')
PY_WARNING = re.compile(r'^\S.*:\d+: \w*Warning: ')


# what prepare.sh writes into the tree that travels: the commit it was prepared at (the GPU
# machine gets a copy of the working tree without git)
PREPARED_COMMIT = osp.join('.gpu', 'commit')
# the packages beside torch a step may need, by import name (a missing one fails its steps)
BESIDE = ('torchvision', 'triton', 'skimage', 'PIL', 'pytest', 'mmengine', 'mmcv', 'mmdet',
          'mmpretrain')


def commit():
    """(commit, where it was read): the checkout's (``checkout_commit``: git's HEAD, with
    +uncommitted where mmsoft/ differs), else what prepare.sh stored in PREPARED_COMMIT,
    else ('unknown', None)."""
    from mmsoft.benchmark.common import checkout_commit
    rev = checkout_commit(ROOT)
    if rev:
        return rev, 'git'
    try:
        with open(osp.join(ROOT, PREPARED_COMMIT)) as f:
            return f.read().strip(), PREPARED_COMMIT
    except OSError:
        return 'unknown', None


def versions():
    """{import name: version, or None where it does not import} of BESIDE."""
    from importlib import metadata
    found = {}
    for name in BESIDE:
        if importlib.util.find_spec(name) is None:
            found[name] = None
            continue
        dist = {'skimage': 'scikit-image', 'PIL': 'pillow'}.get(name, name)
        try:
            found[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[name] = 'present'
    return found


def machine(device, rev, source, found):
    """Lines describing where the report was measured: the device, the commit ``rev``
    (read from ``source``, ``commit``) and the packages ``found`` beside torch
    (``versions``)."""
    import torch

    from mmsoft.benchmark.common import device_label
    lines = [f'- date (UTC): {time.strftime("%Y-%m-%d %H:%M", time.gmtime())}',
             f'- torch {torch.__version__}, Python {platform.python_version()}, '
             f'{os.cpu_count()} CPU cores ({torch.get_num_threads()} torch threads)']
    if device == 'cuda':
        lines.append(f'- GPU: {device_label(device)}, cuDNN {torch.backends.cudnn.version()}')
    lines.append(f'- mmsoft commit {rev}' + (f' (from {source})' if source != 'git' else ''))
    lines.append('- beside torch: ' + ', '.join(f'{n} {v}' for n, v in found.items() if v)
                 + ''.join(f'; no {n}' for n, v in found.items() if not v))
    return lines


def stamp(path, rev):
    """Where a step's JSON (``path``) names no commit (a tree without git), the prepared
    one: its ``run`` record then says where the commit was read."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return
    run = data.get('run')
    if isinstance(run, dict) and run.get('commit') == 'unknown' and rev != 'unknown':
        run['commit'], run['commit_from'] = rev, PREPARED_COMMIT
        with open(path, 'w') as f:
            json.dump(data, f, indent=1, default=float)


def _runs_here(arg, device):
    """Whether a step's argument can run on ``device``: not a path with modifiers off
    CUDA (the CPU's plan has no 'tf32' to replace)."""
    return device == 'cuda' or '+' not in arg


def _paths_here(own, device):
    """A step's arguments with the paths of ``--soft-plans`` and ``--paths`` that cannot
    run on ``device`` left out (``_runs_here``), an option left without paths too."""
    kept, option = [], None
    for a in own:
        if a.startswith('--'):
            option = a
        elif option in PATH_OPTIONS and not _runs_here(a, device):
            continue
        kept.append(a)
    return [a for i, a in enumerate(kept) if a not in PATH_OPTIONS
            or (i + 1 < len(kept) and not kept[i + 1].startswith('--'))]


def command(name, args):
    """The argv of step ``name`` (the paths that cannot run on ``args.device`` left out:
    ``_paths_here``)."""
    _, tool, own, _, _ = STEPS[name]
    own = _paths_here(own, args.device)
    if tool == 'pytest':
        return [sys.executable, '-m', 'pytest', '-m', 'cuda', 'tests/', 'projects/soft_lab/tests/',
                '-q', '-p', 'no:cacheprovider']
    out = ['--json', osp.join(args.out, f'{name}.json')]
    if tool == 'fidelity':
        return ([sys.executable, FIDELITY, '--device', args.device] + IMPORT + own
                + (SMALL_FIDELITY if args.small else []) + out)
    # the detector steps run the benchmark with mmcv's compiled ops served by MMCV_OPS
    runner = ([MMCV_OPS, '--tally', osp.join(args.out, f'{name}-ops.json')]
              if tool == 'detector' else [])
    # argparse keeps an option's last value: a step's own sizes and rounds override FULL,
    # and --small's toy sizes override everything
    return ([sys.executable] + runner + [BENCHMARK, '--device', args.device] + IMPORT +
            (own + SMALL if args.small else FULL + own) + out)


def run_step(cmd, timeout):
    """(exit status or None if it timed out, seconds, what it printed). A step that
    times out is stopped with the processes it started (the memory section starts one
    per measurement)."""
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        printed, _ = p.communicate(timeout=timeout)
        code = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        printed, _ = p.communicate()
        code = None
    return code, time.perf_counter() - t0, printed


def shown(printed, name):
    """What report.md keeps of a step's output: the pytest summary, or the benchmark's
    tables and sentences without mmengine's and torch's log lines and Python's warnings
    (report.log keeps everything)."""
    if STEPS[name][1] == 'pytest':
        return [ln for ln in printed.splitlines() if not MMENGINE_LOG.match(ln)][-15:]
    lines, warning = [], False
    for ln in printed.splitlines():  # a warning's next line, if indented, is its source
        source, warning = warning and ln.startswith('  '), bool(PY_WARNING.match(ln))
        if not (warning or source or MMENGINE_LOG.match(ln) or TORCH_LOG.match(ln)):
            lines.append(ln)
    # the benchmark's headings one level below the step's
    return ['#' + ln if ln.startswith('#') else ln for ln in lines]


def build_parser():
    """The argument parser of this tool."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split('\n\n', 1)[1])
    parser.add_argument('--device', choices=['cuda', 'cpu'], required=True)
    parser.add_argument('--out', required=True, help='directory for the report')
    parser.add_argument('--part', choices=[*PARTS, 'all'],
                        help='the steps of one call (default: call, the one a lent GPU '
                        'machine runs first; with --steps, every part)')
    parser.add_argument('--steps', nargs='+', choices=sorted(STEPS),
                        help='only these steps (in the order of the list above), of --part '
                        'where it is given')
    parser.add_argument('--small', action='store_true',
                        help='toy sizes: checks the script, measures nothing')
    parser.add_argument('--budget', type=float, default=CALL_BUDGET,
                        help='seconds: no step starts after this, and a running step is '
                        'stopped when it is spent (or its own budget is)')
    return parser


def _ratio(rows, row, size, base='Swin-T'):
    """(seconds, ratio to ``base``) of ``row`` at ``size`` in a benchmark section's
    {row: {size: seconds}}, or None where either is missing."""
    t, ref = rows.get(row, {}).get(size), rows.get(base, {}).get(size)
    return None if t is None or not ref else (t, t / ref)


def candidates(out, timed_step='fp32', floor_step='fidelity'):
    """The plans the ``timed_step`` and ``floor_step`` steps (fp32 and fidelity, or
    decide-fp32 and decide-fidelity) both measured, side by side: SOFT-S's
    forward and training step against Swin-T's at the largest size timed, and how close
    each path keeps to the floor (its worst output map over the images, and its worst
    parameter gradient, each as a fraction of its bound: at most 1 keeps it), fastest
    forward first. The table CUDA's plan is chosen from. [] where either file is
    missing."""
    try:
        with open(osp.join(out, f'{timed_step}.json')) as f:
            timed = json.load(f)
        with open(osp.join(out, f'{floor_step}.json')) as f:
            floor = json.load(f)
    except (OSError, ValueError):
        return []
    speed, train = timed.get('speed', {}), timed.get('train', {})
    sizes = sorted({s for r in speed.values() for s in r},
                   key=lambda s: math.prod(int(v) for v in s.split('x')))
    if not sizes:
        return []
    size = sizes[-1]
    paths = [p for p in floor['outputs'][next(iter(floor['outputs']))]
             if p == 'default' or f'SOFT-S [plan {p}]' in speed]
    rows = []
    for path in paths:
        speed_row = 'SOFT-S' if path == 'default' else f'SOFT-S [plan {path}]'
        train_row = 'SOFT-S [auto]' if path == 'default' else f'SOFT-S [plan {path}]'
        maps = max(dev / bound
                   for image, results in floor['outputs'].items()
                   for dev, bound in zip(results[path]['maps'],
                                         floor['output_bounds'][image]))
        grads = [g['paths'][path]['gradients'][g['paths'][path]['worst']] / g['bound']
                 for g in floor.get('gradients', {}).values() if path in g['paths']]
        rows.append((path, _ratio(speed, speed_row, size), _ratio(train, train_row, size),
                     maps, max(grads) if grads else None))
    rows.sort(key=lambda r: r[1][1] if r[1] else math.inf)

    def timing(t):
        return '– | –' if t is None else f'{t[0] * 1e3:.1f} ms | {t[1]:.2f}×'

    lines = ['', f'## candidates: the paths {timed_step} and {floor_step} both measured, '
             f'at {size}', '',
             f"SOFT-S's forward and training step against Swin-T's at {size} "
             f'({timed_step}.json), and the worst output map and parameter gradient over the '
             f"images as a fraction of their bound at {'x'.join(map(str, floor['size']))} "
             f'({floor_step}.json; at most 1 keeps the floor), fastest forward first.', '',
             '| path | forward | vs Swin-T | training step | vs Swin-T | worst map / bound '
             '| worst gradient / bound | floor |', '|---|---|---|---|---|---|---|---|']
    for path, fwd, trn, maps, grads in rows:
        kept = maps <= 1 and (grads is None or grads <= 1)
        lines.append(f'| {path} | {timing(fwd)} | {timing(trn)} | {maps:.2f} | '
                     f"{'–' if grads is None else f'{grads:.2f}'} | "
                     f"{'kept' if kept else 'missed'} |")
    return lines


def _entry(name, cmd, status, seconds, out=None):
    """A step's record in report.json: its command, how it ended, its budget and the
    files it wrote into ``out`` (none where it did not run)."""
    files = [f for f in (f'{name}.json', f'{name}-ops.json')
             if out and osp.exists(osp.join(out, f))]
    ops = None
    if f'{name}-ops.json' in files:
        with open(osp.join(out, f'{name}-ops.json')) as f:
            ops = json.load(f)
    return dict(name=name, title=STEPS[name][3], command=cmd, status=status,
                seconds=seconds, budget=STEPS[name][4], files=files, mmcv_ops=ops)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.part is None:
        args.part = 'all' if args.steps else 'call'
    names = [n for n, (parts, _, _, _, _) in STEPS.items()
             if (args.part == 'all' or args.part in parts)
             and (args.steps is None or n in args.steps)]
    if args.steps and not names:
        parser.error(f'none of {args.steps} is in --part {args.part}')
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    path = osp.join(args.out, 'report.md')

    def write(lines):  # appended as it goes: a call cut short keeps what it measured
        with open(path, 'a') as f:
            f.write('\n'.join(lines) + '\n')

    from mmsoft.benchmark.common import device_label, run_record
    rev, source = commit()
    found = versions()
    here = machine(args.device, rev, source, found)
    header = ['# mmsoft device report', ''] + here
    if args.small:
        header.append('- toy sizes (--small): a check of the script, not a measurement')
    write(header)
    run = run_record(shlex.join(['python3', 'projects/soft_lab/device_report.py',
                                 *(sys.argv[1:] if argv is None else argv)]),
                     device_label(args.device))
    run.update(commit=rev, commit_from=source)
    summary = osp.join(args.out, 'report.json')
    earlier = []  # the calls before this one into the same directory (--steps later)
    try:
        with open(summary) as f:
            last = json.load(f)
        earlier = last.pop('earlier', []) + [last]
    except (OSError, ValueError):
        pass
    record = dict(run=run, machine=here, versions=found, part=args.part,
                  small=args.small, budget=args.budget, steps=[], earlier=earlier)

    def save():  # report.json, rewritten after every step (a call cut short keeps it)
        with open(summary, 'w') as f:
            json.dump(record, f, indent=1)

    failed = []
    with open(osp.join(args.out, 'report.log'), 'a') as log:
        for name in names:
            cmd = command(name, args)
            shown_cmd = ' '.join(osp.relpath(c, ROOT) if c.startswith(ROOT) else c
                                 for c in [osp.basename(sys.executable)] + cmd[1:])
            section = ['', f'## {name}: {STEPS[name][3]}', '', f'`{shown_cmd}`', '']
            left = args.budget - (time.perf_counter() - start)
            own = STEPS[name][4]
            status = None
            if STEPS[name][1] == 'pytest' and importlib.util.find_spec('pytest') is None:
                status = NO_PYTEST
            elif left <= 0:
                status = 'not run: the time budget was spent'
            if status:
                write(section + [status])
                failed.append(name)
                record['steps'].append(_entry(name, cmd, status, None))
                save()
                print(f'[{name}] {status}', flush=True)
                continue
            print(f'[{name}] {shown_cmd}', flush=True)
            limit = left if own is None else min(own, left)
            code, seconds, printed = run_step(cmd, limit)
            log.write(f'\n===== {name}: {shown_cmd}\n{printed}')
            log.flush()
            if code is None:
                status = ('timed out (its budget, %d s)' % own if own is not None
                          and own <= left else 'timed out (budget)')
            else:
                status = f'exit {code}'
            if code != 0:
                failed.append(name)
            write(section + [f'{status}, {seconds:.0f} s', ''] + shown(printed, name))
            entry = _entry(name, cmd, status, seconds, args.out)
            if source == PREPARED_COMMIT:  # the steps' own records could not read it
                for f in entry['files']:
                    stamp(osp.join(args.out, f), rev)
            record['steps'].append(entry)
            save()
            print(f'[{name}] {status}, {seconds:.0f} s', flush=True)
    write(candidates(args.out))
    write(candidates(args.out, 'decide-fp32', 'decide-fidelity'))
    write(['', f'Steps not completed: {", ".join(failed)}' if failed
           else 'Every step completed.'])
    record['not_completed'] = failed
    save()
    print(f'report: {path}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
