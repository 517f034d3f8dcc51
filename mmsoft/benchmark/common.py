"""What every benchmark section shares: the models by name (``build``, ``SOFT_MODES``), one
timed measurement (``measure``), the same measurement in a fresh process for peak memory
(``child_measure`` starts ``child``), the modules the tools' ``--import`` names
(``import_modules``), and the formatting of sizes and times.

Paths the sections read (the parity fixture in tests/data/, the detector configs) are
resolved against the checkout mmsoft is imported from (``repo_file``).
"""
import importlib
import json
import os
import os.path as osp
import re
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import fields, replace

import numpy as np
import torch

import mmsoft
from mmsoft.models.attention import attention_plan

# The directory that holds the mmsoft package: the repository root of a checkout or an
# editable install (configs/, tests/data/ beside mmsoft/).
PACKAGE_PARENT = osp.dirname(osp.dirname(osp.abspath(mmsoft.__file__)))
MIM_DIR = osp.join(osp.dirname(osp.abspath(mmsoft.__file__)), '.mim')


def repo_file(relpath, mim=False):
    """The file at ``relpath`` (e.g. 'configs/soft/...', 'tests/data/...') of the
    repository mmsoft is imported from; with ``mim``, also mmsoft/.mim/``relpath``, where
    an installed package keeps its configs. A clear error if it is in neither."""
    tried = [osp.join(PACKAGE_PARENT, relpath)]
    if mim:
        tried.append(osp.join(MIM_DIR, relpath))
    for path in tried:
        if osp.exists(path):
            return path
    raise FileNotFoundError(
        f'{relpath} not found (looked in {", ".join(tried)}): this section needs a checkout '
        'of the mmsoft repository (an editable install or mmsoft on PYTHONPATH)')


# ------------------------------------------------------------------------ the run
RECORDED_PACKAGES = ('mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'onedl-mmengine',
                     'onedl-mmcv', 'onedl-mmdetection', 'onedl-mmpretrain')


