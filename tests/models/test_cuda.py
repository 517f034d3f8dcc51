"""SOFT on CUDA: parity of every exact mode, training gradients, memory (``pytest -m cuda``).

Skipped without a GPU (CI has none). TF32 convolutions and matmuls are switched off here:
PyTorch runs convolutions in TF32 by default on Ampere and later GPUs, which alone moves
the fixture outputs by ~5e-4–8e-4 from the official float32 outputs, whatever the
pseudo-inverse does. The 'tf32' pinv mode switches TF32 on for its own products only.
"""
import pytest
import torch
from conftest import data_path, fixture_model, rel_err

from mmsoft.models import SOFT
from mmsoft.models.attention import soft_attention

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU'),
    pytest.mark.usefixtures('no_tf32'),  # tests/conftest.py
]


# Every exact pinv mode, in the official depthwise-conv layout; the default mode also in
# the other layout of ``HeadSharedConv`` (the lab's candidates: projects/soft_lab/tests).
@pytest.mark.parametrize('pinv_method, layout', [
    *((m, 'images') for m in ('auto', 'iterative', 'spectral', 'tf32')), ('auto', 'channels')])
def test_parity_on_cuda(pinv_method, layout, force_plan):
    force_plan(local_conv_layout=layout, device='cuda')
    expected = torch.load(data_path('soft_public_expected.pth'))
    model = fixture_model(pinv_method=pinv_method).cuda()
    with torch.no_grad():
        outs = model(expected['input'].cuda())
    for out, name in zip(outs, ['stage1', 'stage2', 'stage3', 'stage4_norm']):
        assert rel_err(out.cpu(), expected[name]) <= 1e-5, (name, pinv_method, layout)


def test_training_gradients_on_cuda_equal_cpu():
    """One training step's gradients on CUDA (memory-lean path, CUDA's plan) equal the
    CPU's.

    The biases of the convs that feed a training-mode BatchNorm (the patch embeddings)
    have a gradient of zero by construction: BatchNorm subtracts the batch mean. Their
    float32 gradients are rounding noise (on the CPU ≤ 2.9e-7 of the largest gradient,
    float64 ≤ 7e-16), so they are told apart by a float64 CPU pass and must stay at the
    noise level on both devices (bound 1e-5, 35× the CPU's); the others must agree to
    1e-4 (float32 vs float64 on the CPU: ≤ 7e-6)."""
    torch.manual_seed(0)
    model = fixture_model(pinv_method='auto')
    model.train()
    x = torch.randn(2, 3, 96, 128)
    grads = {}
    for device, dtype in (('cpu', torch.float64), ('cpu', torch.float32),
                          ('cuda', torch.float32)):
        m = model.to(device, dtype)
        m.zero_grad()
        sum(o.pow(2).mean() for o in m(x.to(device, dtype))).backward()
        grads[device, dtype] = {k: p.grad.detach().cpu().double()
                                for k, p in m.named_parameters() if p.grad is not None}
    exact = grads['cpu', torch.float64]
    scale = max(g.abs().max() for g in exact.values())
    zero = {k for k, g in exact.items() if g.abs().max() <= 1e-12 * scale}
    assert 0 < len(zero) < len(exact) / 4, sorted(zero)  # the patch-embedding biases
    cpu, cuda = grads['cpu', torch.float32], grads['cuda', torch.float32]
    for k, g in cpu.items():
        if k in zero:
            assert max(g.abs().max(), cuda[k].abs().max()) <= 1e-5 * scale, k
        else:
            assert rel_err(cuda[k], g) < 1e-4, k


def test_attention_training_memory_is_bounded():
    """A training step of one stage-1 attention at 800×1344 (2 images × 2 heads) stays
    far below the N×m kernel it would otherwise keep (1.1 GB here)."""
    B, h, N, m, d = 2, 2, 200 * 336, 25 * 42, 32
    q = (torch.randn(B, h, N, d, device='cuda') * 0.3).requires_grad_()
    lm = (torch.randn(B, h, m, d, device='cuda') * 0.3).requires_grad_()
    v = torch.randn(B, h, N, d, device='cuda', requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    soft_attention(q, lm, v).sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    kernel_bytes = B * h * N * m * 4
    assert peak < 0.5 * kernel_bytes, (peak / 2**20, kernel_bytes / 2**20)


def test_soft_small_trains_on_cuda():
    model = SOFT(arch='small').cuda().train()
    outs = model(torch.randn(2, 3, 256, 320, device='cuda'))
    sum(o.mean() for o in outs).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize('kwargs', [{}, dict(pinv_method='regularized'),
                                    dict(landmark_grid=16)],
                         ids=['auto', 'regularized', 'grid16'])
def test_no_host_device_sync(kwargs):
    """Forward and training step of SOFT-S run without a synchronizing CUDA call (one
    raises in sync-debug 'error' mode): the host never waits for the GPU's queue."""
    from mmsoft.testing import forbid_host_sync
    model = SOFT(arch='small', **kwargs).cuda()
    x = torch.randn(2, 3, 256, 320, device='cuda')
    with forbid_host_sync():
        with torch.no_grad():
            model.eval()(x)
        sum(o.mean() for o in model.train()(x)).backward()
