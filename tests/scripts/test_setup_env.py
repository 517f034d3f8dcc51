"""scripts/setup_env.sh prints no expected ERROR: mim's opendatalab, left out on purpose,
would make pip print "ERROR: pip's dependency resolver ..." after an install step. It
refuses to start a new environment on a disk too full to hold one."""
import os
import os.path as osp
import re
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = osp.join(ROOT, 'scripts', 'setup_env.sh')
# What `pip check` says about the opendatalab the set-up leaves out (of either mim).
MISSING_OPENDATALAB = re.compile(
    r'(openmim|onedl-mim) \S+ requires opendatalab, which is not installed\.')


def script_lines():
    """The script's commands, lines continued with a backslash joined, comments dropped."""
    with open(SCRIPT) as f:
        text = re.sub(r'\\\n\s*', ' ', f.read())
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith('#')]


def test_installs_leave_conflicts_to_pip_check():
    """pip reports the unmet requirements of what it installs and of what depends on that
    (mim, whose requirements the steps install) unless told --no-warn-conflicts; pip
    install --no-deps never reports them."""
    lines = script_lines()
    assert 'INSTALL=("${PIP[@]}" install --no-warn-conflicts)' in lines
    plain = [line for line in lines if re.search(r'(\}"|\bpip) install\b', line)
             and not line.startswith('INSTALL=')]
    assert not plain, f'install steps that may report conflicts: {plain}'
    assert sum(line.startswith('"${INSTALL[@]}"') for line in lines) >= 5
    mim_step = next(i for i, line in enumerate(lines) if '"$MIM"' in line)
    assert '--no-deps' in lines[mim_step]
    requirements_step = next(i for i, line in enumerate(lines)
                             if 'requirements/mim.txt' in line)
    assert requirements_step < mim_step and '$PINS' in lines[requirements_step]
    assert any(re.search(r'"\$\{PIP\[@\]\}" check', line) for line in lines[mim_step:])


def test_pip_check_lists_only_the_missing_opendatalab():
    """This environment (made by the script) has no dependency conflict but the one the
    script leaves on purpose and filters out of its pip check."""
    res = subprocess.run([sys.executable, '-m', 'pip', 'check', '--disable-pip-version-check'],
                         capture_output=True, text=True)
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    other = [line for line in lines if not MISSING_OPENDATALAB.fullmatch(line)
             and not line.startswith('No broken requirements')]
    assert not other, other


@pytest.mark.parametrize('free_gib', [3, 5])
def test_new_environment_needs_free_disk(tmp_path, free_gib):
    """A new environment (6.5 GiB at the peak of a fresh set-up) is refused before anything
    is downloaded or created when the disk has less than the script asks for; the message
    gives the free space df reports. A stand-in df in PATH plays the full disk."""
    shim = tmp_path / 'bin'
    shim.mkdir()
    df = shim / 'df'
    df.write_text('#!/bin/sh\n'
                  'echo "Filesystem 1024-blocks Used Available Capacity Mounted on"\n'
                  f'echo "/dev/x 100000000 90000000 {free_gib * 1048576} 97% /"\n')
    df.chmod(0o755)
    venv = tmp_path / 'new' / 'venv'
    env = dict(os.environ, PATH=f'{shim}{os.pathsep}{os.environ["PATH"]}',
               MMSOFT_VENV=str(venv))
    res = subprocess.run(['bash', SCRIPT], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f'has {free_gib} GiB free' in res.stderr, res.stderr
    assert re.search(r'needs about \d+ GiB', res.stderr), res.stderr
    assert not (tmp_path / 'new').exists()