def git_output(*args, root=PACKAGE_PARENT):
    """What ``git -C root ARGS`` prints, stripped; None where git fails or is missing."""
    try:
        res = subprocess.run(['git', '-C', root, *args], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def cpu_model():
    """The CPU's model name (/proc/cpuinfo on Linux, else ``platform.processor()``)."""
    import platform
    try:
        with open('/proc/cpuinfo', encoding='utf-8') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or 'unknown'


def checkout_commit(root=PACKAGE_PARENT):
    """The commit of the git checkout at ``root``, with ``+uncommitted`` where its mmsoft/
    differs from it; None outside a git checkout."""
    commit = git_output('rev-parse', 'HEAD', root=root)
    if commit and git_output('status', '--porcelain', '--', 'mmsoft', root=root):
        commit += '+uncommitted'
    return commit


def device_label(device):
    """The device as the stored runs name it: the GPU's model, CUDA and whether TF32
    convolutions are on, or the CPU's thread count."""
    if device == 'cuda':
        return (f'{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}, TF32 '
                f'convolutions {"on" if torch.backends.cudnn.allow_tf32 else "off"}')
    return f'CPU, {torch.get_num_threads()} threads'


def run_record(command, device):
    """What a stored run measured: the commit of the checkout mmsoft is imported from
    (with ``+uncommitted`` where mmsoft/ differs from it; 'unknown' outside a git
    checkout), the date (UTC), the command, the device, the CPU model and thread count,
    and the versions of Python, torch, CUDA, cuDNN and the OpenMMLab packages installed.
    The benchmark's ``--json`` stores it as ``run``; benchmark_tables.py names it
    beside every table drawn from the file."""
    import platform
    from datetime import datetime, timezone
    from importlib import metadata
    commit = checkout_commit() or 'unknown'
    packages = {}
    for name in RECORDED_PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    cuda = torch.version.cuda if torch.cuda.is_available() else None
    return dict(
        commit=commit, date=datetime.now(timezone.utc).strftime('%Y-%m-%d'),
        command=command, device=device, cpu=cpu_model(), threads=torch.get_num_threads(),
        python=platform.python_version(), torch=torch.__version__, cuda=cuda,
        cudnn=torch.backends.cudnn.version() if cuda else None, packages=packages)


# ---------------------------------------------------------------------------- imports
# The modules ``import_modules`` imported, and the directories it put on sys.path for
# them: a child process (``child_measure``) imports the same
IMPORTED = []
IMPORT_PATHS = []


def import_modules(names):
    """Import each module of ``names`` before anything runs, as mmengine's
    ``custom_imports`` (the tools' ``--import``): a package outside mmsoft registers its
    variants and benchmark sections so, e.g. ``projects.soft_lab``.

    ``python tools/...`` puts the script's directory on sys.path, not the working
    directory: a module of a checkout's ``projects/`` that is not found is looked for
    once more in the working directory (the repository root the tools run from)."""
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            parts, here = name.split('.'), os.getcwd()
            missing = {'.'.join(parts[:i + 1]) for i in range(len(parts))}
            if (parts[0] != 'projects' or e.name not in missing or here in sys.path
                    or not osp.isdir(osp.join(here, 'projects'))):
                raise  # not a module of projects/ (or one it imports is missing)
            sys.path.append(here)
            IMPORT_PATHS.append(here)
            importlib.invalidate_caches()
            importlib.import_module(name)
        if name not in IMPORTED:
            IMPORTED.append(name)


# ----------------------------------------------------------------------------- models
SOFT_MODES = {
    # name: (SOFT kwargs, path run ('official': the official order), description)
    'official order': (dict(pinv_method='iterative'), 'official',
                       'reference algorithm, official cost'),
    'iterative': (dict(pinv_method='iterative'), None, '20 iterations, P once, P·(Â·(PᵀV))'),
    'spectral': (dict(pinv_method='spectral'), None,
                 'same 20-step iterate via one eigendecomposition (float32 where a bound '
                 'allows it, else float64)'),
    'tf32': (dict(pinv_method='tf32'), None,
             "same iterate, TF32 products between float32 steps (CUDA's plan's where it "
             'lists it; emulated off CUDA)'),
    'auto': (dict(pinv_method='auto'), None, "default: per device and m (the plan's pinv)"),
    'regularized': (dict(pinv_method='regularized'), None,
                    'fast: Tikhonov solve (A²+μI)⁻¹A, μ = 1/(α·2^T), Cholesky'),
    'grid16': (dict(landmark_grid=16), None, 'fast: at most 16×16 landmarks'),
    'grid8': (dict(landmark_grid=8), None, 'fast: at most 8×8 landmarks'),
    # captured at the first (untimed) call
    'cuda graphs': (dict(cuda_graphs=dict(min_calls=1)), None,
                    "opt-in: each stage's blocks replayed from CUDA graphs (CUDA only)"),
    'grid16 + cuda graphs': (dict(landmark_grid=16, cuda_graphs=dict(min_calls=1)), None,
                             'at most 16×16 landmarks, replayed from CUDA graphs (CUDA '
                             'only)'),
}
# Modes timed on CUDA only: emulated elsewhere ('tf32'), or eager there (the CUDA-graph
# modes: the same as 'auto' and 'grid16').
GRAPH_MODES = ('cuda graphs', 'grid16 + cuda graphs')
CUDA_ONLY_MODES = ('tf32', ) + GRAPH_MODES
# The backbones beside SOFT-S and Swin-T whose training step the train (time) and memory
# (peak memory) sections measure, where --models names them or is not given
TRAINED_BESIDE = ('XCiT-SimA-S12/16', )


def mode_plan(mode):
    """The block a SOFT mode runs in: 'official order' the official computation order
    (P·Â)·(Pᵀ·V) (``mmsoft.testing.official_order``), the reference algorithm at the
    official cost; nothing for the others (or None)."""
    path = SOFT_MODES[mode][1] if mode is not None else None
    return path_context(path, 'cpu') if path else nullcontext()


def build(name, mode='auto'):
    """A backbone in eval mode, randomly initialized (timings do not depend on weights)."""
    from mmsoft.models import SOFT, XCiTSimA
    if name == 'SOFT-S':
        return SOFT(arch='small', drop_path_rate=0., **SOFT_MODES[mode][0])
    if name == 'XCiT-SimA-S12/16':
        return XCiTSimA(arch='s12', patch_size=16, drop_path_rate=0.)
    if name == 'XCiT-SimA-S12/16 trunk':  # no stride 4/8/32 pyramid, like mmpretrain's
        return XCiTSimA(arch='s12', patch_size=16, drop_path_rate=0., with_pyramid=False)
    from mmdet.models.backbones import PyramidVisionTransformer, ResNet, SwinTransformer
    if name == 'Swin-T':
        return SwinTransformer()
    if name == 'PVT-S':
        return PyramidVisionTransformer(num_layers=[3, 4, 6, 3])
    if name == 'PVT-S softmax (no SR)':
        return PyramidVisionTransformer(num_layers=[3, 4, 6, 3], sr_ratios=[1, 1, 1, 1])
    if name == 'ResNet-50':
        return ResNet(depth=50)
    if name == 'XCiT-S12/16 (mmpretrain)':
        from mmpretrain.models.backbones import XCiT
        return XCiT(embed_dims=384, depth=12, num_heads=8, out_type='featmap')
    raise KeyError(name)


def path_plan(name, device):
    """The ``AttentionPlan`` a path name stands for, run on ``device`` (the paths of
    tools/analysis_tools/fidelity.py and of the benchmark's ``--soft-plans``; 'official'
    is no plan: ``path_context``):

      default                 the plan of ``device``'s type
      cpu, cuda               a device type's plan (CUDA's on the CPU: TF32 emulated)
      iterative               the reference, the formed float32 iterate
      spectral                one eigendecomposition (float32 where a first-order bound
                              allows it, else float64)
      tf32-F-L[-padN][-thinK] TF32 products between F float32 steps first and L last,
                              with m zero-padded to a multiple of N; the last K float32
                              steps applied to the thin matrix

    each followed by modifiers ``+VARIANT``, a registered variant's name (e.g.
    ``cuda+tf32-guarded``), in place of every 'tf32' of the plan, with its options where
    it is a kind of ``TF32`` (a plan without 'tf32', as the CPU's, is an error). A package
    outside mmsoft registers its variants when it is imported (the tools' ``--import``,
    ``import_modules``).
    """
    from mmsoft.models.attention import PLANS, TF32, VARIANTS, plan_for
    base = plan_for(torch.device(device).type)
    fixed = {'default': base, 'cpu': PLANS['cpu'], 'cuda': PLANS['cuda'],
             'iterative': replace(base, pinv='iterative'),
             'spectral': replace(base, pinv='spectral')}
    full = name
    name, *modifiers = name.split('+')
    if name in fixed:
        plan = fixed[name]
    else:
        match = re.fullmatch(r'tf32-(\d+)-(\d+)(?:-pad(\d+))?(?:-thin(\d+))?', name)
        if match is None:
            raise ValueError(f'unknown path {name!r}: one of {sorted([*fixed, "official"])} '
                             'or tf32-F-L[-padN][-thinK], then +modifiers')
        first, last, pad, thin = (int(g or d) for g, d in zip(match.groups(), (0, 0, 1, 0)))
        plan = replace(base, pinv=TF32(float32_steps=(first, last), pad_to=pad,
                                       thin_steps=thin))
    for modifier in modifiers:
        if modifier not in VARIANTS:
            raise ValueError(f'unknown path modifier {modifier!r} in {full!r}: a variant '
                             f'({", ".join(VARIANTS)}), as registered')
        if not any(v.name == 'tf32' for _, v in plan.pinv):
            raise ValueError(f"path {full!r}: +{modifier} replaces the plan's 'tf32', "
                             f'and {name!r} on {device} lists none (pinv={plan.pinv})')
        new = VARIANTS[modifier]

        def like(v):  # the plan's TF32 options carried over to a kind of TF32
            if v.name != 'tf32':
                return v
            if not isinstance(new, TF32):
                return new
            return replace(new, **{f.name: getattr(v, f.name) for f in fields(v)})
        plan = replace(plan, pinv=tuple((m, like(v)) for m, v in plan.pinv))
    return plan


def path_context(name, device):
    """The block that runs path ``name`` on ``device``: 'official' the official order
    (``mmsoft.testing.official_order``), another its plan (``path_plan``) forced for
    ``device``'s type."""
    if name == 'official':
        from mmsoft.testing import official_order
        return official_order()
    return attention_plan(path_plan(name, device), device=torch.device(device).type)


def measure_path(name, size, device, repeat, train=False, batch=1, amp=None):
    """``measure`` of SOFT-S (``pinv_method='auto'``) on path ``name`` (``path_context``)."""
    with path_context(name, device):
        return measure(build('SOFT-S'), size, device, repeat, train=train, batch=batch,
                       amp=amp)


def soft_modes(args, modes):
    """The SOFT modes worth timing on this device (``CUDA_ONLY_MODES`` on CUDA only)."""
    return [m for m in modes if m not in CUDA_ONLY_MODES or args.device == 'cuda']


# ------------------------------------------------------------------------ measurement
AMP_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16}


