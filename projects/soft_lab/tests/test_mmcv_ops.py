"""projects/soft_lab/gpu/mmcv_ops.py: the ops the GPU call serves to mmcv in place of its
compiled ones, held to mmcv's compiled CPU ops (nms, RoIAlign) and to mmdet's own PyTorch
focal loss, by both routes (torchvision, and PyTorch where torchvision is not used)."""
import json
import os.path as osp
import subprocess
import sys

import pytest
import torch

from projects.soft_lab.gpu import mmcv_ops

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
try:  # mmcv's compiled ops, the reference (mmcv-lite, as on the GPU machine, has none)
    import mmcv._ext as compiled
    COMPILED = compiled.__file__.endswith(('.so', '.pyd'))
except ImportError:
    COMPILED = False
needs_compiled = pytest.mark.skipif(not COMPILED, reason="needs mmcv's compiled ops")


def _boxes(n, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=dtype) * 100
    wh = torch.rand(n, 2, generator=g, dtype=dtype) * 40 + 1
    return torch.cat([xy, xy + wh], 1), torch.rand(n, generator=g, dtype=dtype)


@needs_compiled
@pytest.mark.parametrize('offset', [0, 1])
@pytest.mark.parametrize('threshold', [0.3, 0.5, 0.7])
def test_nms_keeps_what_mmcv_keeps(offset, threshold):
    """The same boxes kept, in the same order (distinct scores: no tie to break), by the
    PyTorch route and by the served op (torchvision at offset 0, PyTorch at 1)."""
    for seed in range(3):
        boxes, scores = _boxes(300, seed)
        ref = compiled.nms(boxes, scores, iou_threshold=threshold, offset=offset)
        assert 0 < len(ref) < len(boxes)  # some suppressed, some kept
        assert torch.equal(mmcv_ops.nms_pytorch(boxes, scores, threshold, offset), ref)
        assert torch.equal(mmcv_ops.nms(boxes, scores, threshold, offset), ref)
    empty = torch.zeros(0, 4)
    assert mmcv_ops.nms_pytorch(empty, torch.zeros(0), 0.5).shape == (0, )


@needs_compiled
def test_nms_follows_a_chain_of_suppressions():
    """A suppressed box suppresses nothing: in a row of boxes each overlapping the next,
    every other one is kept (the fixed point after as many rounds as the chain is long)."""
    x = torch.arange(12, dtype=torch.float32) * 5
    boxes = torch.stack([x, torch.zeros(12), x + 10, torch.full((12, ), 10.)], 1)
    scores = torch.linspace(1, 0.1, 12)
    ref = compiled.nms(boxes, scores, iou_threshold=0.3, offset=0)
    assert ref.tolist() == list(range(0, 12, 2))
    assert torch.equal(mmcv_ops.nms_pytorch(boxes, scores, 0.3), ref)


def _rois(K, seed, n_images=2, size=(23, 31), scale=0.25):
    """RoIs (K, 5) on images of ``size`` / ``scale`` pixels: some reaching past the border,
    one of zero size."""
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0, n_images, (K, 1), generator=g).double()
    H, W = size[0] / scale, size[1] / scale
    start = torch.rand(K, 2, generator=g, dtype=torch.float64) * torch.tensor([W, H]) - 10
    extent = torch.rand(K, 2, generator=g, dtype=torch.float64) * 60
    rois = torch.cat([b, start, start + extent], 1)
    rois[0, 1:] = 5.0
    return rois


