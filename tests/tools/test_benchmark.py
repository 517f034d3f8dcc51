"""tools/analysis_tools/benchmark.py (the CLI) and its sections in mmsoft.benchmark run
at small sizes and report sane numbers."""
import argparse
import json
import math
import os.path as osp
import re
import subprocess
import sys

import pytest
from conftest import ROOT, load_tool


CLI = osp.join(ROOT, 'tools', 'analysis_tools', 'benchmark.py')
benchmark = load_tool(CLI)


def test_cli_help_from_anywhere(tmp_path):
    """The CLI needs only an importable mmsoft, not the repository as working directory;
    its sections are the library's, in the default order (the lab's, which
    ``--import projects.soft_lab`` adds, come first: projects/soft_lab/tests)."""
    from mmsoft.benchmark import SECTIONS
    res = subprocess.run([sys.executable, CLI, '--help'], cwd=tmp_path, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert 'python tools/analysis_tools/benchmark.py' in res.stdout
    assert '--sections' in res.stdout and '--json' in res.stdout
    assert '--import MODULE' in res.stdout and 'projects.soft_lab' in res.stdout
    assert benchmark.SECTIONS is SECTIONS
    library = ['speed', 'train', 'modes', 'memory', 'scaling', 'launches', 'detector',
               'profile']
    assert list(SECTIONS)[-len(library):] == library
    assert set(SECTIONS) - set(library) <= {'pinv', 'matmul', 'dwconv', 'kernel'}


def test_lab_sections_and_paths_ask_for_the_lab():
    """The plan's sections and the candidates' paths are the lab's (projects/soft_lab/):
    without ``--import projects.soft_lab`` the CLI says to pass it (a fresh process, in
    which nothing imported the lab)."""
    for args, said in ((['--sections', 'speed,pinv'], "unknown sections ['pinv']"),
                       (['--sections', 'speed', '--soft-plans', 'default+tf32-guarded'],
                        "unknown path modifier 'tf32-guarded'")):
        res = subprocess.run([sys.executable, CLI, '--device', 'cpu', *args], cwd=ROOT,
                             capture_output=True, text=True)
        assert res.returncode == 2, res.stderr
        assert said in res.stderr and '--import projects.soft_lab' in res.stderr, res.stderr


def test_import_finds_projects_in_the_working_directory(tmp_path):
    """``python tools/...`` has the script's directory on sys.path, not the working
    directory: ``--import projects.soft_lab`` (``import_modules``) looks for projects/
    in the working directory too, and the child processes of the memory sections
    import the same modules from there; a module that is not found elsewhere raises."""
    code = ('import sys\n'
            'from mmsoft.benchmark import common\n'
            f'sys.path[:] = [p for p in sys.path if p not in ("", {ROOT!r})]\n'
            'common.import_modules(["projects.soft_lab"])\n'
            'import projects.soft_lab.variants\n'
            'print(common.IMPORTED, common.IMPORT_PATHS)\n'
            'try:\n'
            '    common.import_modules(["projects.no_such_lab"])\n'
            'except ModuleNotFoundError as e:\n'
            '    print("raised", e.name)\n')
    res = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split('\n')[:2] == [f"['projects.soft_lab'] [{ROOT!r}]",
                                          'raised projects.no_such_lab'], res.stdout


def test_path_modifiers_name_what_is_registered(monkeypatch):
    """A path's ``+X`` names a registered inverse variant, which replaces the plan's
    'tf32' (with its options, where it is a kind of TF32); the lab registers its
    candidates so (here a stand-in). The removed paths and modifiers are errors."""
    from mmsoft.benchmark.common import path_plan
    from mmsoft.models.attention import PLANS, VARIANTS
    from mmsoft.models.attention import TF32

    class Variant(TF32):
        name = 'tf32-test'

    monkeypatch.setitem(VARIANTS, 'tf32-test', Variant())
    plan = path_plan('cuda+tf32-test', 'cpu')
    (least, variant), iterative = plan.pinv
    cuda_tf32 = PLANS['cuda'].pinv[0][1]
    assert (least, type(variant), iterative) == (197, Variant, PLANS['cuda'].pinv[1])
    assert (variant.float32_steps, variant.pad_to, variant.thin_steps) == (
        cuda_tf32.float32_steps, cuda_tf32.pad_to, cuda_tf32.thin_steps)
    padded = path_plan('tf32-1-2-pad32-thin2+tf32-test', 'cpu')
    assert padded.pinv == ((1, Variant(float32_steps=(1, 2), pad_to=32, thin_steps=2)), )
    assert path_plan('spectral', 'cpu').pinv == ((1, VARIANTS['spectral']), )
    with pytest.raises(ValueError, match="replaces the plan's 'tf32'"):
        path_plan('default+tf32-test', 'cpu')  # the CPU's plan has none
    with pytest.raises(ValueError, match=r"modifier 'nope'.*tf32-test"):
        path_plan('cuda+nope', 'cpu')
    for removed in ('spectral64', 'spectral32', 'spectral-mixed', 'spectral-tridiagonal',
                    'tf32x3', 'fused', 'official'):  # 'official': no plan (path_context)
        with pytest.raises(ValueError, match='unknown path'):
            path_plan(removed, 'cpu')
    for removed in ('tf32x3', 'fp16', 'fp16x3', 'guarded', 'horner', 'fused',
                    'triton_chunks', 'chunks'):
        with pytest.raises(ValueError, match='unknown path modifier'):
            path_plan(f'cuda+{removed}', 'cpu')


def test_benchmark_sections(tmp_path, capsys):
    from mmsoft.models.attention import plan_for
    out = tmp_path / 'b.json'
    plan = plan_for('cpu')
    benchmark.main(['--device', 'cpu', '--sections', 'speed,train,modes', '--sizes', '64x64',
                    '--repeat', '0', '--skip-official', '--train-batch', '1', '--json',
                    str(out)])
    res = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert '| backbone | 64x64 |' in printed and '| mode | what |' in printed
    for row in res['speed'].values():
        assert row['64x64'] > 0
    assert {'SOFT-S', 'Swin-T', 'XCiT-SimA-S12/16 trunk', 'XCiT-S12/16 (mmpretrain)'} <= set(
        res['speed'])
    assert all(r['64x64'] > 0 for r in res['train'].values())
    modes = res['modes']
    assert 'official order' not in modes  # --skip-official
    assert not {'tf32x3', 'spectral, float32 eigh', 'spectral, mixed eigh'} & set(modes)
    # The 20-step iterate, any method, against the float64 iterate and the official outputs
    for exact in ('iterative', 'spectral', 'auto', 'tf32'):
        assert max(modes[exact]['deviation']) < 1e-5, (exact, modes[exact])
        assert modes[exact]['official'] < 1e-5, (exact, modes[exact])
    assert modes['tf32']['time'] is None  # emulated
    assert modes['spectral']['time'] > 0
    assert '| tf32 |' in printed and '– (emulated)' in printed
    assert plan_for('cpu') == plan  # the plan in force as before
    # fast modes change the answer, by the documented orders of magnitude
    assert 0 < max(modes['regularized']['deviation']) < 0.05
    assert modes['grid8']['deviation'][-1] > modes['grid16']['deviation'][-1] > 0


def test_launch_counts(tmp_path, monkeypatch):
    """Operators per forward / training step, CUDA's plan on the meta device (also where
    another plan was forced for meta around the section); the plans in force are as
    before afterwards."""
    from mmsoft.benchmark import launches
    from mmsoft.models.attention import PLANS, attention_plan, plan_for
    seen, build = [], launches.build

    def recording_build(name, mode='auto'):  # called inside the section's plan
        seen.append(plan_for('meta'))
        return build(name, mode)

    monkeypatch.setattr(launches, 'build', recording_build)
    out = tmp_path / 'l.json'
    with attention_plan(kernel_chunk=2**10, local_conv_layout='channels', device='meta'):
        before = [plan_for(d) for d in ('cpu', 'cuda', 'meta')]
        assert before[2] != PLANS['cuda']
        benchmark.main(['--device', 'cpu', '--sections', 'launches', '--sizes', '64x64',
                        '96x128', '--train-batch', '2', '--json', str(out)])
        assert [plan_for(d) for d in ('cpu', 'cuda', 'meta')] == before
    assert len(seen) == 10 and all(p == PLANS['cuda'] for p in seen)
    rows = json.loads(out.read_text())['launches']
    labels = ['Swin-T', 'SOFT-S (auto)', 'SOFT-S (grid16)', 'SOFT-S (regularized)',
              'XCiT-SimA-S12/16']
    assert set(rows) == {f'{label} {size}' for label in labels
                         for size in ('64x64', '96x128')}
    for row in rows.values():
        assert 0 < row['forward'] < row['train']
        assert 0 < row['matmul_gflop']['forward'] < row['matmul_gflop']['train']
    # SOFT-S's iterate is made of products of square m×m kernels; Swin-T has none
    for size in ('64x64', '96x128'):
        assert rows[f'SOFT-S (auto) {size}']['square_matmul_gflop']['forward'] > 0
        assert rows[f'Swin-T {size}']['square_matmul_gflop'] == {'forward': 0, 'train': 0}


def test_launch_counter_adds_up_matrix_product_flops():
    """2·M·K·N per product and batch entry, whichever operator runs it (bmm; addmm from
    linear; mm from @; baddbmm_ accumulating in place, as P's row chunks do), the products
    of two square matrices of one size apart."""
    import torch

    from mmsoft.testing import LaunchCounter
    meta = dict(device='meta')
    with LaunchCounter() as count:
        torch.bmm(torch.zeros(3, 8, 8, **meta), torch.zeros(3, 8, 8, **meta))
        torch.nn.functional.linear(torch.zeros(5, 4, **meta), torch.zeros(6, 4, **meta),
                                   torch.zeros(6, **meta))
        torch.zeros(2, 8, **meta) @ torch.zeros(8, 3, **meta)
        torch.zeros(4, 7, 3, **meta).baddbmm_(torch.zeros(4, 7, 5, **meta),
                                               torch.zeros(4, 5, 3, **meta))
    assert count.matmul_flops == {'square': 3 * 2 * 8**3,
                                  'other': 2 * 5 * 4 * 6 + 2 * 2 * 8 * 3 + 4 * 2 * 7 * 5 * 3}


def test_compile_rows(tmp_path, capsys, monkeypatch):
    """--compile times SOFT-S and Swin-T under torch.compile(mode=...) next to eager, and
    the compiling first call is a warm-up even with --repeat 0. (torch.compile is
    replaced by a recorder here; that SOFT traces is tested in test_soft.py.)"""
    import torch
    modes, calls = [], []

    def fake_compile(model, mode=None):
        modes.append(mode)

        def run(x):
            calls.append(type(model).__name__)
            return model(x)

        return run

    monkeypatch.setattr(torch, 'compile', fake_compile)
    out = tmp_path / 'c.json'
    benchmark.main(['--device', 'cpu', '--sections', 'train', '--sizes', '64x64',
                    '--repeat', '0', '--train-batch', '1', '--compile', 'reduce-overhead',
                    '--json', str(out)])
    rows, printed = json.loads(out.read_text())['train'], capsys.readouterr().out
    for name in ('SOFT-S', 'Swin-T'):
        assert rows[f'{name} [compiled: reduce-overhead]']['64x64'] > 0
        assert f"{name} with torch.compile(mode='reduce-overhead') is " in printed
    assert modes == ['reduce-overhead'] * 2
    assert calls == ['SOFT'] * 2 + ['SwinTransformer'] * 2  # warm-up + one timed run


def test_speed_rounds_interleave_models(tmp_path, monkeypatch):
    """--rounds K measures every model once per round, in turn, and reports the median of
    its K times (a slow phase of a shared machine then hits all models, not one)."""
    from mmsoft.benchmark import speed
    order = []

    def fake_measure(model, size, device, repeat, **kwargs):
        order.append(model)
        return float(len(order))  # the k-th measurement takes k seconds

    # a model stands for its row: the backbone's name, with SOFT-S's mode
    monkeypatch.setattr(speed, 'build',
                        lambda name, mode='auto': name if mode == 'auto' else f'{name} [{mode}]')
    monkeypatch.setattr(speed, 'measure', fake_measure)
    out = tmp_path / 'r.json'
    benchmark.main(['--device', 'cpu', '--sections', 'speed', '--sizes', '64x64',
                    '--skip-official', '--rounds', '3', '--json', str(out)])
    rows = json.loads(out.read_text())['speed']
    n = len(rows)
    assert n >= 7 and len(order) == 3 * n
    assert order[:n] == order[n:2 * n] == order[2 * n:]  # the same sequence each round
    for i, name in enumerate(order[:n]):  # times i+1, n+i+1, 2n+i+1: median n+i+1
        assert rows[name]['64x64'] == n + i + 1


def test_soft_plans_time_soft_under_each_plan(tmp_path, monkeypatch):
    """--soft-plans adds SOFT-S rows to speed and train, each measured with the named
    plan forced for the device type (fidelity.py's path names); an unknown name is a
    command-line error."""
    from mmsoft.benchmark import common
    from mmsoft.models.attention import plan_for
    seen = []

    def fake_measure(model, size, device, repeat, train=False, **kwargs):
        seen.append((model, train, plan_for(device)))
        return 1.0

    monkeypatch.setattr(common, 'measure', fake_measure)
    monkeypatch.setattr(common, 'build', lambda name, mode='auto': name)
    from mmsoft.benchmark import speed
    monkeypatch.setattr(speed, 'measure', fake_measure)
    monkeypatch.setattr(speed, 'build', lambda name, mode='auto': name)
    out = tmp_path / 'p.json'
    benchmark.main(['--device', 'cpu', '--sections', 'speed,train', '--sizes', '64x64',
                    '--skip-official', '--models', 'SOFT-S', '--soft-plans',
                    'tf32-1-4-pad32', 'iterative', '--json', str(out)])
    rows = json.loads(out.read_text())
    for section in ('speed', 'train'):
        assert {'SOFT-S [plan tf32-1-4-pad32]', 'SOFT-S [plan iterative]'} <= set(
            rows[section])
    forced = [(train, p) for m, train, p in seen if p != plan_for('cpu')]
    assert len(forced) == 4  # two plans, forward and training step
    tf32 = [p.pinv[-1][1] for _, p in forced if p.pinv[-1][1].name == 'tf32']
    assert len(tf32) == 2 and all(v.float32_steps == (1, 4) and v.pad_to == 32 for v in tf32)
    assert sorted(train for train, _ in forced) == [False, False, True, True]
    for bad in ('tf33', 'spectral64', 'default+tf32x3'):
        with pytest.raises(SystemExit):
            benchmark.main(['--device', 'cpu', '--sections', 'speed', '--soft-plans', bad])


@pytest.mark.slow
def test_profile_lists_each_plans_kernels_by_time(tmp_path, capsys):
    """The profile section: per size, plan and step, the device's time by kernel (on
    the CPU the operators' own time), the largest first, within the step's total."""
    out = tmp_path / 'p.json'
    benchmark.main(['--device', 'cpu', '--sections', 'profile', '--sizes', '64x64',
                    '--train-batch', '1', '--soft-plans', 'official', '--json', str(out)])
    rows = json.loads(out.read_text())['profile']
    assert set(rows) == {f'64x64 {p} {s}' for p in ('default', 'official')
                         for s in ('forward', 'train')}
    for name, row in rows.items():
        times = [t for _, t, _ in row['top']]
        assert times == sorted(times, reverse=True) and len(times) == 12, name
        assert 0 < sum(times) <= row['device'] * (1 + 1e-9) and row['launches'] > 0
        assert 0 < row['wall']
    names = {k for row in rows.values() for k, _, _ in row['top']}
    assert 'aten::bmm' in names or 'aten::mm' in names  # SOFT's products
    # the training step runs the backward's operators, the forward none
    assert any('Backward' in k for k, _, _ in rows['64x64 default train']['top'])
    assert not any('Backward' in k for k, _, _ in rows['64x64 default forward']['top'])
    printed = capsys.readouterr().out
    assert '##### SOFT-S 64x64 [official], training step, batch 1: wall ' in printed


def test_benchmark_scaling_plot(tmp_path):
    plot, out = tmp_path / 'scaling.png', tmp_path / 's.json'
    benchmark.main(['--device', 'cpu', '--sections', 'scaling', '--sweep', '64x64',
                    '128x128', '--repeat', '0', '--series', '2', '--plot', str(plot),
                    '--json', str(out)])
    res = json.loads(out.read_text())['scaling']
    assert plot.exists() and plot.stat().st_size > 10000
    soft = res['SOFT-S [auto]']
    assert all(soft[s]['time'] > 0 and soft[s]['peak_mb'] > 0 for s in ('64x64', '128x128'))
    assert soft['128x128']['peak_mb'] > soft['64x64']['peak_mb']
    assert math.isfinite(soft['exponent'])
    assert set(res) == {'SOFT-S [auto]', 'SOFT-S [grid16]'}  # --series 2


def test_scaling_reports_a_crash_apart_from_a_skip(monkeypatch):
    """A crashed measurement reads 'failed' and the exponent says how many sizes it was
    fitted on; a deliberate skip reads differently."""
    from mmsoft.benchmark import memory
    from mmsoft.benchmark.common import parse_size
    sweep = ['64x64', '128x128', '256x256']

    def fake(name, mode, size, device, repeat, **kw):
        if size == '128x128':
            return None  # what child_measure returns for a crashed child
        n = parse_size(size)[0]
        return dict(time=n * 1e-3, peak_mb=float(n))

    monkeypatch.setattr(memory, 'child_measure', fake)
    args = argparse.Namespace(
        series=4, sweep=sweep, device='cpu', repeat=0, softmax_max_pixels=100 * 100,
        plot=None)
    lines = memory.section_scaling(args, {})
    soft = next(line for line in lines if line.startswith('| SOFT-S [auto]'))
    assert '| failed |' in soft and '(fitted on 2 sizes)' in soft
    pvt = next(line for line in lines if line.startswith('| PVT-S'))
    assert pvt.count('N² too large') == 2 and 'failed' not in pvt


def test_memory_section_rows_and_ratios_to_swin(monkeypatch):
    """The memory section has a row per SOFT-S mode, XCiT-SimA-S12/16 and Swin-T, and
    each training peak is divided by Swin-T's (not by the row's own or SOFT-S's)."""
    from mmsoft.benchmark import memory
    peaks = {'SOFT-S': 300.0, 'XCiT-SimA-S12/16': 150.0, 'Swin-T': 200.0}
    calls = []

    def fake(name, mode, size, device, repeat, train=False, batch=1):
        calls.append((name, mode, train, batch))
        return dict(time=0.5, peak_mb=peaks[name] * (2 if train else 1))

    monkeypatch.setattr(memory, 'child_measure', fake)
    args = argparse.Namespace(sizes=['64x64', '128x96'], train_batch=2, device='cpu',
                              repeat=0, skip_official=True)
    out = {}
    lines = memory.section_memory(args, out)
    rows = {line.split(' |')[0][2:]: line for line in lines[2:]}
    assert set(rows) == {'SOFT-S [auto]', 'SOFT-S [regularized]', 'SOFT-S [grid16]',
                         'XCiT-SimA-S12/16', 'Swin-T'}
    assert rows['XCiT-SimA-S12/16'].endswith('| 0.75× |')  # 300 / 400 MB
    assert rows['SOFT-S [auto]'].endswith('| 1.50× |') and rows['Swin-T'].endswith('| 1.00× |')
    assert ('XCiT-SimA-S12/16', 'auto', True, 2) in calls  # trained at --train-batch
    assert '@128x96' in lines[0]  # the largest (last) --sizes entry
    assert out['memory']['XCiT-SimA-S12/16']['train']['peak_mb'] == 300.0


def test_models_keep_speed_train_and_memory_to_the_backbones_named(monkeypatch):
    """--models (what the lab's GPU call times at the detection size): the speed and train
    sections time the backbones named with Swin-T, SOFT-S also with landmark_grid=16 (and
    the CUDA-graph modes on CUDA), the train section XCiT-SimA among them; the memory
    section SOFT-S's default, the backbones named and Swin-T. Without --models the train
    and memory sections keep every SOFT-S mode and XCiT-SimA."""
    from mmsoft.benchmark import memory, speed
    monkeypatch.setattr(speed, 'build', lambda name, mode='auto': (name, mode))
    monkeypatch.setattr(speed, 'measure', lambda *args, **kwargs: 1.0)
    calls = []

    def fake(name, mode, size, device, repeat, train=False, batch=1):
        calls.append((name, mode, train))
        return dict(time=0.5, peak_mb=100.0)

    monkeypatch.setattr(memory, 'child_measure', fake)
    graphs = {'SOFT-S [cuda graphs]', 'SOFT-S [grid16 + cuda graphs]'}
    for device in ('cpu', 'cuda'):
        for models in (['SOFT-S', 'XCiT-SimA-S12/16'], None):
            args = argparse.Namespace(device=device, sizes=['64x64'], rounds=1, repeat=0,
                                      amp=None, models=models, skip_official=True,
                                      compile=None, train_batch=1, soft_plans=[])
            out = {}
            speed.section_speed(args, out)
            speed.section_train(args, out)
            calls.clear()
            memory.section_memory(args, out)
            extra = graphs if device == 'cuda' else set()
            if models:
                assert set(out['speed']) == {'SOFT-S', 'SOFT-S [grid16]', 'XCiT-SimA-S12/16',
                                             'Swin-T'} | extra
                assert set(out['train']) == {'SOFT-S [auto]', 'SOFT-S [grid16]',
                                             'XCiT-SimA-S12/16', 'Swin-T'} | extra
                assert set(out['memory']) == {'SOFT-S [auto]', 'XCiT-SimA-S12/16', 'Swin-T'}
            else:
                assert {'SOFT-S [grid16]', 'XCiT-SimA-S12/16', 'PVT-S'} <= set(out['speed'])
                assert set(out['train']) == {
                    'SOFT-S [auto]', 'SOFT-S [regularized]', 'SOFT-S [grid16]',
                    'XCiT-SimA-S12/16', 'Swin-T'} | extra | (
                        {'SOFT-S [tf32]'} if device == 'cuda' else set())
                assert {'SOFT-S [regularized]', 'SOFT-S [grid16]',
                        'XCiT-SimA-S12/16'} <= set(out['memory'])
            assert ('XCiT-SimA-S12/16', 'auto', True) in calls
            assert ('Swin-T', 'auto', True) in calls


@pytest.mark.openmmlab  # mmdet builds the detectors
def test_detector_section(tmp_path, capsys):
    """--sections detector times a training iteration and a test forward of RetinaNet and
    Mask R-CNN with SOFT-S (the paper's and landmark_grid=16) and with Swin-T, built from
    the shipped configs; every row's ratio is to the same detector with Swin-T."""
    out = tmp_path / 'd.json'
    benchmark.main(['--device', 'cpu', '--sections', 'detector', '--detector-size', '96x128',
                    '--repeat', '0', '--train-batch', '1', '--json', str(out)])
    rows, printed = json.loads(out.read_text())['detector'], capsys.readouterr().out
    labels = ('SOFT-S', 'SOFT-S [grid16]', 'Swin-T')
    assert list(rows) == [f'{d} {b}' for d in ('RetinaNet', 'Mask R-CNN') for b in labels]
    assert all(set(r) == {'train', 'test'} for r in rows.values())  # no peaks off CUDA
    assert all(r['train'] > 0 and r['test'] > 0 for r in rows.values())
    assert 'Images of 96x128' in printed
    table = {tuple(c.strip() for c in line.strip('|').split('|')): line
             for line in printed.splitlines() if line.startswith('| ')}
    for d in ('RetinaNet', 'Mask R-CNN'):
        swin = rows[f'{d} Swin-T']
        for b in labels:
            row = next(k for k in table if k[:2] == (d, b))
            r = rows[f'{d} {b}']
            assert row[3] == f"{r['train'] / swin['train']:.2f}×", row
            assert row[5] == f"{r['test'] / swin['test']:.2f}×", row


@pytest.mark.openmmlab  # mmdet builds the detectors
def test_detector_configs_differ_only_in_the_backbone():
    """Swin-T replaces the backbone and the neck's input widths, nothing else; the
    training iteration the section times updates the weights (the optimizer step)."""
    import torch
    from mmengine.optim import build_optim_wrapper

    from mmsoft.apis import init_model
    from mmsoft.benchmark import detector
    for det in ('RetinaNet', 'Mask R-CNN'):
        soft, swin = (detector.detector_config(det, b) for b in ('SOFT-S', 'Swin-T'))
        assert swin.model.backbone.type == 'SwinTransformer'
        assert swin.model.backbone.out_indices == soft.model.backbone.out_indices
        assert swin.model.neck.in_channels == [
            detector.SWIN_T_WIDTHS[i] for i in soft.model.backbone.out_indices]
        for cfg in (soft, swin):
            cfg.model.pop('backbone')
            cfg.model.neck.pop('in_channels')
        assert soft.model.to_dict() == swin.model.to_dict(), det
        assert soft.optim_wrapper.to_dict() == swin.optim_wrapper.to_dict(), det
    with pytest.raises(ValueError, match='SOFT-S'):
        detector.detector_config('RetinaNet', 'ResNet-50')
    cfg = detector.detector_config('Mask R-CNN', 'Swin-T')
    torch.manual_seed(0)
    model = init_model(cfg)
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    data = detector.detector_batch((64, 96), 2, masks=True)
    assert data['data_samples'][0].gt_instances.masks.masks.sum() > 0
    detector._detector_step(model, optim, data, 'cpu', train=True)
    changed = [k for k, p in model.named_parameters() if not torch.equal(p, before[k])]
    assert any(k.startswith('backbone.') for k in changed)
    assert any(k.startswith('roi_head.mask_head.') for k in changed)


@pytest.mark.openmmlab  # mmdet builds the detectors
@pytest.mark.parametrize('det,shipped', [
    ('RetinaNet', 'configs/soft/retinanet_soft-s-grid16_fpn_1x_coco.py'),
    ('Mask R-CNN', 'configs/soft/mask-rcnn_soft-s-grid16_fpn_1x_coco.py')])
def test_detector_grid16_rows_time_the_shipped_grid16_configs(det, shipped):
    """The 'SOFT-S [grid16]' rows are the shipped grid16 config, which is the paper's
    SOFT-S config with landmark_grid=16 and nothing else changed."""
    from mmengine.config import Config

    from mmsoft.benchmark import detector
    grid, soft = (detector.detector_config(det, b) for b in ('SOFT-S [grid16]', 'SOFT-S'))
    assert grid.to_dict() == Config.fromfile(osp.join(ROOT, shipped)).to_dict()
    assert grid.model.backbone.landmark_grid == 16
    assert 'landmark_grid' not in soft.model.backbone
    grid.model.backbone.pop('landmark_grid')
    assert grid.to_dict() == soft.to_dict()


def test_each_compiled_measurement_is_a_static_graph(monkeypatch):
    """Dynamo caches compiled code per code object, not per ``torch.compile`` call: a
    model compiled afresh at a second size hit the first one's cache entry and was
    recompiled with dynamic shapes (on an H100 the compile steps of the device report ran
    out of time in it). ``measure`` starts each compiled measurement from a reset, so each
    size gets its own static graph."""
    import torch

    from mmsoft.benchmark.common import measure
    real_compile, dynamic = torch.compile, []

    def backend(gm, example_inputs):
        dynamic.append(any(isinstance(a, torch.SymInt) for a in example_inputs))
        return gm.forward

    monkeypatch.setattr(torch, 'compile',
                        lambda model, mode=None: real_compile(model, backend=backend))
    model = torch.nn.Conv2d(3, 4, 3)
    for size in ((16, 16), (24, 32), (40, 24)):
        measure(model, size, 'cpu', repeat=0, compile_mode='default')
    assert dynamic == [False] * 3


def test_compiled_measurement_prints_where_compiling_went(monkeypatch, capsys):
    """A compiled measurement prints its compilation by phase (Dynamo's timers) and how
    many operators Dynamo captured: what tells a compilation that takes minutes apart
    (tracing, AOTAutograd, Inductor's kernels). 'aot_eager' here: Dynamo and
    AOTAutograd without Inductor's code generation."""
    import torch

    from mmsoft.benchmark.common import measure
    real_compile = torch.compile
    monkeypatch.setattr(torch, 'compile',
                        lambda model, mode=None: real_compile(model, backend='aot_eager'))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(),
                                torch.nn.Conv2d(4, 2, 1))
    measure(model, (16, 16), 'cpu', repeat=0, train=True, compile_mode='default')
    line = next(ln for ln in capsys.readouterr().out.splitlines() if 'compiled' in ln)
    assert 'compiled Sequential (training, default) in ' in line
    phase = re.search(r'Dynamo and the backend on the forward graph (\d+\.\d) s', line)
    total = float(re.search(r' in (\d+\.\d) s:', line).group(1))
    assert phase and float(phase.group(1)) <= total + 0.1, line
    # the two convolutions and the ReLU, counted since this measurement's reset
    assert re.search(r'; 3 operators captured, \d+ kernels generated$', line), line