def measure(model, size, device, repeat, train=False, mode=None, batch=1,
            compile_mode=None, amp=None):
    """Median seconds of forward (or forward+backward) of a batch, under
    ``torch.autocast`` to ``amp`` ('bf16', 'fp16') if given, with the plan choices of
    SOFT's ``mode`` forced (``mode_plan``).

    The first run is a warm-up (untimed) unless ``repeat`` is 0; with ``compile_mode``
    (``torch.compile(model, mode=compile_mode)``, from a reset of Dynamo's caches: a
    static graph for this size) the compiling first run is never timed.
    """
    model = model.to(device)
    model.train(train)
    run = model
    if compile_mode:
        # Dynamo caches per code object: without a reset a model compiled at a second
        # size would reuse the first's entry and recompile with dynamic shapes
        torch.compiler.reset()
        run = torch.compile(model, mode=compile_mode)
        before = compile_state()
        repeat = max(repeat, 1)
    x = torch.randn(batch, 3, *size, device=device, requires_grad=False)
    times = []
    with mode_plan(mode):
        for i in range(repeat + 1):
            if compile_mode == 'reduce-overhead' and hasattr(
                    torch.compiler, 'cudagraph_mark_step_begin'):  # torch >= 2.2
                torch.compiler.cudagraph_mark_step_begin()  # a new CUDA-graph-tree step
            sync(device)
            t0 = time.perf_counter()
            with torch.autocast(device_type=device, dtype=AMP_DTYPES.get(amp),
                                enabled=amp is not None):
                if train:
                    outs = run(x)
                    sum(o.float().mean() for o in outs).backward()
                    model.zero_grad(set_to_none=True)
                else:
                    with torch.no_grad():
                        run(x)
            sync(device)
            if i > 0 or repeat == 0:
                times.append(time.perf_counter() - t0)
            elif compile_mode:
                print(f'  compiled {type(model).__name__} '
                      f'({"training" if train else "inference"}, {compile_mode}) in '
                      f'{time.perf_counter() - t0:.1f} s: {compile_phases(before)}',
                      flush=True)
    return float(np.median(times))


