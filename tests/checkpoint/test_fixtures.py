"""The parity fixtures are the files tests/data/README.md describes."""
import hashlib
import os
import os.path as osp

import torch
from conftest import DATA


def test_fixture_checksums():
    with open(osp.join(DATA, 'SHA256SUMS')) as f:
        sums = dict(reversed(line.split()) for line in f if line.strip())
    assert sorted(sums) == sorted(n for n in os.listdir(DATA) if n.endswith('.pth'))
    for name, digest in sums.items():
        with open(osp.join(DATA, name), 'rb') as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, name


def test_expected_outputs_have_the_documented_shapes():
    soft = torch.load(osp.join(DATA, 'soft_public_expected.pth'))
    assert tuple(soft['input'].shape) == (1, 3, 128, 160)
    assert [tuple(soft[f'stage{i}'].shape)[1] for i in range(1, 5)] == [32, 64, 96, 128]
    sima = torch.load(osp.join(DATA, 'sima_public_expected.pth'))
    assert tuple(sima['input'].shape) == (1, 3, 96, 128)
    assert all(tuple(sima[f'block{i}'].shape) == (1, 64, 6, 8) for i in range(4))
