"""tools/: checkpoint conversion, mini dataset generation, checkpoint safety."""
import json
import os
import os.path as osp
import pickle
import sys

import pytest
import torch
from conftest import data_path, rel_err

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.join(ROOT, 'tools'))


def test_convert_soft_checkpoint(tmp_path):
    import convert_checkpoint
    from mmsoft.models import SOFT
    out = tmp_path / 'soft_backbone.pth'
    convert_checkpoint.main(['soft', data_path('soft_public_checkpoint.pth'), str(out)])
    ckpt = torch.load(out)  # plain weights_only load: nothing but tensors inside
    assert all(k.startswith('backbone.') for k in ckpt['state_dict'])
    assert not any(k.startswith('backbone.head.') for k in ckpt['state_dict'])
    arch = dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4], depths=[1, 1, 2, 1])
    model = SOFT(arch=arch, init_cfg=dict(type='Pretrained', checkpoint=str(out)))
    model.init_weights()
    expected = torch.load(data_path('soft_public_expected.pth'))
    with torch.no_grad():
        outs = model.eval()(expected['input'])
    assert rel_err(outs[0], expected['stage1']) <= 1e-4


def test_convert_sima_checkpoint(tmp_path):
    import convert_checkpoint
    out = tmp_path / 'sima_backbone.pth'
    convert_checkpoint.main(['xcit_sima', data_path('sima_public_checkpoint.pth'), str(out)])
    keys = torch.load(out)['state_dict'].keys()
    assert 'backbone.blocks.3.attn.qkv.weight' in keys
    assert not any('cls_attn' in k or k.startswith('backbone.head') for k in keys)


def test_mini_dataset_is_deterministic_and_valid(tmp_path):
    import make_mini_dataset
    for name in ('a', 'b'):
        make_mini_dataset.main(['--out', str(tmp_path / name), '--train', '6', '--val', '2'])
    ann_a = (tmp_path / 'a/mini_coco/annotations/instances_train.json').read_text()
    ann_b = (tmp_path / 'b/mini_coco/annotations/instances_train.json').read_text()
    assert ann_a == ann_b
    coco = json.loads(ann_a)
    assert len(coco['images']) == 6 and coco['annotations']
    assert {c['name'] for c in coco['categories']} == {'rectangle', 'ellipse'}
    for a in coco['annotations']:
        x, y, w, h = a['bbox']
        assert 0 <= x and 0 <= y and x + w <= 128 and y + h <= 128 and a['area'] > 0
    from PIL import Image
    import numpy as np
    label = np.array(Image.open(
        tmp_path / 'a/mini_ade/annotations/training/train_00000.png'))
    assert set(np.unique(label)) <= {1, 2, 3} and len(np.unique(label)) >= 2


class _RunsShell:
    """A pickle payload that would run a shell command when unpickled unsafely."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}', ))


def _crafted_checkpoint(tmp_path):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {'backbone.x': torch.zeros(1)},
                'meta': _RunsShell(marker)}, path)
    return path, marker


def test_malicious_checkpoint_is_refused_by_init_cfg(tmp_path):
    from mmsoft.models import SOFT
    path, marker = _crafted_checkpoint(tmp_path)
    model = SOFT(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(pickle.UnpicklingError):
        model.init_weights()
    assert not marker.exists()


def test_malicious_checkpoint_is_refused_by_load_from(tmp_path):
    import mmsoft  # noqa: F401
    from mmengine.runner import load_checkpoint
    path, marker = _crafted_checkpoint(tmp_path)
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(torch.nn.Linear(1, 1), str(path))
    assert not marker.exists()


def test_mmengine_checkpoint_globals_are_allow_listed():
    """What a real mmengine checkpoint pickles loads under weights_only=True."""
    import numpy as np
    import mmsoft  # noqa: F401
    from mmengine.logging import HistoryBuffer
    import io
    buf = HistoryBuffer()
    buf.update(1.5)
    obj = {'message_hub': {'log_scalars': {'loss': buf}},
           'arr': np.arange(3, dtype=np.float32), 'scalar': np.float64(2.0),
           'stat': getattr(HistoryBuffer, 'mean')}
    f = io.BytesIO()
    torch.save(obj, f)
    f.seek(0)
    loaded = torch.load(f)  # weights_only=True is torch's default
    assert loaded['message_hub']['log_scalars']['loss'].current() == 1.5
    assert loaded['arr'].tolist() == [0, 1, 2]