# Dynamo's timers (``torch._dynamo.utils.compilation_time_metrics``: name -> seconds of
# each timed call) that tell a compilation's phases apart: per phase, the timers summed,
# as torch 2.14 (and 2.11) names them, or else as torch 2.1 does; a phase whose timers a
# release lacks is left out.
_LOCALS = 'compile_fx.<locals>.'
COMPILE_PHASES = (
    ('Dynamo and the backend on the forward graph',
     (('_compile.compile_inner',), ('_compile.<locals>.compile_inner',))),
    ("Dynamo's tracing of the Python code", (('bytecode_tracing',),)),
    ("AOTAutograd's tracing of forward and backward", (('aot_trace_joint_graph',),)),
    ('Inductor on the forward and backward graphs',
     (('compile_fx_inner',), (_LOCALS + 'fw_compiler_base', _LOCALS + 'bw_compiler'))),
    ("waiting for Inductor's kernels to compile", (('async_compile.wait',),)),
)


def compile_state():
    """Where Dynamo's and Inductor's cumulative counters stand: ({timer: seconds},
    operators Dynamo captured, kernels Inductor generated)."""
    from torch._dynamo.utils import compilation_time_metrics, counters
    from torch._inductor import metrics
    return ({k: sum(v) for k, v in compilation_time_metrics.items()},
            counters['stats']['calls_captured'], metrics.generated_kernel_count)