@needs_compiled
@pytest.mark.parametrize('aligned', [True, False])
@pytest.mark.parametrize('sampling_ratio', [0, 2])
def test_roi_align_matches_mmcv(aligned, sampling_ratio):
    """Forward and backward of RoIAlign (average pooling) as mmcv's compiled op computes
    them, in float64 (so the sums' order leaves < 1e-13), by the PyTorch route and by the
    served op (torchvision's kernels)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 23, 31, generator=g, dtype=torch.float64)
    rois = _rois(40, 1)
    opts = dict(aligned_height=7, aligned_width=6, spatial_scale=0.25,
                sampling_ratio=sampling_ratio, pool_mode=1, aligned=aligned)
    none = x.new_zeros(0)
    ref = x.new_zeros(40, 5, 7, 6)
    compiled.roi_align_forward(x, rois, ref, none, none, **opts)
    grad = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    ref_grad = torch.zeros_like(x)
    compiled.roi_align_backward(grad, rois, none, none, ref_grad, **opts)
    assert ref.abs().max() > 1 and ref_grad.abs().max() > 1
    args = ((7, 6), 0.25, sampling_ratio, aligned)
    assert (mmcv_ops.roi_align_pytorch(x, rois, *args) - ref).abs().max() < 1e-13
    assert (mmcv_ops.roi_align_backward_pytorch(grad, rois, tuple(x.shape), *args[1:])
            - ref_grad).abs().max() < 1e-13
    served, served_grad = torch.zeros_like(ref), torch.zeros_like(x)
    mmcv_ops.roi_align_forward(x, rois, served, none, none, **opts)
    mmcv_ops.roi_align_backward(grad, rois, none, none, served_grad, **opts)
    assert (served - ref).abs().max() < 1e-13 and (served_grad - ref_grad).abs().max() < 1e-13


def test_focal_loss_is_mmdets():
    """Per logit, the loss mmdet computes in PyTorch (``py_sigmoid_focal_loss``, one-hot
    targets, the background class C among them) and its gradient by autograd."""
    from mmdet.models.losses.focal_loss import py_sigmoid_focal_loss
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 5, generator=g, dtype=torch.float64) * 4).requires_grad_()
    target = torch.randint(0, 6, (64, ), generator=g)  # 5: background
    assert (target == 5).any()
    onehot = torch.nn.functional.one_hot(target, 6)[:, :5].to(x.dtype)
    ref = py_sigmoid_focal_loss(x, onehot, gamma=2.0, alpha=0.25, reduction='none')
    ref_grad, = torch.autograd.grad(ref.sum(), x)
    loss, grad = mmcv_ops.focal_loss_terms(x.detach(), target, 2.0, 0.25)
    assert (loss - ref).abs().max() < 1e-12 and (grad - ref_grad).abs().max() < 1e-12
    out, out_grad = torch.zeros_like(loss), torch.zeros_like(loss)
    mmcv_ops.sigmoid_focal_loss_forward(x.detach(), target, x.new_zeros(0), out, 2.0, 0.25)
    mmcv_ops.sigmoid_focal_loss_backward(x.detach(), target, x.new_zeros(0), out_grad, 2.0,
                                         0.25)
    assert torch.equal(out, loss) and torch.equal(out_grad, grad)


def test_what_is_not_served_says_so():
    with pytest.raises(NotImplementedError, match="'max'"):
        mmcv_ops.roi_align_forward(torch.zeros(1, 1, 4, 4), torch.zeros(1, 5),
                                   torch.zeros(1, 1, 2, 2), None, None, 2, 2, 1.0, 0, 0, True)
    with pytest.raises(NotImplementedError, match='class weights'):
        mmcv_ops.sigmoid_focal_loss_forward(torch.zeros(2, 3), torch.zeros(2).long(),
                                            torch.ones(3), torch.zeros(2, 3), 2.0, 0.25)
    with pytest.raises(NotImplementedError, match="'deform_conv_forward' is not served"):
        mmcv_ops.deform_conv_forward(1, 2)
    with pytest.raises(AttributeError):
        mmcv_ops.__wrapped__  # dunder names are not ops


SCRIPT = '''
import sys
import torch
import mmcv.ops.nms
from mmcv.ops import RoIAlign, nms, sigmoid_focal_loss
ext = sys.modules['mmcv.ops.nms'].ext_module
assert ext.__file__.endswith('mmcv_ops.py'), ext
boxes = torch.tensor([[0., 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]])
dets, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)
assert keep.tolist() == [0, 2], keep
x = torch.randn(1, 2, 8, 8, requires_grad=True)
RoIAlign(2, 1.0)(x, torch.tensor([[0., 1, 1, 6, 6]])).sum().backward()
logits = torch.randn(4, 3, requires_grad=True)
sigmoid_focal_loss(logits, torch.tensor([0, 1, 3, 2]), 2.0, 0.25).backward()
print('served', sys.argv[1:])
'''


def test_the_runner_serves_mmcv_and_tallies(tmp_path):
    """``python mmcv_ops.py --tally FILE SCRIPT ARGS``: the script, with its arguments,
    calls mmcv's ops through the public API and gets the served ones; the tally counts
    each op's calls and says the route."""
    script = tmp_path / 'script.py'
    script.write_text(SCRIPT)
    tally = tmp_path / 'ops.json'
    res = subprocess.run([sys.executable, 'projects/soft_lab/gpu/mmcv_ops.py', '--tally',
                          str(tally), str(script), 'a', '--b'], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert "served ['a', '--b']" in res.stdout
    assert "mmcv's compiled ops served from torchvision / PyTorch" in res.stdout
    ops = json.loads(tally.read_text())['ops']
    assert {op: e['calls'] for op, e in ops.items()} == {
        'nms': 1, 'roi_align forward': 1, 'roi_align backward': 1,
        'sigmoid_focal_loss forward': 1, 'sigmoid_focal_loss backward': 1}
    assert ops['sigmoid_focal_loss forward']['routes'] == ['pytorch']
    usage = subprocess.run([sys.executable, 'projects/soft_lab/gpu/mmcv_ops.py'], cwd=ROOT,
                           capture_output=True, text=True)
    assert usage.returncode == 1 and 'SCRIPT' in usage.stderr
