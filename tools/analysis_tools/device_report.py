"""Run every measurement that decides mmsoft's per-device defaults, and write one report.

Each step runs as its own process; a failing or slow step is recorded and the next one
runs. The steps (``--part base`` unless said otherwise):

  cuda-tests     pytest -m cuda tests/ (every test is skipped without a GPU)
  pinv           benchmark --sections pinv: the plan's pinv (with and without zero
                 padding)
  layout         benchmark --sections dwconv,kernel: the plan's local_conv_layout,
                 kernel_chunk and kernel_once_up_to
  fp32           benchmark --sections speed,train
  bf16, fp16     the same under torch.autocast (--amp bf16 / fp16)
  memory-modes   benchmark --sections memory,modes
  compile-ro     benchmark --sections speed,train --compile reduce-overhead (``--part
                 compile``, at 800x1344 only)
  compile        benchmark --sections speed,train --compile default (``--part compile``)
  detector       benchmark --sections detector (``--part detector``: RetinaNet and Mask
                 R-CNN need mmcv's compiled ops, which a fresh GPU machine builds first)

It writes OUT/report.md (the machine, then per step as it completes: the command, its
exit status and seconds, and what it printed, mmengine's log lines left out),
OUT/report.log (everything printed) and OUT/<step>.json (the numbers, from
``benchmark.py --json``). The benchmark is tools/analysis_tools/benchmark.py; the plan
whose fields the pinv and layout steps measure is ``AttentionPlan`` in
mmsoft/models/attention/plan.py. Run it from the repository root, with mmsoft importable
(installed, or the repository root on PYTHONPATH).

On a lent GPU machine (``../shared/gpu`` recipe: wheels carried in .gpu/), three calls
of under 10 minutes each; ``--budget`` stops starting steps once its seconds are spent and
stops a step that outlasts it, so the set-up and the report fit in one call (on an H100
part base took 470 s, the detector part 55 s after ~300 s of mmcv build):

  source .gpu/setup.sh && python3 tools/analysis_tools/device_report.py --device cuda
      --out "$OUT"   (one line)
  source .gpu/setup.sh cuda-ops && python3 tools/analysis_tools/device_report.py
      --device cuda --part detector --budget 280 --out "$OUT"   (one line; after ~270 s
      of mmcv build)
  source .gpu/setup.sh && python3 tools/analysis_tools/device_report.py --device cuda
      --part compile --out "$OUT"   (one line)

report.md ends with the steps that did not complete; ``--steps NAME ...`` runs just those
in a further call (the report is appended to).

``--small`` runs every step at toy sizes: a check of the script on a CPU, not a
measurement.
"""
import argparse
import importlib.util
import os
import os.path as osp
import platform
import re
import signal
import subprocess
import sys
import time

# tools/analysis_tools/ -> the repository root: the steps run there (tests/, configs/)
ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
BENCHMARK = osp.join('tools', 'analysis_tools', 'benchmark.py')

# name -> (part, benchmark arguments or None for the pytest step, title); a step's own
# arguments override FULL's, SMALL's override both.
STEPS = {
    'cuda-tests': ('base', None, 'pytest -m cuda'),
    'pinv': ('base', ['--sections', 'pinv'],
             "pseudo-inverse by landmark count (the plan's pinv)"),
    'layout': ('base', ['--sections', 'dwconv,kernel'],
               "depthwise-conv layout and kernel chunks (the plan's local_conv_layout, "
               'kernel_chunk, kernel_once_up_to)'),
    'fp32': ('base', ['--sections', 'speed,train'], 'speed and training step, float32'),
    'bf16': ('base', ['--sections', 'speed,train', '--amp', 'bf16'],
             'speed and training step, autocast to bfloat16'),
    'fp16': ('base', ['--sections', 'speed,train', '--amp', 'fp16'],
             'speed and training step, autocast to float16'),
    'memory-modes': ('base', ['--sections', 'memory,modes'], 'peak memory; attention modes'),
    # their own part (a call of its own): one round at the detection size, every
    # measurement compiles its model afresh
    'compile-ro': ('compile', ['--sections', 'speed,train', '--compile', 'reduce-overhead',
                               '--rounds', '1', '--sizes', '800x1344', '--skip-official'],
                   "torch.compile(mode='reduce-overhead')"),
    'compile': ('compile', ['--sections', 'speed,train', '--compile', 'default', '--rounds',
                            '1', '--sizes', '800x1344', '--skip-official'], 'torch.compile()'),
    'detector': ('detector', ['--sections', 'detector'],
                 'RetinaNet and Mask R-CNN: training iteration and test forward'),
}

# What --small changes: toy sizes for every benchmark section.
SMALL = ['--sizes', '64x64', '--repeat', '0', '--train-batch', '1', '--pinv-sizes', '16',
         '130', '--skip-official', '--detector-size', '128x160']
FULL = ['--sizes', '512x512', '800x1344', '--rounds', '3']

NO_PYTEST = ('not run: pytest is not installed here (on a GPU machine without a registry, '
             'carry its wheels: pip download --no-deps --only-binary=:all: -d .gpu/whl '
             'pytest pluggy iniconfig)')
