"""tools/analysis, tools/demo.py and tools/deployment: run on small inputs, check outputs."""
import csv
import math
import os.path as osp
import sys

import numpy as np
import pytest
import torch
from conftest import data_path
from PIL import Image

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
for sub in ('tools', 'tools/analysis', 'tools/deployment'):
    sys.path.insert(0, osp.join(ROOT, sub))



@pytest.fixture(scope='module')
def fixture_configs(tmp_path_factory):
    """Backbone configs of the two parity fixtures (tiny official-format checkpoints)."""
    d = tmp_path_factory.mktemp('cfg')
    (d / 'soft.py').write_text(
        "model = dict(backbone=dict(type='SOFT', arch=dict(embed_dims=[32, 64, 96, 128], "
        "num_heads=[1, 2, 3, 4], depths=[1, 1, 2, 1])))\n")
    (d / 'sima.py').write_text(
        "model = dict(backbone=dict(type='XCiTSimA', arch=dict(embed_dims=64, depth=4, "
        "num_heads=2, eta=1.0), out_indices=(0, 1, 2, 3)))\n")
    return {'soft': ['--config', str(d / 'soft.py'), '--checkpoint',
                     data_path('soft_public_checkpoint.pth')],
            'sima': ['--config', str(d / 'sima.py'), '--checkpoint',
                     data_path('sima_public_checkpoint.pth')]}


def test_soft_attention_maps(tmp_path, fixture_configs):
    import attention_maps
    written = attention_maps.main(fixture_configs['soft'] + [
        '--image', 'astronaut', '--size', '128', '--layer', 'block2.0.att.mha.attn',
        '--query', '0.3', '0.5', '--out-dir', str(tmp_path)])
    assert len(written) == 2  # one overlay per head (2 heads in stage 2)
    for p in written:
        img = np.asarray(Image.open(p))
        assert img.shape == (128, 128, 3) and img.std() > 0


def test_soft_attention_row_is_the_attention(fixture_configs):
    """The map equals the row of P·Â·Pᵀ computed explicitly, and differs by query."""
    from mmsoft import analysis
    model = analysis.build_backbone(config=fixture_configs['soft'][1],
                                    checkpoint=fixture_configs['soft'][3])
    x = analysis.to_tensor(analysis.load_image('coffee', 96))
    a = analysis.soft_attention_rows(model, x, 'block1.0.att.mha.attn', (0.2, 0.2))
    b = analysis.soft_attention_rows(model, x, 'block1.0.att.mha.attn', (0.8, 0.8))
    assert a.shape[:2] == (1, 1) and torch.isfinite(a).all()
    assert not torch.allclose(a, b)
    with pytest.raises(KeyError, match='choose from'):
        analysis.soft_attention_rows(model, x, 'block9.0', (0.5, 0.5))


def test_sima_token_importance_maps(tmp_path, fixture_configs):
    import attention_maps
    written = attention_maps.main(fixture_configs['sima'] + [
        '--image', 'chelsea', '--size', '96', '--layer', 'blocks.2.attn',
        '--out-dir', str(tmp_path)])
    assert len(written) == 6  # q and k: 2 heads + mean each
    assert all(osp.getsize(p) > 0 for p in written)


def test_newton_convergence_tool(tmp_path, fixture_configs):
    import newton_convergence
    res = newton_convergence.main(fixture_configs['soft'] + [
        '--images', 'astronaut', 'coffee', '--size', '96', '--sizes', '96', '160',
        '--iters', '12', '--out-dir', str(tmp_path)])
    rows = list(csv.DictReader(open(tmp_path / 'convergence.csv')))
    layers = {r['layer'] for r in rows}
    assert len(layers) == 4  # the fixture's SOFT layers: 1 + 1 + 2
    assert len(rows) == 4 * 2 * 13
    for layer in layers:
        errs = [float(r['relative_error']) for r in rows
                if r['layer'] == layer and r['image'] == 'astronaut']
        assert all(math.isfinite(e) and 0 <= e <= 1.5 for e in errs)
        assert errs[-1] < errs[0]
    norms = list(csv.DictReader(open(tmp_path / 'inverse_norm.csv')))
    assert all(float(r['norm_normalized_pinv']) < float(r['norm_pinv']) for r in norms)
    fig, fig2 = res['figures']
    assert len(fig.axes[0].get_lines()) == 4 and len(fig2.axes[0].get_lines()) == 2
    assert (tmp_path / 'convergence.png').exists() and (tmp_path / 'inverse_norm.png').exists()


def test_complexity_counts_the_attention():
    import complexity
    rows = complexity.main(['--backbone', 'SOFT:tiny', '--backbone', 'XCiTSimA:t12',
                            '--shape', '128', '128'])
    (_, _, p_soft, mm_soft, ours_soft), (_, _, p_x, mm_x, ours_x) = rows
    assert p_soft == pytest.approx(12.56e6, rel=0.01)
    assert ours_soft > mm_soft > 0  # the Newton iterations are added
    assert ours_x == mm_x > 0  # SimA is plain matmuls: nothing hidden


def test_complexity_of_a_config():
    import complexity
    cfg = osp.join(ROOT, 'configs/_mini_/retinanet_soft-t_fpn_mini-coco.py')
    (_, _, params, mm, ours), = complexity.main([cfg, '--shape', '128', '128'])
    assert params == pytest.approx(21.19e6, rel=0.01) and ours > mm > 0


def test_demo_writes_drawn_images(tmp_path):
    import demo

    import mmsoft  # noqa: F401
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmdet.registry import MODELS
    cfg_path = osp.join(ROOT, 'configs/_mini_/retinanet_soft-t_fpn_mini-coco.py')
    cfg = Config.fromfile(cfg_path)
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    model.init_weights()
    ckpt = tmp_path / 'model.pth'
    torch.save({'state_dict': model.state_dict(),
                'meta': {'dataset_meta': dict(classes=('rectangle', 'ellipse'))}}, ckpt)
    demo.main(['astronaut', cfg_path, str(ckpt), '--out-dir', str(tmp_path / 'out')])
    vis = tmp_path / 'out' / 'vis' / 'astronaut.png'
    assert vis.exists()
    assert np.asarray(Image.open(vis)).shape == (512, 512, 3)
    assert (tmp_path / 'out' / 'preds' / 'astronaut.json').exists()


@pytest.mark.parametrize('family', ['soft', 'sima'])
def test_onnx_export_matches_onnxruntime(tmp_path, fixture_configs, family):
    import export_onnx
    devs = export_onnx.main(fixture_configs[family] + [
        '--out', str(tmp_path / 'm.onnx'), '--check-sizes', '128x160', '97x131'])
    assert len(devs) == 2 and max(devs.values()) <= 1e-4


def test_tools_have_help(capsys):
    import attention_maps
    import complexity
    import demo
    import export_onnx
    import newton_convergence
    for tool in (attention_maps, newton_convergence, complexity, demo, export_onnx):
        with pytest.raises(SystemExit) as e:
            tool.main(['--help'])
        assert e.value.code == 0
    assert 'Example' in capsys.readouterr().out
