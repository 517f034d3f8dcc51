"""tools/analysis_tools, tools/misc/demo.py and tools/deployment: run on small inputs,
check outputs."""
import csv
import logging
import math
import os.path as osp

import numpy as np
import pytest
import torch
from conftest import (ROOT, SIMA_FIXTURE_ARCH, SOFT_FIXTURE_ARCH, data_path, load_tool,
                      untrained_checkpoint)


MINI_DET = osp.join(ROOT, 'configs/_mini_/retinanet_soft-t_fpn_mini-coco.py')


@pytest.fixture(scope='module')
def fixture_configs(tmp_path_factory):
    """Backbone configs of the two parity fixtures (tiny official-format checkpoints)."""
    d = tmp_path_factory.mktemp('cfg')
    (d / 'soft.py').write_text(
        f"model = dict(backbone=dict(type='SOFT', arch={SOFT_FIXTURE_ARCH!r}))\n")
    (d / 'sima.py').write_text(
        f"model = dict(backbone=dict(type='XCiTSimA', arch={SIMA_FIXTURE_ARCH!r}, "
        "tap_blocks=(0, 1, 2, 3)))\n")
    return {'soft': ['--config', str(d / 'soft.py'), '--checkpoint',
                     data_path('soft_public_checkpoint.pth')],
            'sima': ['--config', str(d / 'sima.py'), '--checkpoint',
                     data_path('sima_public_checkpoint.pth')]}


def _colorbar_axes(fig):
    """The axes of the figure's colorbars (matplotlib tags them with ``_colorbar``), also
    those inset in another axes."""
    axes = fig.axes + [child for ax in fig.axes for child in ax.child_axes]
    return [ax for ax in axes if getattr(ax, '_colorbar', None) is not None]


def test_soft_attention_maps_explain_themselves(tmp_path, fixture_configs):
    """One figure per head: title with model, weights, layer, head and query; a colorbar;
    a marker at the query token's centre."""
    attention_maps = load_tool('tools/analysis_tools/attention_maps.py')
    written = attention_maps.main(fixture_configs['soft'] + [
        '--image', 'astronaut', '--size', '128', '--layer', 'block2.0.att.mha.attn',
        '--query', '0.3', '0.5', '--out-dir', str(tmp_path)])
    assert len(written) == 2  # one figure per head (2 heads in stage 2)
    for h, (path, fig) in enumerate(written.items()):
        assert osp.getsize(path) > 0
        image_ax = fig.axes[0]
        title = image_ax.get_title()
        for part in ('soft', 'soft_public_checkpoint.pth', 'astronaut',
                     'block2.0.att.mha.attn', f'head {h}', '(0.30, 0.50)'):
            assert part in title
        cbars = _colorbar_axes(fig)
        assert len(cbars) == 1 and 'attention weight' in cbars[0].get_ylabel()
        # stage 2 of a 128² input: a 16×16 grid; query (0.3, 0.5) is token (4, 8), whose
        # centre is at pixel ((4 + 0.5) * 8, (8 + 0.5) * 8)
        markers = [line for line in image_ax.get_lines() if line.get_marker() == '+']
        assert markers
        for line in markers:
            assert (line.get_xdata()[0], line.get_ydata()[0]) == (68., 36.)


def test_analysis_tools_say_random_weights(tmp_path, fixture_configs, caplog):
    """No --checkpoint: a warning in the log and 'RANDOM WEIGHTS' in every title; SimA also
    warns that random maps show the padded border."""
    attention_maps = load_tool('tools/analysis_tools/attention_maps.py')
    newton_convergence = load_tool('tools/analysis_tools/newton_convergence.py')
    caplog.set_level(logging.WARNING, logger='mmsoft.tools')
    soft_cfg, sima_cfg = fixture_configs['soft'][:2], fixture_configs['sima'][:2]
    written = attention_maps.main(soft_cfg + ['--image', 'coffee', '--size', '96',
                                              '--out-dir', str(tmp_path / 'a')])
    assert all('RANDOM WEIGHTS' in fig.axes[0].get_title() for fig in written.values())
    assert 'RANDOM WEIGHTS (no --checkpoint)' in caplog.text
    caplog.clear()
    written = attention_maps.main(sima_cfg + ['--image', 'coffee', '--size', '96',
                                              '--out-dir', str(tmp_path / 'b')])
    assert all('RANDOM WEIGHTS' in fig.axes[0].get_title() for fig in written.values())
    assert 'light up a border' in caplog.text
    caplog.clear()
    res = newton_convergence.main(soft_cfg + ['--images', 'coffee', '--size', '96', '--sizes',
                                              '96', '--iters', '2', '--out-dir',
                                              str(tmp_path / 'c')])
    assert all('RANDOM WEIGHTS' in fig.axes[0].get_title() for fig in res['figures'])
    assert 'RANDOM WEIGHTS' in caplog.text


