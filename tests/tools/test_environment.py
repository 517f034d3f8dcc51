"""tools/misc/check_env.py and mmsoft.compat: what an environment lacks, and the fix."""
import os
import os.path as osp
import subprocess
import sys
import sysconfig

import pytest
from conftest import ROOT, load_tool


@pytest.mark.parametrize('transformers,mmpretrain,trapped', [
    ('5.17.0', '1.2.0', True), ('5.0.0rc1', '1.0.0', True), ('4.57.6', '1.2.0', False),
    ('5.17.0', '1.3.6', True), ('5.17.0', '1.4.0', False)])
def test_transformers_trap_rule(transformers, mmpretrain, trapped):
    from mmsoft.compat import transformers_trap
    msg = transformers_trap(transformers, mmpretrain)
    assert bool(msg) == trapped
    if trapped:
        assert 'pip install "transformers<5"' in msg and transformers in msg


def test_check_env_reports_every_component_here(capsys):
    check_env = load_tool('tools/misc/check_env.py')
    assert check_env.main([]) == 0
    out = capsys.readouterr().out
    for name in ('torch', 'mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'mmsoft'):
        assert f'] {name}' in out, out
    assert 'ops run on the CPU' in out and 'environment ok' in out


def test_check_env_names_missing_ops_and_codebases(monkeypatch, capsys):
    """A broken mmcv and a missing codebase: one line each, with a fix, exit 1."""
    check_env = load_tool('tools/misc/check_env.py')

    def broken_mmcv():
        raise ImportError("No module named 'mmcv._ext'")

    monkeypatch.setattr(check_env, 'check_mmcv_ops', broken_mmcv)
    real = check_env.dist_version
    monkeypatch.setattr(check_env, 'dist_version', lambda *names: (None, None)
                        if names[0] == 'mmsegmentation' else real(*names))
    assert check_env.main([]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] mmcv cannot be imported (No module named 'mmcv._ext')" in out
    assert '[warn] mmseg not installed (needed for the UperNet configs)' in out
    assert check_env.main(['--strict']) == 1


@pytest.mark.slow
def test_transformers_5_beside_mmpretrain(tmp_path):
    """A throwaway venv over this one with transformers >= 5 from PyPI (~40 s): the trap is
    real (mmdet.models fails), check_env names it with the fix, import mmsoft warns."""
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    py = str(venv / 'bin' / 'python')
    site = subprocess.run([py, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(osp.join(site, 'zz_base.pth'), 'w') as f:  # after the venv's own packages
        f.write(sysconfig.get_paths()['purelib'] + '\n')
    res = subprocess.run([sys.executable, '-m', 'pip', '--python', py, 'install', '-q',
                          '--disable-pip-version-check', 'transformers>=5,<6'],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip('could not install transformers>=5 from PyPI: ' + res.stderr[-300:])
    env = dict(os.environ, PYTHONPATH=ROOT)
    trap = subprocess.run([py, '-c', 'import mmdet.models'], capture_output=True, text=True,
                          env=env)
    assert 'NoneType takes no arguments' in trap.stderr
    check = subprocess.run([py, osp.join(ROOT, 'tools', 'misc', 'check_env.py')],
                           capture_output=True, text=True, env=env)
    assert check.returncode == 1
    assert 'fix: transformers' in check.stdout and 'pip install "transformers<5"' in check.stdout
    # the warning filter this check needs, whatever the caller's PYTHONWARNINGS says
    warn = subprocess.run([py, '-c', 'import mmsoft'], capture_output=True, text=True,
                          env=dict(env, PYTHONWARNINGS='default'))
    assert warn.returncode == 0 and 'transformers<5' in warn.stderr


def test_onedl_distributions_resolve_mmseg_scope(monkeypatch):
    """With only onedl-mmsegmentation installed, mmseg:: base configs resolve through it
    (onedl-mmengine looks the scope up by the old distribution name)."""
    from mmengine.config import utils as config_utils
    from mmsoft import compat
    table = dict(config_utils.MODULE2PACKAGE, mmseg='mmsegmentation')  # mmengine's own
    monkeypatch.setattr(config_utils, 'MODULE2PACKAGE', table)
    onedl = {'onedl-mmsegmentation': '1.4.2', 'onedl-mmdetection': '3.5.1'}
    monkeypatch.setattr(compat, 'installed_version', lambda *n: onedl.get(n[0]))
    assert compat.onedl_config_scopes() == ['mmseg']
    assert table['mmseg'] == 'onedl-mmsegmentation' and table['mmdet'] == 'mmdet'
    # the OpenMMLab stack: nothing to change
    table['mmseg'] = 'mmsegmentation'
    monkeypatch.setattr(compat, 'installed_version', lambda *n: '1.2.2'
                        if n[0] == 'mmsegmentation' else None)
    assert compat.onedl_config_scopes() == [] and table['mmseg'] == 'mmsegmentation'
