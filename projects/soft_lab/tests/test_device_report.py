"""projects/soft_lab/device_report.py: the one command a lent GPU machine runs, checked
on the CPU. Run from the repository root: `python -m pytest projects/soft_lab/tests`."""
import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys
import time

import projects.soft_lab  # noqa: F401  (registers the candidates the paths name)
from mmsoft.benchmark.common import path_plan
from projects.soft_lab import device_report

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def _load_tool(path):
    """A script under tools/ as a module, loaded from its file as ``python tools/...``
    runs it."""
    name = osp.splitext(osp.basename(path))[0]
    spec = importlib.util.spec_from_file_location(f'mmsoft_tool_{name}', osp.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_report_finds_the_repository():
    """The steps run in the repository root, where the tools and tests/ are; the report
    runs as a script from there."""
    assert osp.samefile(device_report.ROOT, ROOT)
    assert osp.isfile(osp.join(device_report.ROOT, device_report.BENCHMARK))
    assert osp.isfile(osp.join(device_report.ROOT, device_report.FIDELITY))
    assert osp.isdir(osp.join(device_report.ROOT, 'tests'))
    res = subprocess.run([sys.executable, osp.join('projects', 'soft_lab', 'device_report.py'),
                          '--help'], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert 'python3 projects/soft_lab/device_report.py --device cuda' in res.stdout


def test_report_runs_its_steps(tmp_path):
    """Each step's command, exit status and tables land in report.md, its numbers in
    <step>.json, everything printed in report.log. (Two real steps, a benchmark and the
    fidelity tool; that every step's command is one its tool takes is checked below,
    and the detector section itself in test_benchmark.py.)"""
    code = device_report.main(['--device', 'cpu', '--small', '--part', 'all', '--steps',
                               'pinv', 'fidelity', '--out', str(tmp_path)])
    report = (tmp_path / 'report.md').read_text()
    assert code == 0, report
    assert '## pinv: ' in report and '## fidelity: ' in report
    assert '## fp32' not in report and '## detector' not in report  # not selected
    assert report.count('exit 0, ') == 2 and 'Every step completed.' in report
    assert ('tools/analysis_tools/benchmark.py --device cpu --import projects.soft_lab '
            '--sections pinv') in report
    assert 'fidelity.py --device cpu --import projects.soft_lab --size' in report
    assert '--sizes 64x64' in report and '--tf32-schedules 1,2 1,4 1,6 1,8' in report
    assert '| astronaut | ' in report and '| blank | ' in report  # the fidelity tables
    assert '\n### pinv\n' in report  # the benchmark's headings below the step's
    assert (tmp_path / 'pinv.json').exists()
    fidelity = json.loads((tmp_path / 'fidelity.json').read_text())
    # the candidates' paths run on CUDA only (the CPU's plan has no 'tf32' to replace)
    paths = {p for p in device_report.FIDELITY_PATHS if '+' not in p}
    assert 'default' in paths and device_report.FORMED in paths
    assert set(fidelity['outputs']['blank']) == paths
    assert set(fidelity['gradients']) == {'astronaut'}
    assert set(fidelity['gradients']['astronaut']['paths']) == paths
    assert '===== fidelity' in (tmp_path / 'report.log').read_text()


def test_decide_part_ranks_its_candidates(tmp_path):
    """--part decide runs its three steps and closes with the candidates table of its
    own timing and floor steps: CUDA's plan and the DECIDE_PATHS that run here (off
    CUDA none: each replaces CUDA's 'tf32')."""
    code = device_report.main(['--device', 'cpu', '--small', '--part', 'decide', '--out',
                               str(tmp_path)])
    report = (tmp_path / 'report.md').read_text()
    assert code == 0, report
    steps = [ln.split(':')[0] for ln in report.splitlines()
             if ln.startswith('## ') and not ln.startswith('## mmsoft')]
    assert steps[:3] == ['## decide-matmul', '## decide-fp32', '## decide-fidelity']
    assert steps[-1] == '## candidates', steps
    assert 'the paths decide-fp32 and decide-fidelity both measured' in report
    table = report.split('## candidates')[1]
    rows = {ln.split(' | ')[0][2:] for ln in table.splitlines()
            if ln.startswith('| ') and not ln.startswith('| path')}
    assert rows == {'default'}, rows


def test_every_step_is_a_command_its_tool_takes():
    """Every step's arguments, at full and at toy sizes, parse in the tool it runs (a
    step that ran on the GPU machine with an option the tool lacks would cost a call),
    import the lab first and name paths that run on the step's device."""
    import argparse

    import projects.soft_lab.benchmark  # noqa: F401  (the sections --import adds)
    from mmsoft.benchmark import SECTIONS
    benchmark = _load_tool('tools/analysis_tools/benchmark.py')
    fidelity = _load_tool('tools/analysis_tools/fidelity.py')
    parsers = {'benchmark': benchmark.build_parser(), 'fidelity': fidelity.build_parser()}
    for device in ('cpu', 'cuda'):
        for small in (False, True):
            args = argparse.Namespace(device=device, small=small, out='o')
            for name, (_, tool, _, _, _) in device_report.STEPS.items():
                if tool == 'pytest':
                    continue
                cmd = device_report.command(name, args)
                if tool == 'detector':  # the benchmark, through the ops' runner
                    assert cmd[1:4] == [device_report.MMCV_OPS, '--tally',
                                        osp.join('o', f'{name}-ops.json')]
                    cmd = [cmd[0]] + cmd[4:]
                parsed = parsers['fidelity' if tool == 'fidelity' else 'benchmark'].parse_args(
                    cmd[2:])
                assert parsed.device == device and parsed.json == osp.join('o', f'{name}.json')
                assert parsed.imports == ['projects.soft_lab'], name
                paths = parsed.paths if tool == 'fidelity' else parsed.soft_plans
                if name in ('fp32', 'fidelity', 'decide-fp32', 'decide-fidelity'):
                    for path in (device_report.GUARDED, device_report.HORNER):
                        # the candidates on CUDA only
                        assert (path in paths) == (device == 'cuda'), (name, device, path)
                for path in paths:  # the tools check them so ('official': no plan)
                    if path != 'official':
                        path_plan(path, device)
                if tool != 'fidelity':  # the lab's sections, as the tool registers them
                    assert set(parsed.sections.split(',')) <= set(SECTIONS), name
                    if small:
                        assert parsed.detector_size == '128x160', name


def test_report_keeps_to_its_budget(tmp_path, monkeypatch):
    """A step still running when the budget is spent is stopped (with what it printed
    kept) and counted as not completed; later steps do not start."""
    sleeper = [sys.executable, '-c', 'import time; print("started", flush=True); '
               'time.sleep(60)']
    monkeypatch.setattr(device_report, 'command', lambda name, args: sleeper)
    t0 = time.perf_counter()
    code = device_report.main(['--device', 'cpu', '--steps', 'matmul', 'pinv', '--budget',
                               '3', '--out', str(tmp_path)])
    assert time.perf_counter() - t0 < 30
    report = (tmp_path / 'report.md').read_text()
    assert code == 1
    assert 'timed out (budget)' in report and 'started' in report
    assert 'not run: the time budget was spent' in report
    assert 'Steps not completed: matmul, pinv' in report  # STEPS' order


def test_report_keeps_what_a_cut_short_call_measured(tmp_path, monkeypatch):
    """report.md grows step by step: a call killed during its second step (the device's
    time limit) still leaves the first step's section."""
    calls = []

    def run_step(cmd, timeout):
        calls.append(cmd)
        if len(calls) == 2:
            raise KeyboardInterrupt  # stands for the kill
        return 0, 1.0, '| table |'

    monkeypatch.setattr(device_report, 'run_step', run_step)
    try:
        device_report.main(['--device', 'cpu', '--steps', 'matmul', 'pinv', '--out',
                            str(tmp_path)])
    except KeyboardInterrupt:
        pass
    report = (tmp_path / 'report.md').read_text()
    assert '## matmul: ' in report and '| table |' in report and 'exit 0, 1 s' in report
    assert '## pinv' not in report


def test_missing_pytest_is_reported(tmp_path, monkeypatch):
    """A machine without pytest (the lent GPU has no registry) gets a clear line instead
    of a traceback, and the next steps still run."""
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec',
                        lambda name, *a: None if name == 'pytest' else find_spec(name, *a))
    monkeypatch.setattr(device_report, 'run_step', lambda cmd, timeout: (0, 1.0, 'ok'))
    code = device_report.main(['--device', 'cpu', '--steps', 'cuda-tests', 'pinv', '--out',
                               str(tmp_path)])
    report = (tmp_path / 'report.md').read_text()
    assert code == 1 and 'pytest is not installed' in report and 'pip download' in report
    assert '## pinv' in report and 'exit 0, 1 s' in report


def _last(cmd, option, n=1):
    """What argparse keeps of ``option`` in ``cmd``: its last occurrence's n values."""
    i = len(cmd) - 1 - cmd[::-1].index(option)
    return cmd[i + 1:i + 1 + n]


def test_steps_measure_at_their_sizes_and_rounds():
    """A compiled model is compiled afresh for every measurement: the compile steps run
    one round at the detection size (their own options come last, so argparse keeps
    them), the CUDA-graph step three rounds at the detection size, the profile one
    profiled step at the detection size; the call's timing steps two rounds at the
    detection size (its detectors at 800x1333, batch 2); the others three rounds at both
    sizes; --small's toy sizes and one round win everywhere."""
    import argparse
    for small in (False, True):
        args = argparse.Namespace(device='cuda', small=small, out='o')
        for name in device_report.STEPS:
            cmd = device_report.command(name, args)
            if name == 'cuda-tests':
                assert cmd[1:5] == ['-m', 'pytest', '-m', 'cuda']
                continue
            if device_report.STEPS[name][1] == 'fidelity':
                full = {'fidelity': '800x1344', 'fidelity-640': '640x640',
                        'decide-fidelity': '800x1344', 'floor': '800x1344'}[name]
                assert _last(cmd, '--size') == ['96x128' if small else full]
                continue
            compiled = name.startswith('compile')
            if small:
                assert _last(cmd, '--sizes') == ['64x64'], name
                assert _last(cmd, '--rounds') == ['1'], name
                assert _last(cmd, '--detector-size') == ['128x160'], name
            elif compiled or name == 'graphs':
                assert _last(cmd, '--rounds') == ['1' if compiled else '3'], name
                assert _last(cmd, '--sizes', 2) == ['800x1344', '--skip-official'], name
            elif name == 'profile':  # CUDA's plan alone
                assert _last(cmd, '--sizes', 2) == ['800x1344', '--json'], name
            elif name in ('decide-fp32', 'backbones'):  # the detection size, two rounds
                assert _last(cmd, '--rounds') == ['2'], name
                assert _last(cmd, '--sizes', 2) == ['800x1344', '--rounds'], name
            elif name == 'memory':  # at the detection size (one process per measurement)
                assert _last(cmd, '--sizes', 2) == ['800x1344', '--skip-official'], name
            elif name == 'detectors':  # the section's own size and batch, two rounds
                assert _last(cmd, '--rounds') == ['2'] and _last(cmd, '--repeat') == ['2']
                assert '--detector-size' not in cmd and '--train-batch' not in cmd
            elif name == 'decide-matmul':  # 1050 landmarks padded 4 ways, no network
                assert _last(cmd, '--matmul-sizes', 5) == ['1056', '1088', '1152', '1280',
                                                           '--json'], name
            else:
                assert _last(cmd, '--rounds') == ['3'], name
                assert _last(cmd, '--sizes', 2) == ['512x512', '800x1344'], name


def test_parts_split_the_steps():
    """The call part holds what the issue of a lent GPU's first call asks, in the order
    of its worth: the CUDA tests, the backbones, the detectors, memory, the floor, then
    the candidates; its steps' budgets fit CALL_BUDGET but the candidates' (cut first
    when the budget runs out), and the call with its set-up fits a command's 10 minutes.
    --part base needs no detector; the compile and CUDA-graph steps are a part of their
    own; what an H100 measured already is the extra part; the lean decide part has its
    own steps."""
    steps = device_report.STEPS
    call = [n for n, step in steps.items() if 'call' in step[0]]
    assert call == ['cuda-tests', 'backbones', 'detectors', 'memory', 'floor', 'decide-fp32',
                    'decide-fidelity']
    budgets = [steps[n][4] for n in call]
    assert all(b and b > 0 for b in budgets)
    assert sum(budgets[:5]) <= device_report.CALL_BUDGET < sum(budgets)
    assert device_report.CALL_BUDGET <= 540  # with the set-up, within a 600 s command
    parts = {name: step[0] for name, step in steps.items()}
    assert parts.pop('detectors') == ('call', 'detector')
    assert parts.pop('cuda-tests') == ('call', 'base')
    assert {parts.pop(n) for n in ('backbones', 'memory', 'floor')} == {('call', )}
    assert parts.pop('compile-ro') == parts.pop('compile') == parts.pop('graphs') \
        == ('compile', )
    assert {parts.pop(n) for n in ('layout', 'bf16', 'fp16')} == {('extra', )}
    assert parts.pop('decide-matmul') == ('decide', )
    assert {parts.pop(n) for n in ('decide-fp32', 'decide-fidelity')} == {('decide', 'call')}
    assert set(parts.values()) == {('base', )}
    assert {'matmul', 'pinv', 'fidelity', 'fidelity-640', 'fp32', 'profile',
            'memory-modes'} == set(parts)
    assert set(device_report.PARTS) == {p for step in steps.values() for p in step[0]}


def test_report_leaves_log_lines_and_warnings_out():
    """report.md keeps a benchmark's tables and sentences; mmengine's and torch's log
    lines and Python's warnings (with their source lines) stay in report.log."""
    printed = '\n'.join([
        '# mmsoft benchmark: cpu',
        '/x/benchmark.py:147: RuntimeWarning: mmsoft: transformers 5 beside mmpretrain',
        '  import mmsoft  # noqa: F401',
        '11/24 10:16:31 - mmengine - INFO - Loads checkpoint',
        'W1124 10:16:31.584000 6836 torch/utils/_sympy/interp.py:179] [0/1] failed',
        '/x/conv_module.py:208: UserWarning: Unnecessary conv bias',
        '  warnings.warn(',
        '  measured 512x512 (round 1/3)',
        '| backbone | 512x512 |',
        '| SOFT-S | 30.1 ms |'])
    assert device_report.shown(printed, 'fp32') == [
        '## mmsoft benchmark: cpu', '  measured 512x512 (round 1/3)', '| backbone | 512x512 |',
        '| SOFT-S | 30.1 ms |']


def test_candidates_rank_the_paths_both_steps_measured(tmp_path):
    """The closing table sets each path's times against Swin-T's at the largest size and
    its worst map and gradient against their bounds: fastest forward first, a path
    over a bound marked as missing the floor, a path only one step measured left out."""
    assert device_report.candidates(str(tmp_path)) == []  # no step ran
    speed = {'SOFT-S': {'64x64': 1., '96x128': 4.}, 'Swin-T': {'64x64': 1., '96x128': 2.},
             'SOFT-S [plan fast]': {'96x128': 3.}, 'SOFT-S [plan timed-only]': {'96x128': 1.}}
    train = {'SOFT-S [auto]': {'96x128': 8.}, 'Swin-T': {'96x128': 2.},
             'SOFT-S [plan fast]': {'96x128': 6.}}
    (tmp_path / 'fp32.json').write_text(json.dumps(dict(speed=speed, train=train)))
    outputs = {'astronaut': {'default': dict(maps=[1e-6, 5e-6]),
                             'fast': dict(maps=[1e-6, 2e-5]),
                             'floor-only': dict(maps=[1e-6, 1e-6])},
               'blank': {'default': dict(maps=[2e-6, 1e-6]), 'fast': dict(maps=[1e-6, 1e-6]),
                         'floor-only': dict(maps=[1e-6, 1e-6])}}

    def grads(dev):
        return dict(gradients={'w': dev}, worst='w')
    gradients = {'astronaut': dict(bound=1e-4, paths=dict(
        default=grads(2e-5), fast=grads(5e-5), **{'floor-only': grads(1e-5)}))}
    (tmp_path / 'fidelity.json').write_text(json.dumps(dict(
        size=[96, 128], outputs=outputs, gradients=gradients,
        output_bounds={'astronaut': [1e-5, 1e-5], 'blank': [1e-5, 1e-5]})))
    lines = device_report.candidates(str(tmp_path))
    rows = [line for line in lines if line.startswith('| ') and not line.startswith('| path')]
    assert [r.split(' | ')[0] for r in rows] == ['| fast', '| default']
    assert rows[0] == '| fast | 3000.0 ms | 1.50× | 6000.0 ms | 3.00× | 2.00 | 0.50 | missed |'
    assert rows[1] == '| default | 4000.0 ms | 2.00× | 8000.0 ms | 4.00× | 0.50 | 0.20 | kept |'
    assert 'at 96x128' in lines[1]


def _mmcv_lite(site):
    """A copy of the installed mmcv without its compiled ops, with the module setup.sh
    puts in their place: mmcv-lite as the GPU machine has it, first on PYTHONPATH."""
    import shutil

    import mmcv
    src = osp.dirname(mmcv.__file__)
    shutil.copytree(src, site / 'mmcv', ignore=shutil.ignore_patterns('_ext*.so', '_ext*.pyd',
                                                                      'csrc', '__pycache__'))
    setup = open(osp.join(ROOT, 'projects', 'soft_lab', 'gpu', 'setup.sh')).read()
    stub = 'projects/soft_lab/gpu/mmcv_ext_stub.py'
    assert f'cp {stub} "$SITE/mmcv/_ext.py"' in setup
    shutil.copy(osp.join(ROOT, stub), site / 'mmcv' / '_ext.py')
    return str(site)


def test_the_call_runs_dry_on_the_cpu_as_on_the_gpu_machine(tmp_path, monkeypatch):
    """The GPU machine's command, at toy sizes on the CPU, with mmcv-lite first on
    PYTHONPATH as setup.sh leaves it: every step of the call completes and leaves its
    entry in report.md and report.json, with its numbers; the detectors ran on the ops
    mmcv_ops.py serves (its tally), the backbones and memory steps measured XCiT-SimA
    and SOFT-S's landmark_grid=16 beside SOFT-S and Swin-T."""
    site = _mmcv_lite(tmp_path / 'site')
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join([site, ROOT]))
    lite = subprocess.run([sys.executable, '-c', 'import mmcv.ops, mmcv._ext as e; '
                           'print(e.__file__); e.nms(None, None)'], cwd=ROOT,
                          capture_output=True, text=True)
    assert lite.stdout.startswith(site) and "no compiled op 'nms'" in lite.stderr
    out = tmp_path / 'out'
    code = device_report.main(['--device', 'cpu', '--small', '--out', str(out)])
    report = (out / 'report.md').read_text()
    assert code == 0, report
    call = [n for n, step in device_report.STEPS.items() if 'call' in step[0]]
    record = json.loads((out / 'report.json').read_text())
    assert [s['name'] for s in record['steps']] == call
    for step in record['steps']:
        assert step['status'] == 'exit 0' and f"## {step['name']}: " in report, step['name']
        if step['name'] != 'cuda-tests':
            assert f"{step['name']}.json" in step['files'], step['name']
    assert record['part'] == 'call' and record['not_completed'] == []
    run = record['run']
    assert run['commit'] != 'unknown' and run['torch'] and run['python']
    assert record['versions']['torchvision'] and 'Every step completed.' in report
    ops = json.loads((out / 'detectors-ops.json').read_text())['ops']
    assert {'nms', 'roi_align forward', 'roi_align backward'} <= set(ops)
    assert all(e['calls'] > 0 for e in ops.values())
    assert record['steps'][2]['mmcv_ops']['ops'] == ops
    assert "mmcv's compiled ops served from torchvision / PyTorch" in report
    backbones = json.loads((out / 'backbones.json').read_text())
    expected = {'SOFT-S', 'SOFT-S [grid16]', 'XCiT-SimA-S12/16', 'Swin-T'}
    assert set(backbones['speed']) == expected
    assert set(backbones['train']) == {'SOFT-S [auto]', 'SOFT-S [grid16]', 'XCiT-SimA-S12/16',
                                       'Swin-T'}
    detectors = json.loads((out / 'detectors.json').read_text())['detector']
    assert {'RetinaNet SOFT-S', 'RetinaNet Swin-T', 'Mask R-CNN SOFT-S',
            'Mask R-CNN Swin-T'} <= set(detectors)
    memory = json.loads((out / 'memory.json').read_text())['memory']
    assert set(memory) == {'SOFT-S [auto]', 'XCiT-SimA-S12/16', 'Swin-T'}
    assert all(r['train'] and r['train']['peak_mb'] > 0 for r in memory.values())
    floor = json.loads((out / 'floor.json').read_text())
    assert set(floor['outputs']) == {'astronaut', 'blank'}
    assert set(floor['gradients']['astronaut']['paths']) == {'default'}
    assert '## candidates: the paths decide-fp32 and decide-fidelity' in report