def test_soft_attention_row_is_the_attention(fixture_configs):
    """The map equals the row of P·Â·Pᵀ computed explicitly: q from the layer's input,
    scaled by d^(-1/4), P and A from pairwise distances, Â = D^-1/2·A⁺·D^-1/2 with an SVD
    pseudo-inverse, the full N×N matrix formed (N = 96 here)."""
    from mmsoft import analysis
    from mmsoft.apis import init_backbone, load_image, to_tensor
    model = init_backbone(config=fixture_configs['soft'][1],
                          checkpoint=fixture_configs['soft'][3])
    x = to_tensor(load_image('coffee', 64))  # 64×96: stage 2 runs on an 8×12 grid
    layer = 'block2.0.att.mha.attn'
    got = analysis.soft_attention_rows(model, x, layer, (0.2, 0.7))

    seen = {}
    mha = model.get_submodule('block2.0.att.mha')
    handle = mha.register_forward_hook(lambda m, inp, out: seen.update(x=inp[0], hw=inp[1]))
    with torch.no_grad():
        model(x)
        handle.remove()
        tokens, (H, W) = seen['x'], seen['hw']
        B, N, C = tokens.shape
        h = mha.num_heads
        d = C // h
        q = mha.W_q(tokens).reshape(B, N, h, d).transpose(1, 2) / d**0.25
        lm = mha.attn.landmarks(q, (H, W))
    q, lm = q.double(), lm.double()
    P = torch.exp(-torch.cdist(q, lm)**2 / 2)  # (B, h, N, m)
    A = torch.exp(-torch.cdist(lm, lm)**2 / 2)  # (B, h, m, m)
    d_inv_sqrt = A.sum(-1).rsqrt()
    A_hat = d_inv_sqrt[..., :, None] * torch.linalg.pinv(A) * d_inv_sqrt[..., None, :]
    M = P @ A_hat @ P.transpose(-1, -2)  # (B, h, N, N)
    assert (H, W) == (8, 12) and M.shape == (1, 2, 96, 96)
    i, j = int(0.2 * H), int(0.7 * W)  # the query token
    expected = M[:, :, i * W + j, :].reshape(B, h, H, W)
    assert got.shape == expected.shape
    assert ((got.double() - expected).abs().max() / expected.abs().max()).item() < 1e-4

    other = analysis.soft_attention_rows(model, x, layer, (0.8, 0.1))
    assert not torch.allclose(got, other)
    with pytest.raises(KeyError, match='choose from'):
        analysis.soft_attention_rows(model, x, 'block9.0', (0.5, 0.5))


def test_sima_token_importance_maps(tmp_path, fixture_configs):
    attention_maps = load_tool('tools/analysis_tools/attention_maps.py')
    written = attention_maps.main(fixture_configs['sima'] + [
        '--image', 'chelsea', '--size', '96', '--layer', 'blocks.2.attn',
        '--out-dir', str(tmp_path)])
    assert len(written) == 6  # q and k: 2 heads + mean each
    titles = [fig.axes[0].get_title() for fig in written.values()]
    assert sum('mean over heads' in t for t in titles) == 2
    assert all('blocks.2.attn' in t and 'sima_public_checkpoint.pth' in t for t in titles)
    assert all(len(_colorbar_axes(fig)) == 1 for fig in written.values())
    assert all(osp.getsize(p) > 0 for p in written)


