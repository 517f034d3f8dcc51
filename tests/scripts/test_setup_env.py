"""scripts/setup_env.sh prints no expected ERROR: mim's opendatalab, left out on purpose,
would make pip print "ERROR: pip's dependency resolver ..." after an install step."""
import os.path as osp
import re
import subprocess
import sys

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
