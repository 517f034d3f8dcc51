import os
import os.path as osp
import subprocess

import pytest
import torch

DATA = osp.join(osp.dirname(__file__), 'data')


def data_path(name):
    return osp.join(DATA, name)


def rel_err(a, b):
    """max|a - b| / max|b| (SPEC section 4)."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def run(cmd, cwd, env=None):
    """Run a command as a user would; on failure show the tail of its output."""
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                         env=dict(os.environ, **(env or {})))
    if res.returncode != 0:
        raise AssertionError(f'{" ".join(map(str, cmd))} failed:\n{res.stdout[-4000:]}\n'
                             f'{res.stderr[-4000:]}')
    return res.stdout + res.stderr


def untrained_checkpoint(cfg_path, path):
    """The config's model after init_weights(), saved as an mmengine checkpoint."""
    from mmsoft.analysis import build_model_from_config
    model = build_model_from_config(cfg_path)
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, path)
    return str(path)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: end-to-end tests that train a model (minutes)')
    config.addinivalue_line('markers', 'cuda: needs a CUDA GPU (skipped without one)')
