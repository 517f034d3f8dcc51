"""mmsoft.apis: a backbone or a whole model from a config and a checkpoint."""
import os.path as osp

import pytest
import torch
from conftest import ROOT, SOFT_FIXTURE_ARCH, data_path, rel_err

MINI_DET = osp.join(ROOT, 'configs/_mini_/retinanet_soft-t_fpn_mini-coco.py')


def test_init_model_loads_a_work_dirs_last_checkpoint(tmp_path):
    from mmsoft.apis import init_model
    trained = init_model(MINI_DET)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p))
    ckpt = tmp_path / 'iter_7.pth'
    torch.save({'state_dict': trained.state_dict(), 'meta': {}}, ckpt)
    (tmp_path / 'last_checkpoint').write_text(str(ckpt))
    loaded = init_model(MINI_DET, checkpoint=str(tmp_path)).state_dict()
    fresh = init_model(MINI_DET).state_dict()
    for k, v in trained.state_dict().items():
        assert torch.equal(loaded[k], v), k  # a copy: exact
    assert any(not torch.equal(fresh[k], v) for k, v in trained.state_dict().items())


def test_init_backbone_from_a_spec_or_a_config(tmp_path):
    from mmsoft.apis import init_backbone
    from mmsoft.models import SOFT, XCiTSimA
    assert isinstance(init_backbone('XCiTSimA:t12'), XCiTSimA)
    cfg = tmp_path / 'soft.py'
    cfg.write_text(f"model = dict(backbone=dict(type='mmsoft.SOFT', arch={SOFT_FIXTURE_ARCH!r},"
                   " norm_cfg=dict(type='SyncBN')))\n")
    model = init_backbone(config=str(cfg), checkpoint=data_path('soft_public_checkpoint.pth'))
    assert isinstance(model, SOFT) and not model.training
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
    expected = torch.load(data_path('soft_public_expected.pth'))
    with torch.no_grad():
        out = model(expected['input'])
    assert rel_err(out[0], expected['stage1']) < 1e-5  # the fixture's weights were loaded
    families = r"FAMILY:ARCH with FAMILY one of \['SOFT', 'XCiTSimA'\]"
    with pytest.raises(ValueError, match=families):
        init_backbone('ResNet:50')
    (tmp_path / 'resnet.py').write_text("model = dict(backbone=dict(type='ResNet', depth=50))\n")
    with pytest.raises(ValueError, match="'ResNet', not an mmsoft backbone"):
        init_backbone(config=str(tmp_path / 'resnet.py'))
