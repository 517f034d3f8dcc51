"""tools/: checkpoint conversion, mini dataset generation, the mini configs' data root, the
inputs of the analysis tools (images, checkpoints)."""
import json
import os.path as osp

import pytest
import torch
from conftest import ROOT, SOFT_FIXTURE_ARCH, data_path, load_tool, rel_err


def test_convert_soft_checkpoint(tmp_path):
    convert_checkpoint = load_tool('tools/model_converters/convert_checkpoint.py')
    from mmsoft.models import SOFT
    out = tmp_path / 'soft_backbone.pth'
    convert_checkpoint.main(['soft', data_path('soft_public_checkpoint.pth'), str(out)])
    ckpt = torch.load(out)  # plain weights_only load: nothing but tensors inside
    assert all(k.startswith('backbone.') for k in ckpt['state_dict'])
    assert not any(k.startswith('backbone.head.') for k in ckpt['state_dict'])
    model = SOFT(arch=SOFT_FIXTURE_ARCH, init_cfg=dict(type='Pretrained', checkpoint=str(out)))
    model.init_weights()
    expected = torch.load(data_path('soft_public_expected.pth'))
    with torch.no_grad():
        outs = model.eval()(expected['input'])
    assert rel_err(outs[0], expected['stage1']) <= 1e-4


def test_convert_sima_checkpoint(tmp_path):
    convert_checkpoint = load_tool('tools/model_converters/convert_checkpoint.py')
    out = tmp_path / 'sima_backbone.pth'
    convert_checkpoint.main(['xcit_sima', data_path('sima_public_checkpoint.pth'), str(out)])
    keys = torch.load(out)['state_dict'].keys()
    assert 'backbone.blocks.3.attn.qkv.weight' in keys
    assert not any('cls_attn' in k or k.startswith('backbone.head') for k in keys)


def test_mini_dataset_is_deterministic_and_valid(tmp_path):
    make_mini_dataset = load_tool('tools/misc/make_mini_dataset.py')
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


def test_load_image_tells_missing_corrupt_and_unknown_apart(tmp_path):
    from mmsoft.apis import inference
    with pytest.raises(FileNotFoundError, match='no such image file'):
        inference.load_image(str(tmp_path / 'missing.jpg'))
    corrupt = tmp_path / 'corrupt.png'
    corrupt.write_bytes(b'\x89PNG\r\n\x1a\n' + b'not really a png')
    with pytest.raises(ValueError, match='exists but is not a readable image'):
        inference.load_image(str(corrupt))
    with pytest.raises(ValueError, match='neither an image file nor a scikit-image sample'):
        inference.load_image('no_such_sample')
    # any other attribute of skimage.data is refused, not called (this one downloads)
    import skimage.data
    assert callable(skimage.data.download_all)
    with pytest.raises(ValueError, match='astronaut, camera'):
        inference.load_image('download_all')
    img = inference.load_image('coffee', 100)
    assert img.shape == (100, 150, 3) and img.dtype.name == 'uint8'
    from PIL import Image
    Image.fromarray(img).save(tmp_path / 'ok.png')
    assert (inference.load_image(str(tmp_path / 'ok.png')) == img).all()


def test_checkpoint_from_a_work_dir(tmp_path, monkeypatch):
    """--checkpoint WORK_DIR: the file its last_checkpoint names, also when the work dir
    was moved or the command runs elsewhere (last_checkpoint holds the training path)."""
    from mmsoft.apis import inference
    wd = tmp_path / 'work_dirs' / 'quickstart'
    wd.mkdir(parents=True)
    (wd / 'iter_400.pth').write_bytes(b'')
    (wd / 'last_checkpoint').write_text('work_dirs/quickstart/iter_400.pth')
    monkeypatch.chdir(tmp_path)
    assert inference.resolve_checkpoint('work_dirs/quickstart') == \
        'work_dirs/quickstart/iter_400.pth'
    monkeypatch.chdir(wd)
    assert inference.resolve_checkpoint('.') == './iter_400.pth'
    assert inference.resolve_checkpoint(None) is None
    with pytest.raises(FileNotFoundError, match='last_checkpoint'):
        inference.resolve_checkpoint(str(tmp_path))
    with pytest.raises(FileNotFoundError, match='no such checkpoint'):
        inference.resolve_checkpoint(str(tmp_path / 'nope.pth'))


@pytest.mark.parametrize('config', ['retinanet_soft-t_fpn_mini-coco.py',
                                    'upernet_soft-t_mini-ade.py'])
def test_mini_configs_find_their_data_through_mmsoft_data(config, monkeypatch):
    from mmengine.config import Config
    path = osp.join(ROOT, 'configs', '_mini_', config)
    monkeypatch.delenv('MMSOFT_DATA', raising=False)
    default = Config.fromfile(path)
    sub = 'mini_coco' if 'coco' in config else 'mini_ade'
    assert default.train_dataloader.dataset.data_root == f'data/{sub}/'  # as quickstart.sh
    monkeypatch.setenv('MMSOFT_DATA', '/somewhere/data')
    cfg = Config.fromfile(path)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        assert cfg[loader].dataset.data_root == f'/somewhere/data/{sub}/'
    if 'coco' in config:
        assert cfg.val_evaluator.ann_file == \
            '/somewhere/data/mini_coco/annotations/instances_val.json'