def test_a_step_is_stopped_at_its_own_budget(tmp_path, monkeypatch):
    """A step that outlasts its own budget is stopped and recorded with it, and the next
    step still runs within the call's budget."""
    sleeper = [sys.executable, '-c', 'import time; print("started", flush=True); '
               'time.sleep(60)']
    quick = [sys.executable, '-c', 'print("| table |")']
    monkeypatch.setattr(device_report, 'command',
                        lambda name, args: sleeper if name == 'backbones' else quick)
    steps = dict(device_report.STEPS)
    steps['backbones'] = steps['backbones'][:4] + (2, )
    monkeypatch.setattr(device_report, 'STEPS', steps)
    t0 = time.perf_counter()
    code = device_report.main(['--device', 'cpu', '--steps', 'backbones', 'floor', '--out',
                               str(tmp_path)])
    assert time.perf_counter() - t0 < 30 and code == 1
    report = (tmp_path / 'report.md').read_text()
    assert 'timed out (its budget, 2 s)' in report and 'started' in report
    assert '## floor: ' in report and 'exit 0' in report
    record = json.loads((tmp_path / 'report.json').read_text())
    assert [(s['name'], s['status']) for s in record['steps']] == [
        ('backbones', 'timed out (its budget, 2 s)'), ('floor', 'exit 0')]
    assert record['not_completed'] == ['backbones']