def test_official_order_runs_the_official_attention(monkeypatch):
    """measure(mode='official order') (also in the memory section's child processes) runs
    SOFT's attention in the official order (``mmsoft.testing.official_order``), only
    inside the measurement."""
    from mmsoft.benchmark.common import build, measure
    from mmsoft.models.attention import soft as soft_attention_mod
    from mmsoft.models.backbones import soft as backbone
    calls, official = [], soft_attention_mod.official_order_attention
    plain = backbone.soft_attention

    def recording(*args, **kwargs):
        calls.append(backbone.soft_attention is not plain)
        return official(*args, **kwargs)

    monkeypatch.setattr(soft_attention_mod, 'official_order_attention', recording)
    model = build('SOFT-S', 'official order')
    measure(model, (64, 64), 'cpu', repeat=0)
    assert calls == []
    measure(model, (64, 64), 'cpu', repeat=0, mode='official order')
    assert calls and set(calls) == {True}
    assert backbone.soft_attention is plain


def test_child_measure_runs_in_a_fresh_process(tmp_path, monkeypatch, capsys):
    """The memory and scaling sections' measurement in a child process imports
    mmsoft.benchmark (not the CLI) and the modules of --import, from any working
    directory; a crashed child reads as None, with its error printed."""
    from mmsoft.benchmark import common
    from mmsoft.benchmark.common import child_measure
    monkeypatch.chdir(tmp_path)
    # the modules --import named are imported by the child too (one that is not found
    # there crashes it)
    monkeypatch.setattr(common, 'IMPORTED', ['json', 'mmsoft_no_such_module'])
    assert child_measure('SOFT-S', 'auto', '64x64', 'cpu', 0) is None
    assert "No module named 'mmsoft_no_such_module'" in capsys.readouterr().out
    monkeypatch.setattr(common, 'IMPORTED', ['json'])
    r = child_measure('SOFT-S', 'official order', '64x64', 'cpu', 0)
    assert r is not None and r['time'] > 0 and math.isfinite(r['peak_mb'])
    assert child_measure('no such backbone', 'auto', '64x64', 'cpu', 0) is None
    assert 'no such backbone [auto] at 64x64 failed' in capsys.readouterr().out


