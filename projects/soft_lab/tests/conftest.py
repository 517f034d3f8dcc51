"""The lab's tests run from the repository root (``python -m pytest projects/soft_lab/tests``),
where ``projects.soft_lab`` imports."""


def pytest_configure(config):
    config.addinivalue_line('markers', 'cuda: needs a CUDA GPU (skipped without one)')