def test_the_commit_travels_where_git_does_not(tmp_path, monkeypatch):
    """The GPU machine gets the working tree without git: the commit is read from what
    prepare.sh stored, and written into each step's JSON that could not name one."""
    monkeypatch.setattr(device_report, 'ROOT', str(tmp_path))  # no repository here
    assert device_report.commit() == ('unknown', None)
    (tmp_path / '.gpu').mkdir()
    (tmp_path / '.gpu' / 'commit').write_text('0123abc+uncommitted\n')
    assert device_report.commit() == ('0123abc+uncommitted', '.gpu/commit')
    step = tmp_path / 'backbones.json'
    step.write_text(json.dumps(dict(run=dict(commit='unknown', torch='2.11'), speed={})))
    device_report.stamp(str(step), '0123abc+uncommitted')
    run = json.loads(step.read_text())['run']
    assert run == dict(commit='0123abc+uncommitted', commit_from='.gpu/commit', torch='2.11')
    step.write_text(json.dumps(dict(run=dict(commit='feed'))))
    device_report.stamp(str(step), '0123abc')  # a commit git named stays
    assert json.loads(step.read_text())['run'] == dict(commit='feed')
    prepare = open(osp.join(ROOT, 'projects', 'soft_lab', 'gpu', 'prepare.sh')).read()
    assert '.gpu/commit' in prepare and device_report.PREPARED_COMMIT == '.gpu/commit'


def test_a_further_call_keeps_the_earlier_ones(tmp_path, monkeypatch):
    """--steps in a further call into the same directory: report.json describes this
    call and keeps the earlier one under 'earlier' (report.md is appended to)."""
    monkeypatch.setattr(device_report, 'run_step', lambda cmd, timeout: (0, 1.0, 'ok'))
    device_report.main(['--device', 'cpu', '--steps', 'floor', '--out', str(tmp_path)])
    device_report.main(['--device', 'cpu', '--steps', 'memory', '--out', str(tmp_path)])
    record = json.loads((tmp_path / 'report.json').read_text())
    assert [s['name'] for s in record['steps']] == ['memory']
    assert [[s['name'] for s in e['steps']] for e in record['earlier']] == [['floor']]
    report = (tmp_path / 'report.md').read_text()
    assert report.count('# mmsoft device report') == 2 and '## floor: ' in report