def test_cuda_graph_rows_on_cuda_only(monkeypatch):
    """On CUDA the speed and train sections add SOFT-S replayed from CUDA graphs (the
    paper's landmarks and landmark_grid=16), measured beside eager SOFT-S and Swin-T;
    elsewhere, where the graphs would run eagerly, they leave them out."""
    from mmsoft.benchmark import common, speed
    monkeypatch.setattr(speed, 'build', lambda name, mode='auto': (name, mode))
    monkeypatch.setattr(speed, 'measure', lambda *args, **kwargs: 1.0)
    for device in ('cpu', 'cuda'):
        args = argparse.Namespace(device=device, sizes=['64x64'], rounds=1, repeat=0,
                                  amp=None, models=['SOFT-S', 'Swin-T'], skip_official=True,
                                  compile=None, train_batch=1)
        out = {}
        speed.section_speed(args, out)
        speed.section_train(args, out)
        graphed = {k for section in ('speed', 'train') for k in out[section]
                   if 'cuda graphs' in k}
        assert graphed == (set() if device == 'cpu' else {
            'SOFT-S [cuda graphs]', 'SOFT-S [grid16 + cuda graphs]'}), device
    soft = common.build('SOFT-S', 'grid16 + cuda graphs')
    assert soft.cuda_graphs.min_calls == 1  # captured at the untimed first call
    assert soft.block1[0].att.mha.attn.landmark_grid == 16
    assert common.build('SOFT-S', 'auto').cuda_graphs is None


@pytest.mark.openmmlab  # mmdet builds the detectors
def test_detector_cuda_graph_rows_are_the_paper_config_with_graphs():
    from mmsoft.benchmark import detector
    for det in ('RetinaNet', 'Mask R-CNN'):
        graphed, soft = (detector.detector_config(det, b)
                         for b in ('SOFT-S [cuda graphs]', 'SOFT-S'))
        assert graphed.model.backbone.pop('cuda_graphs') == dict(min_calls=1)
        assert graphed.to_dict() == soft.to_dict()