def test_newton_convergence_tool(tmp_path, fixture_configs):
    newton_convergence = load_tool('tools/analysis_tools/newton_convergence.py')
    res = newton_convergence.main(fixture_configs['soft'] + [
        '--images', 'astronaut', 'coffee', '--size', '96', '--sizes', '96', '160', '224',
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
    boundary = list(csv.DictReader(open(tmp_path / 'boundary.csv')))
    assert len(boundary) == 4 * 2 == len(res['boundary'])
    assert all(0 < float(r['max_alpha_lambda2']) <= 2 + 1e-9
               and 0 <= float(r['worst_shortfall']) <= 1 for r in boundary)
    assert all(float(r['first_step_bound']) >= float(r['max_alpha_lambda2']) for r in boundary)
    fig, fig2 = res['figures']
    assert len(fig.axes[0].get_lines()) == 4 and len(fig2.axes[0].get_lines()) == 2
    assert (tmp_path / 'convergence.png').exists() and (tmp_path / 'inverse_norm.png').exists()
    # the iteration axis has integer ticks, also for few iterations (matplotlib's default
    # puts ticks at 0.25, 0.5, ... for 2); the log axes of Fig. 5b label no minor tick
    few = newton_convergence.convergence_figure({'layer': [[1., .1, .01]]}, 2, 'title')
    for f, iters in ((fig, 12), (few, 2)):
        f.canvas.draw()
        ticks = [t for t in f.axes[0].get_xticks() if 0 <= t <= iters]
        assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks)
    fig2.canvas.draw()
    for axis in (fig2.axes[0].xaxis, fig2.axes[0].yaxis):
        assert all(t.get_text() == '' for t in axis.get_ticklabels(minor=True))
        assert any(t.get_text() for t in axis.get_ticklabels())


# One SOFT kernel-attention layer counted by hand (MACs, batch 1, T = 20 Newton steps):
#   core per head  3·N·m·d (P = κ(Q, Q̃), Pᵀ·V, P·(…)) + 2·m²·d (A, Â·(Pᵀ·V))
#                  + m³ (A·A for α) + 2·T·m³ (the iterations)
#   landmark conv  h·m·d·d·r² (a d→d conv, r×r kernel, stride r, on each head's map)
#   depthwise conv d·h·N·k² (one k×k filter per head, on each of the d channels)
# The fixture SOFT (head dim 32) at 64×64: stage 1 a 16×16 grid, r = 8, k = 9; stage 2 8×8,
# r = 4, k = 5, 2 heads; stage 3 4×4, r = 2, k = 3, 3 heads; m = 2×2 = 4 in every stage.
HAND_MACS = {
    'block1.0.att.mha.attn': (3 * 256 * 4 * 32 + 2 * 16 * 32 + 41 * 64) * 1
    + 1 * 4 * 32 * 32 * 64 + 32 * 1 * 256 * 81,
    'block2.0.att.mha.attn': (3 * 64 * 4 * 32 + 2 * 16 * 32 + 41 * 64) * 2
    + 2 * 4 * 32 * 32 * 16 + 32 * 2 * 64 * 25,
    'block3.0.att.mha.attn': (3 * 16 * 4 * 32 + 2 * 16 * 32 + 41 * 64) * 3
    + 3 * 4 * 32 * 32 * 4 + 32 * 3 * 16 * 9,
}
HAND_MACS['block3.1.att.mha.attn'] = HAND_MACS['block3.0.att.mha.attn']


def test_complexity_matches_a_hand_count():
    complexity = load_tool('tools/analysis_tools/complexity.py')
    from mmengine.analysis import FlopAnalyzer

    from mmsoft.models import SOFT
    model = SOFT(arch=SOFT_FIXTURE_ARCH).eval()
    x = torch.randn(1, 3, 64, 64)
    params, mm, ours, layers = complexity.count(model, x)
    assert layers == HAND_MACS
    assert HAND_MACS['block1.0.att.mha.attn'] == 1_027_648
    # the total: mmengine's count with each layer's own count replaced by the hand count
    analyzer = FlopAnalyzer(model, x)
    analyzer.unsupported_ops_warnings(False)
    with torch.no_grad():
        by_module = analyzer.by_module()
    assert ours == mm + sum(HAND_MACS[n] - by_module[n] for n in HAND_MACS)
    assert params == sum(p.numel() for p in model.parameters())

    # bounded landmarks: one landmark per head (queries pooled to r×r, one r×r window)
    bounded = SOFT(arch=SOFT_FIXTURE_ARCH, landmark_grid=1).eval()
    layers = complexity.count(bounded, x)[3]
    assert layers['block1.0.att.mha.attn'] == ((3 * 256 * 32 + 2 * 32 + 41) * 1
                                               + 1 * 1 * 32 * 32 * 64 + 32 * 1 * 256 * 81)


def test_complexity_of_backbones_and_a_config():
    complexity = load_tool('tools/analysis_tools/complexity.py')
    rows = complexity.main(['--backbone', 'SOFT:tiny', '--backbone', 'XCiTSimA:t12',
                            '--config', MINI_DET, '--shape', '128', '128'])
    (_, _, p_soft, mm_soft, ours_soft), (_, _, p_x, mm_x, ours_x), (_, _, p_det, mm_det,
                                                                  ours_det) = rows
    assert p_soft == pytest.approx(12.56e6, rel=0.01)
    assert ours_soft > mm_soft > 0  # the Newton iterations are added
    assert ours_x == mm_x > 0  # SimA is plain matmuls: nothing hidden
    # the whole detector: backbone, neck and head (PyTorch's own count of the model the
    # config builds), more than the backbone
    from mmsoft.apis import init_model
    assert p_det == sum(p.numel() for p in init_model(MINI_DET).parameters()) > p_soft
    assert ours_det > mm_det > 0


def test_complexity_keeps_log_lines_off_the_console(tmp_path, capfd):
    """The models' log lines (mmengine's per-parameter init notices) go to --log-file; the
    console shows the progress and the results."""
    from mmengine.logging import MMLogger
    # mmengine's current logger as in a fresh process: a Runner of an earlier test leaves
    # one with a log file, to which init_weights then writes its notices directly
    MMLogger.get_instance(f'complexity-{tmp_path.name}')
    complexity = load_tool('tools/analysis_tools/complexity.py')
    log = tmp_path / 'complexity.log'
    complexity.main(['--config', MINI_DET, '--shape', '64', '64', '--log-file', str(log)])
    out, err = capfd.readouterr()
    assert 'Initialized by' not in out + err
    assert out.strip().startswith('configs/_mini_/retinanet_soft-t_fpn_mini-coco.py: input')
    assert 'counting' in err and str(log) in err
    assert log.read_text().count('Initialized by') > 10


def test_demo_on_the_mini_sets_own_images(tmp_path, monkeypatch):
    """Without IMAGE the demo runs on the config's test images (found through
    $MMSOFT_DATA); titles say the config, the weights and the image."""
    demo = load_tool('tools/misc/demo.py')
    make_mini_dataset = load_tool('tools/misc/make_mini_dataset.py')
    make_mini_dataset.main(['--out', str(tmp_path / 'data'), '--train', '1', '--val', '3'])
    monkeypatch.setenv('MMSOFT_DATA', str(tmp_path / 'data'))
    ckpt = untrained_checkpoint(MINI_DET, tmp_path / 'model.pth')
    res = demo.main(['--config', MINI_DET, '--checkpoint', ckpt, '--out-dir',
                     str(tmp_path / 'out'), '--score-thr', '0'])
    assert sorted(res['figures']) == ['val_00000', 'val_00001', 'val_00002']
    for stem, fig in res['figures'].items():
        title = fig.get_suptitle()
        assert 'retinanet_soft-t_fpn_mini-coco' in title and 'model.pth' in title
        assert f'{stem}.png' in title
        assert (tmp_path / 'out' / 'vis' / f'{stem}.png').exists()
        assert (tmp_path / 'out' / 'preds' / f'{stem}.json').exists()
    # a photo is said to be one
    res = demo.main(['astronaut', '--config', MINI_DET, '--out-dir', str(tmp_path / 'out')])
    title = res['figures']['astronaut'].get_suptitle()
    assert 'a photo of a person' in title and 'RANDOM WEIGHTS' in title
    assert 'classes: rectangle, ellipse' in title


def test_demo_points_the_old_positional_form_to_the_options(capsys):
    demo = load_tool('tools/misc/demo.py')
    with pytest.raises(SystemExit):
        demo.main(['astronaut', MINI_DET, 'work_dirs/quickstart/iter_400.pth'])
    assert f'--config {MINI_DET}' in capsys.readouterr().err


def test_demo_labels_stay_inside_and_apart():
    """Labels of boxes at the image edges and of overlapping boxes: inside the image and
    not overlapping each other."""
    demo = load_tool('tools/misc/demo.py')
    image = np.zeros((128, 128, 3), np.uint8)
    fig, ax, scale = demo._canvas(image, 1)
    boxes = [(0, 0, 40, 30), (2, 3, 42, 33), (100, 0, 128, 20), (90, 100, 128, 128),
             (0, 110, 20, 128), (60, 60, 70, 70), (61, 61, 71, 71)]
    spots = demo.place_labels(ax, scale, boxes, ['rectangle 0.99'] * len(boxes),
                              ['C0'] * len(boxes))
    for x0, y0, x1, y1 in spots:
        assert 0 <= x0 < x1 <= 128 and 0 <= y0 < y1 <= 128
    for i, a in enumerate(spots):
        for b in spots[i + 1:]:
            assert not demo._overlaps(a, b), (a, b)
    # the drawn text lies inside the image too
    renderer = fig.canvas.get_renderer()
    img_box = ax.get_window_extent(renderer)
    for t in ax.texts:
        box = t.get_window_extent(renderer)
        assert img_box.x0 <= box.x0 and box.x1 <= img_box.x1 + 0.5
        assert img_box.y0 <= box.y0 and box.y1 <= img_box.y1 + 0.5


@pytest.mark.parametrize('family', ['soft', 'sima'])
def test_onnx_export_matches_onnxruntime(tmp_path, fixture_configs, family):
    export_onnx = load_tool('tools/deployment/export_onnx.py')
    devs = export_onnx.main(fixture_configs[family] + [
        '--out', str(tmp_path / 'm.onnx'), '--check-sizes', '128x160', '97x131'])
    assert len(devs) == 2 and max(devs.values()) <= 1e-4


def test_tools_have_help(capsys):
    attention_maps = load_tool('tools/analysis_tools/attention_maps.py')
    complexity = load_tool('tools/analysis_tools/complexity.py')
    demo = load_tool('tools/misc/demo.py')
    export_onnx = load_tool('tools/deployment/export_onnx.py')
    newton_convergence = load_tool('tools/analysis_tools/newton_convergence.py')
    pinv_accuracy = load_tool('tools/analysis_tools/pinv_accuracy.py')
    for tool in (attention_maps, newton_convergence, complexity, demo, export_onnx,
                 pinv_accuracy):
        with pytest.raises(SystemExit) as e:
            tool.main(['--help'])
        assert e.value.code == 0
    out = capsys.readouterr().out
    assert 'Example' in out
    assert 'takes about' in out  # complexity --all-configs says how long it runs


def test_newton_boundary_sees_landmarks_far_apart(monkeypatch):
    """analysis.newton_boundary on landmarks the test places: far apart (A ≈ I, the
    official α puts λ_max at αλ² ≈ 2 and the iterate falls short there) and close
    together (every direction either converged or below αλ² = 1)."""
    import torch

    from mmsoft import analysis
    g = torch.Generator().manual_seed(0)
    far = torch.randn(1, 2, 48, 32, generator=g) * (40 / 32)**0.5
    near = torch.randn(1, 2, 48, 32, generator=g) * 0.3
    monkeypatch.setattr(analysis, 'soft_attention_inputs',
                        lambda model, x: {'far': (None, None, far, None),
                                          'near': (None, None, near, None)})
    res = analysis.newton_boundary(None, None)
    assert res['far']['max_alpha_lambda2'] > 1.9 and res['far']['near_share'] > 0
    assert res['far']['worst_shortfall'] > 0.1  # the iterate misses 1/λ by > 10 %
    assert res['near']['max_alpha_lambda2'] < 1.9 and res['near']['near_share'] == 0
    assert res['near']['worst_shortfall'] < 1e-6
    # the row sums' bound on αλ², above the largest one: above 1 far apart, at most 1
    # (every eigenvalue proven far from the boundary) close together
    for r in res.values():
        assert r['first_step_bound'] >= r['max_alpha_lambda2']
    assert res['far']['first_step_bound'] > 1 >= res['near']['first_step_bound']


def test_newton_boundary_finds_a_tie_in_alphas_choice(monkeypatch):
    """``alpha_margin``: landmarks at a tie of ``newton_alpha``'s choice (``alpha_tie``)
    sit within float32 rounding of its bound; the same landmarks spread 10 % wider
    do not."""
    import torch

    from mmsoft import analysis
    from conftest import alpha_tie
    tie = alpha_tie()[0].float()[None, None]  # (1, 1, m, d), as a layer records them
    monkeypatch.setattr(analysis, 'soft_attention_inputs',
                        lambda model, x: {'tie': (None, None, tie, None),
                                          'wider': (None, None, tie * 1.1, None)})
    res = analysis.newton_boundary(None, None)
    assert res['tie']['alpha_margin'] < 1e-6
    assert res['wider']['alpha_margin'] > 1e-4


def test_pinv_accuracy_tool(capsys, monkeypatch):
    """tools/analysis_tools/pinv_accuracy.py: a row per kernel, size and seed with the
    official float32 iteration's deviation, the bound and each path's deviation; the paths
    a plan may take within the bound; every step applied thin beyond it on a boundary
    kernel (marked '>')."""
    pinv_accuracy = load_tool('tools/analysis_tools/pinv_accuracy.py')
    rows = pinv_accuracy.main(['--kinds', 'clustered', 'near_rank1', '--sizes', '64',
                               '--seeds', '0', '1'])
    assert [(r['kind'], r['seed']) for r in rows] == [('clustered', 0), ('clustered', 1),
                                                     ('near_rank1', 0), ('near_rank1', 1)]
    for r in rows:
        assert 0 < r['floor'] < 1e-3 and r['bound'] == 1e-3
        for path in ('iterative', 'spectral', 'tf32', "tf32, CUDA's plan, last steps thin"):
            for step in ('inference', 'training'):
                assert r[f'{path} {step}'] <= r['bound'], (r['kind'], path, step)
    out = capsys.readouterr().out
    assert '| clustered | 64 | 0 |' in out and 'worst, as a share of the bound:' in out
    assert '| >' not in out
    # a path beyond the bound is marked: every step thin, on a boundary kernel (no plan's)
    from mmsoft import testing
    from mmsoft.models.attention import Variant
    from mmsoft.models.attention.newton import _NewtonPinvThin

    class EveryStepThin(Variant):
        name = 'every step thin'

        def apply(self, A, Z, iters):
            schedule = ((0, 'float32'), (0, 'tf32'), (iters, 'float32'))
            return _NewtonPinvThin.apply(A, Z, schedule, 1, iters, False, True)

    monkeypatch.setitem(testing.PINV_PATHS, 'every step thin', EveryStepThin())
    rows = pinv_accuracy.main(['--kinds', 'boundary', '--sizes', '196', '--paths',
                               'iterative', 'every step thin'])
    assert rows[0]['every step thin inference'] > rows[0]['bound']
    assert '| >' in capsys.readouterr().out


def test_fidelity_tool_crops_and_seeds(capsys):
    """fidelity.py --crop measures the window of the resized image, --seed the random
    weights it names (two seeds, two models); a window outside the image is refused."""
    fidelity = load_tool('tools/analysis_tools/fidelity.py')
    args = ['--size', '96x128', '--images', 'blank', '--paths', 'official', '--gradients',
            '--gradient-images', 'blank']
    runs = [fidelity.main(args + ['--crop', '0,32,64,96', '--seed', str(s)]) for s in (0, 1)]
    assert [r['crop'] for r in runs] == [(0, 32, 64, 96)] * 2
    assert [r['seed'] for r in runs] == [0, 1]
    assert 'seed 1) at 96×128, cropped to 64×96 at (0, 32)' in capsys.readouterr().out
    grads = [r['gradients']['blank']['official'] for r in runs]
    assert grads[0]['gradients'] != grads[1]['gradients']
    assert all(g['beyond_rounding'] == 0 for g in grads)
    with pytest.raises(SystemExit):
        fidelity.main(args + ['--crop', '40,0,64,96'])
    assert 'does not fit in the 96×128 image' in capsys.readouterr().err
