"""projects/soft_lab/device_report.py: the one command a lent GPU machine runs, checked
on the CPU. Run from the repository root: `python -m pytest projects/soft_lab/tests`."""
import importlib.util
import json
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
            for name, (_, tool, _, _) in device_report.STEPS.items():
                if tool == 'pytest':
                    continue
                cmd = device_report.command(name, args)
                parsed = parsers[tool].parse_args(cmd[2:])
                assert parsed.device == device and parsed.json == osp.join('o', f'{name}.json')
                assert parsed.imports == ['projects.soft_lab'], name
                paths = parsed.soft_plans if tool == 'benchmark' else parsed.paths
                if name in ('fp32', 'fidelity', 'decide-fp32', 'decide-fidelity'):
                    for path in (device_report.GUARDED, device_report.HORNER):
                        # the candidates on CUDA only
                        assert (path in paths) == (device == 'cuda'), (name, device, path)
                for path in paths:  # the tools check them so ('official': no plan)
                    if path != 'official':
                        path_plan(path, device)
                if tool == 'benchmark':  # the lab's sections, as the tool registers them
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


def test_compile_steps_measure_one_round_at_one_size():
    """A compiled model is compiled afresh for every measurement: the compile steps run
    one round at the detection size (their own options come last, so argparse keeps
    them), the CUDA-graph step three rounds at the detection size, the profile one
    profiled step at the detection size, the others three rounds at both sizes; --small's
    toy sizes win everywhere."""
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
                        'decide-fidelity': '800x1344'}[name]
                assert _last(cmd, '--size') == ['96x128' if small else full]
                continue
            compiled = name.startswith('compile')
            if small:
                assert _last(cmd, '--sizes') == ['64x64'], name
            elif compiled or name == 'graphs':
                assert _last(cmd, '--rounds') == ['1' if compiled else '3'], name
                assert _last(cmd, '--sizes', 2) == ['800x1344', '--skip-official'], name
            elif name == 'profile':  # CUDA's plan alone
                assert _last(cmd, '--sizes', 2) == ['800x1344', '--json'], name
            elif name == 'decide-fp32':  # the detection size only, two rounds
                assert _last(cmd, '--rounds') == ['2'], name
                assert _last(cmd, '--sizes', 2) == ['800x1344', '--rounds'], name
            elif name == 'decide-matmul':  # 1050 landmarks padded 4 ways, no network
                assert _last(cmd, '--matmul-sizes', 5) == ['1056', '1088', '1152', '1280',
                                                           '--json'], name
            else:
                assert _last(cmd, '--rounds') == ['3'], name
                assert _last(cmd, '--sizes', 2) == ['512x512', '800x1344'], name


def test_parts_split_the_steps():
    """--part base needs no compiled mmcv ops; the compile and CUDA-graph steps and the
    detector step (each part fits one call of the GPU machine) are parts of their own;
    what an H100 measured already is the extra part; the lean decide part has its own
    steps."""
    parts = {name: step[0] for name, step in device_report.STEPS.items()}
    assert parts.pop('detector') == 'detector'
    assert parts.pop('compile-ro') == parts.pop('compile') == parts.pop('graphs') == 'compile'
    assert {parts.pop(n) for n in ('layout', 'bf16', 'fp16')} == {'extra'}
    assert {parts.pop(n) for n in ('decide-matmul', 'decide-fp32',
                                   'decide-fidelity')} == {'decide'}
    assert set(parts.values()) == {'base'}
    assert {'cuda-tests', 'matmul', 'pinv', 'fidelity', 'fidelity-640', 'fp32', 'profile',
            'memory-modes'} == set(parts)


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
