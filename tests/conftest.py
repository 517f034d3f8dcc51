import os.path as osp

import pytest
import torch

DATA = osp.join(osp.dirname(__file__), 'data')


def data_path(name):
    return osp.join(DATA, name)


def rel_err(a, b):
    """max|a - b| / max|b| (SPEC section 4)."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: end-to-end tests that train a model (minutes)')