def compile_phases(before):
    """The compilation since ``before`` (``compile_state()``) by phase, as one line: which
    phase a slow compilation spends its time in (the backward graph compiles at the first
    backward, outside the first phase)."""
    (t0, ops0, k0), (t1, ops1, k1) = before, compile_state()
    parts = []
    for label, spellings in COMPILE_PHASES:
        keys = next((keys for keys in spellings if any(k in t1 for k in keys)), ())
        if keys:  # the first spelling this release records
            parts.append(f'{label} {sum(t1.get(k, 0) - t0.get(k, 0) for k in keys):.1f} s')
    parts.append(f'{ops1 - ops0} operators captured, {k1 - k0} kernels generated')
    return '; '.join(parts)


def sync(device):
    if device == 'cuda':
        torch.cuda.synchronize()


def time_call(args, fn, runs=3, warmup=True):
    """Mean seconds of ``fn()`` over ``runs`` calls (after one untimed warm-up call)."""
    if warmup:
        fn()
    sync(args.device)
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    sync(args.device)
    return (time.perf_counter() - t0) / runs


# ------------------------------------------------------- a measurement in its own process
def child_measure(name, mode, size, device, repeat, train=False, batch=1):
    """Run one measurement in a fresh process (``child``), which imports the modules this
    one imported by ``import_modules`` first: time and peak memory of the step.

    A crashed child (out of memory, say) is reported with the end of its stderr and
    returns None, so a table shows 'failed' rather than a silent gap."""
    code = ('import json;from mmsoft.benchmark.common import child, import_modules;'
            'import_modules(%r);print(json.dumps(child(%r,%r,%r,%r,%d,%r,%d)))' % (
                IMPORTED, name, mode, size, device, repeat, train, batch))
    # ``python -c`` imports from its working directory first: run in the directory that
    # holds this mmsoft, so that the child measures the same code (also where mmsoft is
    # only on a relative PYTHONPATH, as on a lent GPU machine); the modules of --import
    # from where this process found them
    env = None
    if IMPORT_PATHS:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            IMPORT_PATHS + [p for p in [os.environ.get('PYTHONPATH')] if p]))
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         cwd=PACKAGE_PARENT, env=env)
    if res.returncode != 0:
        print(f'  {name} [{mode}] at {size} failed (exit {res.returncode}):\n'
              + res.stderr[-2000:], flush=True)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def child(name, mode, size, device, repeat, train=False, batch=1):
    """In the child process: {'time': seconds, 'peak_mb': peak memory of the step above
    what the built model holds} (CUDA's allocator, or the resident set on a CPU)."""
    model = build(name, mode).to(device)
    model.train(False)  # some mmdet backbones' train() returns None: no chaining
    hw = parse_size(size)
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with torch.no_grad():  # a small warm-up so that library start-up is not counted
            model(torch.randn(1, 3, 64, 64, device=device))
        _reset_peak_rss()
        base = _proc_status_bytes('VmRSS')
    t = measure(model, hw, device, repeat, train=train, mode=mode, batch=batch)
    if device == 'cuda':
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = _proc_status_bytes('VmHWM') - base
    return dict(time=t, peak_mb=peak / 2**20)


def _proc_status_bytes(key):
    """VmRSS / VmHWM (peak resident set) of this process, from /proc (Linux).

    Not ``resource.getrusage().ru_maxrss``: a child process inherits its parent's peak
    there, so every child of a large benchmark process would report the parent's.
    """
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f'{key} not in /proc/self/status')


def _reset_peak_rss():
    """Set VmHWM to the current resident set (Linux ≥ 4.0: write 5 to clear_refs)."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        pass  # VmHWM then also counts the warm-up, which is small


# ------------------------------------------------------------------------- formatting
def parse_size(s):
    h, w = s.lower().split('x')
    return int(h), int(w)


def fmt(s):
    if s < 1:
        return f'{s * 1e3:.1f} ms'
    return f'{s:.3f} s' if s < 100 else f'{s:.0f} s'


def faster(t_other, t_ours):
    """'R× faster than' / 'R× slower than': a ratio below one reads as slower."""
    r = t_other / t_ours
    return f'{r:.1f}× faster than' if r >= 1 else f'{1 / r:.1f}× slower than'
