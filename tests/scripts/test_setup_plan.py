"""scripts/setup_plan.py: how mmcv's ops are built, decided from a faked machine."""
import os
import os.path as osp
import stat
import subprocess
import sys

import pytest
from conftest import ROOT, load_tool


setup_plan = load_tool('scripts/setup_plan.py')
SetupStop, plan = setup_plan.SetupStop, setup_plan.plan


def test_no_gpu_builds_cpu_ops_whatever_torch_was_built_with():
    for torch_cuda in (None, '13.0'):
        p = plan(torch_cuda, gpu_visible=False, nvccs=[])
        assert p['ops'] == 'cpu' and p['env']['FORCE_CUDA'] == '0' and p['warning'] is None


def test_gpu_with_matching_nvcc_builds_cuda_ops():
    nvccs = [('/opt/cuda-12.4/bin/nvcc', '12.4'), ('/usr/local/cuda-13.0/bin/nvcc', '13.0')]
    p = plan('13.0', gpu_visible=True, nvccs=nvccs)
    assert p['ops'] == 'cuda' and p['tag'] == 'cu130'
    assert p['env'] == dict(FORCE_CUDA='1', CUDA_HOME='/usr/local/cuda-13.0')
    # a different minor version of the same major is what torch's builder accepts
    assert plan('13.0', True, [('/x/bin/nvcc', '13.1')])['ops'] == 'cuda'


@pytest.mark.parametrize('nvccs', [[], [('/usr/local/cuda/bin/nvcc', '12.8')]])
def test_gpu_without_matching_nvcc_stops_before_the_build(nvccs):
    with pytest.raises(SetupStop) as e:
        plan('13.0', gpu_visible=True, nvccs=nvccs)
    msg = str(e.value)
    assert 'CUDA 13.x toolkit' in msg and 'MMSOFT_MMCV_OPS=cpu' in msg
    assert ('12.8' in msg) == bool(nvccs)  # names what it found


def test_cpu_ops_opt_in_hides_the_gpu_and_warns():
    p = plan('13.0', gpu_visible=True, nvccs=[], cpu_ops=True)
    assert p['ops'] == 'cpu'
    assert p['env'] == dict(FORCE_CUDA='0', CUDA_VISIBLE_DEVICES='')
    assert 'NMS' in p['warning'] and 'RoIAlign' in p['warning']


def test_nvcc_found_through_cuda_home_and_path(tmp_path):
    """A fake nvcc that prints what the real one prints."""
    def fake(d, release):
        os.makedirs(d / 'bin')
        exe = d / 'bin' / 'nvcc'
        exe.write_text('#!/bin/sh\necho "nvcc: NVIDIA (R) Cuda compiler driver"\n'
                       f'echo "Cuda compilation tools, release {release}, V{release}.48"\n')
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
        return str(exe)

    a = fake(tmp_path / 'home', '13.0')
    b = fake(tmp_path / 'onpath', '12.6')
    env = dict(CUDA_HOME=str(tmp_path / 'home'), PATH=str(tmp_path / 'onpath' / 'bin'))
    found = setup_plan.find_nvcc(env)
    assert found[:2] == [(a, '13.0'), (b, '12.6')]
    assert setup_plan.nvcc_version(str(tmp_path / 'missing')) is None


def test_main_prints_shell_assignments():
    env = dict(os.environ, MMSOFT_MMCV_OPS='cpu')
    res = subprocess.run([sys.executable, osp.join(ROOT, 'scripts', 'setup_plan.py')],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    out = subprocess.run(['bash', '-c', res.stdout + '\necho "$MMCV_OPS|$MMCV_BUILD_ENV"'],
                         capture_output=True, text=True).stdout.strip()
    assert out.startswith('cpu|FORCE_CUDA=0')