MMENGINE_LOG = re.compile(r'^\d\d/\d\d \d\d:\d\d:\d\d - mmengine - ')
# torch's logging (W1124 10:16:31.584000 6836 torch/...) and Python's warnings
# (path:line: SomeWarning: text, then the source line indented)
TORCH_LOG = re.compile(r'^[DIWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ')
PY_WARNING = re.compile(r'^\S.*:\d+: \w*Warning: ')


def machine(device):
    """Lines describing where the report was measured."""
    import torch
    lines = [f'- date (UTC): {time.strftime("%Y-%m-%d %H:%M", time.gmtime())}',
             f'- torch {torch.__version__}, Python {platform.python_version()}, '
             f'{os.cpu_count()} CPU cores ({torch.get_num_threads()} torch threads)']
    if device == 'cuda':
        lines.append(f'- GPU: {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}, '
                     f'cuDNN {torch.backends.cudnn.version()}, TF32 convolutions '
                     f'{"on" if torch.backends.cudnn.allow_tf32 else "off"}')
    try:
        rev = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, text=True,
                             capture_output=True, check=True).stdout.strip()
        lines.append(f'- mmsoft commit {rev}')
    except (OSError, subprocess.CalledProcessError):
        pass
    return lines


def command(name, args):
    """The argv of step ``name``."""
    bench = STEPS[name][1]
    if bench is None:
        return [sys.executable, '-m', 'pytest', '-m', 'cuda', 'tests/', '-q', '-p',
                'no:cacheprovider']
    # argparse keeps an option's last value: a step's own sizes and rounds override FULL,
    # and --small's toy sizes override everything
    return ([sys.executable, BENCHMARK, '--device', args.device] +
            (bench + SMALL if args.small else FULL + bench) +
            ['--json', osp.join(args.out, f'{name}.json')])


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
    if STEPS[name][1] is None:
        return [ln for ln in printed.splitlines() if not MMENGINE_LOG.match(ln)][-15:]
    lines, warning = [], False
    for ln in printed.splitlines():  # a warning's next line, if indented, is its source
        source, warning = warning and ln.startswith('  '), bool(PY_WARNING.match(ln))
        if not (warning or source or MMENGINE_LOG.match(ln) or TORCH_LOG.match(ln)):
            lines.append(ln)
    # the benchmark's headings one level below the step's
    return ['#' + ln if ln.startswith('#') else ln for ln in lines]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split('\n\n', 1)[1])
    parser.add_argument('--device', choices=['cuda', 'cpu'], required=True)
    parser.add_argument('--out', required=True, help='directory for the report')
    parser.add_argument('--part', choices=['base', 'detector', 'compile', 'all'],
                        default='base')
    parser.add_argument('--steps', nargs='+', choices=sorted(STEPS),
                        help='only these steps (in the order of the list above)')
    parser.add_argument('--small', action='store_true',
                        help='toy sizes: checks the script, measures nothing')
    parser.add_argument('--budget', type=float, default=540,
                        help='seconds: no step starts after this, and a running step is '
                        'stopped when it is spent')
    args = parser.parse_args(argv)
    names = [n for n, (part, _, _) in STEPS.items()
             if (args.part == 'all' or part == args.part)
             and (args.steps is None or n in args.steps)]
    if args.steps and not names:
        parser.error(f'none of {args.steps} is in --part {args.part}')
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    path = osp.join(args.out, 'report.md')

    def write(lines):  # appended as it goes: a call cut short keeps what it measured
        with open(path, 'a') as f:
            f.write('\n'.join(lines) + '\n')

    header = ['# mmsoft device report', ''] + machine(args.device)
    if args.small:
        header.append('- toy sizes (--small): a check of the script, not a measurement')
    write(header)
    failed = []
    with open(osp.join(args.out, 'report.log'), 'a') as log:
        for name in names:
            cmd = command(name, args)
            shown_cmd = ' '.join(osp.relpath(c, ROOT) if c.startswith(ROOT) else c
                                 for c in [osp.basename(sys.executable)] + cmd[1:])
            section = ['', f'## {name}: {STEPS[name][2]}', '', f'`{shown_cmd}`', '']
            left = args.budget - (time.perf_counter() - start)
            if STEPS[name][1] is None and importlib.util.find_spec('pytest') is None:
                write(section + [NO_PYTEST])
                failed.append(name)
                print(f'[{name}] {NO_PYTEST}', flush=True)
                continue
            if left <= 0:
                write(section + ['not run: the time budget was spent'])
                failed.append(name)
                print(f'[{name}] not run: budget spent', flush=True)
                continue
            print(f'[{name}] {shown_cmd}', flush=True)
            code, seconds, printed = run_step(cmd, left)
            log.write(f'\n===== {name}: {shown_cmd}\n{printed}')
            log.flush()
            status = ('timed out (budget)' if code is None else f'exit {code}')
            if code != 0:
                failed.append(name)
            write(section + [f'{status}, {seconds:.0f} s', ''] + shown(printed, name))
            print(f'[{name}] {status}, {seconds:.0f} s', flush=True)
    write(['', f'Steps not completed: {", ".join(failed)}' if failed
           else 'Every step completed.'])
    print(f'report: {path}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
