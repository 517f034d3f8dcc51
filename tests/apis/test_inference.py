"""mmsoft.apis: a backbone or a whole model from a config and a checkpoint."""
import argparse
import logging
import os.path as osp

import pytest
import torch
from conftest import ROOT, SOFT_FIXTURE_ARCH, data_path, rel_err

MINI_DET = osp.join(ROOT, 'configs/_mini_/retinanet_soft-t_fpn_mini-coco.py')


def _levels(records):
    return {logging.getLevelName(r.levelno) for r in records}


def _fixture_backbone_config(tmp_path):
    cfg = tmp_path / 'soft.py'
    cfg.write_text(f"model = dict(backbone=dict(type='mmsoft.SOFT', arch={SOFT_FIXTURE_ARCH!r}))\n")
    return str(cfg)


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


def test_init_model_logs_warnings_only_unless_asked(tmp_path, mmengine_records):
    """mmengine logs one INFO record per initialized parameter (hundreds of lines on the
    console); init_model keeps them back unless log_level asks for them, still passes
    warnings on, and leaves the logger as it found it."""
    from mmengine.logging import print_log

    from mmsoft.apis import init_model
    logger, records = mmengine_records
    level, filters = logger.level, list(logger.filters)

    model = init_model(MINI_DET)
    assert not [r for r in records if r.levelno < logging.WARNING], _levels(records)

    # a checkpoint with a key the model does not have: mmengine warns, and that shows
    state = dict(model.state_dict(), not_a_parameter=torch.zeros(1))
    torch.save({'state_dict': state, 'meta': {}}, tmp_path / 'extra.pth')
    records.clear()
    init_model(MINI_DET, checkpoint=str(tmp_path / 'extra.pth'))
    assert any(r.levelno == logging.WARNING and 'not_a_parameter' in r.getMessage()
               for r in records)
    assert not [r for r in records if r.levelno < logging.WARNING], _levels(records)

    records.clear()
    init_model(MINI_DET, log_level='INFO')
    info = [r.getMessage() for r in records if r.levelno == logging.INFO]
    names = [n for n, _ in model.named_parameters()]
    assert any(name in message for message in info for name in names)  # the init log

    with pytest.raises(FileNotFoundError):  # fails while quiet: the logger is restored too
        init_model(MINI_DET, checkpoint=str(tmp_path / 'missing.pth'))
    with pytest.raises(ValueError, match='log_level'):
        init_model(MINI_DET, log_level='LOUD')

    assert (logger.level, logger.filters) == (level, filters)
    records.clear()
    print_log('after init_model', logger='current', level=logging.INFO)
    assert [r.getMessage() for r in records] == ['after init_model']


def test_init_backbone_reports_the_load_when_asked_and_tools_show_it(tmp_path,
                                                                      mmengine_records):
    from mmsoft.apis import init_backbone
    from mmsoft.apis.cli import backbone_from_args
    _, records = mmengine_records
    cfg, ckpt = _fixture_backbone_config(tmp_path), data_path('soft_public_checkpoint.pth')

    init_backbone(config=cfg, checkpoint=ckpt)
    assert not [r for r in records if r.levelno < logging.WARNING], _levels(records)

    def loaded_lines():
        return [r.getMessage() for r in records
                if r.levelno == logging.INFO and 'SOFT: loaded' in r.getMessage()]

    init_backbone(config=cfg, checkpoint=ckpt, log_level=logging.INFO)
    assert len(loaded_lines()) == 1
    # the tools say which keys a --checkpoint filled
    records.clear()
    backbone_from_args(argparse.Namespace(backbone=None, config=cfg, checkpoint=ckpt))
    assert len(loaded_lines()) == 1
