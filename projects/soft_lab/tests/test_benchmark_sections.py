"""The lab's benchmark sections (projects/soft_lab/benchmark.py: pinv, matmul, dwconv,
kernel and the call sweep), run by tools/analysis_tools/benchmark.py with
``--import projects.soft_lab`` at small sizes. Run from the repository root:
`python -m pytest projects/soft_lab/tests`."""
import argparse
import importlib.util
import json
import os.path as osp
import subprocess
import sys

import pytest

import projects.soft_lab.benchmark as sections
from mmsoft.benchmark import SECTIONS

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def _load_cli():
    """tools/analysis_tools/benchmark.py as a module, loaded from its file as
    ``python tools/...`` runs it."""
    path = osp.join(ROOT, 'tools', 'analysis_tools', 'benchmark.py')
    spec = importlib.util.spec_from_file_location('mmsoft_tool_benchmark', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


benchmark = _load_cli()


def test_the_lab_registers_its_sections_first():
    """Importing the lab's benchmark module puts its sections ahead of the library's (the
    order the CLI runs them in by default), once; importing the lab itself leaves the
    benchmark (and mmdet) out."""
    assert list(SECTIONS)[:4] == ['pinv', 'matmul', 'dwconv', 'kernel']
    assert SECTIONS['pinv'] is sections.section_pinv and 'speed' in SECTIONS
    before = list(SECTIONS)
    sections.register()
    assert list(SECTIONS) == before
    code = ('import sys, projects.soft_lab\n'
            'print(sorted(m for m in sys.modules if m in ("mmdet", "mmsoft.benchmark", '
            '"projects.soft_lab.benchmark")))\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == '[]'


def test_plan_sections(tmp_path, capsys):
    """The four sections through the CLI with ``--import projects.soft_lab`` (the lab's
    benchmark module imported with it), on the CPU: only float32 products, no TF32
    columns."""
    from mmsoft.models.attention import plan_for
    out = tmp_path / 'b.json'
    plan = plan_for('cpu')
    benchmark.main(['--import', 'projects.soft_lab', '--device', 'cpu', '--sections',
                    'pinv,matmul,dwconv,kernel', '--matmul-sizes', '40', '--sizes', '64x64',
                    '--repeat', '0', '--pinv-sizes', '16', '130', '--train-batch', '1',
                    '--json', str(out)])
    res = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert set(res['pinv']) == {'16', '130'}
    assert 'iterative, applied, m padded to ×8' in res['pinv']['130']  # 130 -> 136
    assert set(res['pinv']['16']) == {
        f'{c}{p}' for c in ('iterative', 'iterative, applied', 'iterative, training',
                            'iterative, last 4 thin, training') for p in ('', ', m padded to ×8')
    } | {'spectral'}
    assert not any('tf32' in c or 'eigh' in c for c in res['pinv']['16'])  # TF32: CUDA only
    assert list(res['matmul']) == ['40'] and list(res['matmul']['40']) == ['float32']
    assert 'tf32_conversion' not in res and 'matmul_kernels' not in res  # CUDA only
    assert list(res['calls']) == ['float32']  # the call sweep; TF32 on CUDA only
    sweep = res['calls']['float32']
    assert list(sweep['times']['40']) == ['2', '4', '10', '20']
    assert list(sweep['times']['40']['10']) == ['baddbmm', 'bmm', 'bmm, transposed']
    assert all(t > 0 for row in sweep['times']['40'].values() for t in row.values())
    # each call makes its product (the step's 2a - a·b, the others a·b): float32 sums
    assert max(sweep['deviations']['40'].values()) < 1e-5, sweep['deviations']
    assert not sweep['kernels'] and not sweep['tuned']  # traced and tuned on CUDA only
    assert '| 40 | 10 | ' in printed and 'bmm, transposed: µs per kernel' in printed
    assert set(res['dwconv']) == {f'64x64 stage{s} {step}' for s in (1, 2, 3)
                                  for step in ('forward', 'train')}
    assert all(t > 0 for row in res['dwconv'].values() for t in row.values())
    kernel = res['kernel']  # per stage: inference (once + 4 chunk sizes), train (chunks)
    assert len(kernel) == 6 and plan_for('cpu') == plan  # the plan in force as before
    for name, row in kernel.items():
        chunks = {f'2^{c}' for c in sections.KERNEL_CHUNKS}
        assert set(row) == chunks | ({'a G each'} if ' train ' in name else {'once'}), name
        assert all(t > 0 for t in row.values())


def test_tf32_conversion_check_tells_the_conversions_apart():
    """The matmul section's check of how a GPU converts TF32 operands, here on the CPU
    (no TF32: the product matches its unconverted operands, to float32 summation, and
    neither conversion, which moves it by ~2^-11 / 2^-10 of the operands)."""
    c = sections._tf32_conversion(64, 'cpu')
    assert c['float32'] < 1e-5 < c['rounded'] < c['cut']


def test_call_sweep_switches_torch_settings_inside_its_columns_only():
    """The sweep's cuBLASLt and TunableOp columns set process-wide settings of torch
    (the preferred BLAS library, TunableOp and its tuning and file) inside their block,
    and restore them after; on CUDA the sweep has those columns, elsewhere not."""
    import torch
    if not (hasattr(torch.backends.cuda, 'preferred_blas_library')
            and hasattr(torch.cuda, 'tunable')):
        pytest.skip('this torch has no preferred BLAS library or TunableOp')
    library, tunable = torch.backends.cuda.preferred_blas_library, torch.cuda.tunable

    def settings():
        return (library().name, tunable.is_enabled(), tunable.tuning_is_enabled(),
                tunable.get_filename())

    before = settings()
    with sections._tuned_lt():
        inside = settings()
    assert settings() == before
    assert inside[:3] == ('Cublaslt', True, True) and inside[3] != before[3]
    assert set(sections._calls('cuda')) - set(sections._calls('cpu')) == {
        'baddbmm, cuBLASLt', 'bmm, cuBLASLt', 'bmm, cuBLASLt, TunableOp'}
    assert settings() == before
    # TunableOp refusing to start leaves every setting as it was
    enable = tunable.enable

    def refusing(on=True):
        if on:
            raise RuntimeError('TunableOp refused')
        enable(on)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tunable, 'enable', refusing)
        with pytest.raises(RuntimeError, match='refused'):
            with sections._tuned_lt():
                pass
    assert settings() == before


def test_call_sweep_records_a_failing_call_and_keeps_the_others(monkeypatch):
    """A call that raises (an experimental library path, e.g. TunableOp's) is reported
    with its error and skipped from there on; the other calls' times, and the matmul
    section's table before them, stand."""
    from contextlib import nullcontext


    def broken(c, a, b):
        raise RuntimeError('CUBLAS_STATUS_NOT_SUPPORTED')

    calls = dict(sections._calls('cpu'), broken=(broken, False, nullcontext))
    monkeypatch.setattr(sections, '_calls', lambda device: calls)
    sweep = sections._call_sweep(argparse.Namespace(device='cpu'), [16], 'float32',
                             batches=(2, 4))
    assert sweep['failed'] == {'broken': 'RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED'}
    for row in sweep['times'][16].values():
        assert row['broken'] is None and row['bmm'] > 0
    assert set(sweep['deviations'][16]) == set(calls) - {'broken'}
    lines = sections._call_lines(sweep, 'float32')
    assert any(line.startswith('| 16 | 4 | ') and line.endswith(' | – |') for line in lines)
    assert '- broken failed (–): RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED' in lines


def test_pinv_columns_compute_the_same_iterate():
    """Every column of the pinv section (the padded ones cut back to m, also where the
    padded size equals Z's width: m = 25 -> 32, 32 columns; the training ones with their
    backward) computes the formed iterate (times Z), in float64 up to rounding."""
    import torch

    from mmsoft.models.attention import gaussian_kernel, newton_pinv
    x = torch.randn(3, 25, 8, dtype=torch.float64) * 0.3
    A, Z = gaussian_kernel(x, x), torch.randn(3, 25, 32, dtype=torch.float64)
    Y = newton_pinv(A, nonnegative=True)
    args = argparse.Namespace(device='cpu', pinv_pad=8, tf32_schedules=[(1, 2)])
    cols = sections.pinv_columns(args)
    assert {'iterative, m padded to ×8', 'iterative, applied, m padded to ×8',
            'iterative, last 4 thin, training, m padded to ×8'} <= set(cols)
    # CUDA's columns too (a float64 A runs 'tf32''s steps in float64 here)
    cuda = sections.pinv_columns(argparse.Namespace(device='cuda', pinv_pad=8,
                                                    tf32_schedules=[(1, 2)]))
    assert {'tf32 1+17+2, last 2 thin, m padded to ×8',
            'tf32 1+17+2, last 2 thin, training'} <= set(cuda)
    assert 'iterative, last 4 thin, training' in cols
    cols.update(cuda)
    for name, fn in cols.items():
        with torch.no_grad():
            out = fn(A, Z)
        ref = Y if out.shape[-1] == 25 else Y @ Z
        assert out.shape == ref.shape, name
        assert (out - ref).abs().max() <= 1e-10 * ref.abs().max(), name


def test_kernel_section_forces_each_chunk(monkeypatch):
    """The kernel section times every chunk size through the plan (``kernel_chunk`` forced
    for the device type inside each call), in training through ``kernel_attention`` as
    training runs it, and leaves the plan in force as it was."""
    import torch
    from mmsoft.models import attention
    from mmsoft.models.attention import PLANS, plan_for
    seen = {'kernel_matmul': set(), 'kernel_attention': set()}

    def recording(name):
        fn = getattr(attention, name)

        def call(q, *args, **kwargs):
            p = plan_for(q.device.type)
            seen[name].add((p.kernel_chunk, p.kernel_once_up_to, torch.is_grad_enabled()))
            return fn(q, *args, **kwargs)
        return call

    for name in seen:
        monkeypatch.setattr(attention, name, recording(name))
    before = plan_for('cpu')
    args = argparse.Namespace(device='cpu', sizes=['64x64'], train_batch=1, rounds=1)
    out = {}
    sections.section_kernel(args, out)
    # inside: each chunk, and P never formed whole; the CPU plan says otherwise. Training
    # with one G for both products, and with a G each at the plan's chunk ('a G each')
    chunks = {(2**c, None) for c in sections.KERNEL_CHUNKS}
    assert seen['kernel_attention'] == {(*c, True) for c in chunks}
    own = (PLANS['cpu'].kernel_chunk, PLANS['cpu'].kernel_once_up_to, True)
    assert seen['kernel_matmul'] == {(*c, False) for c in chunks} | {own}
    assert PLANS['cpu'].kernel_once_up_to is not None
    assert plan_for('cpu') == before == PLANS['cpu']
    assert len(out['kernel']) == 6
