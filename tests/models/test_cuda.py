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


# Every exact pinv mode, in the official depthwise-conv layout and P's products from the
# library; the default mode also in the other layout of ``HeadSharedConv``, with P's
# products in the fused Triton kernels, with the iterate's float32 products split into
# TF32 ones (one Triton kernel each; 'tf32x3' makes every product so), and both (the
# fused kernels' products with P split too); 'tf32' with its TF32 products from fp16
# tensor cores (one Triton kernel each), alone, with its float32 products as three fp16
# ones, and with every other kernel; P's chunks written by one Triton kernel each, alone
# and with the products on fp16 tensor cores (its own products split); 'tf32' with its
# first float32 step only where a kernel nears the step size's boundary.
SPLIT = dict(float32_products='tf32x3')
FP16 = dict(tf32_products='fp16')
FP16X3 = dict(FP16, float32_products='fp16x3')
TRITON_CHUNKS = dict(kernel_products='triton_chunks')
GUARDED = dict(tf32_first_steps='guarded')


@pytest.mark.parametrize('pinv_method, layout, choices', [
    *((m, 'images', {}) for m in ('auto', 'iterative', 'spectral', 'tf32', 'tf32x3')),
    ('auto', 'channels', {}), ('auto', 'images', dict(kernel_products='fused')),
    ('auto', 'images', SPLIT), ('tf32', 'images', SPLIT),
    ('auto', 'images', dict(SPLIT, kernel_products='fused')), ('tf32', 'images', FP16),
    ('tf32', 'images', FP16X3), ('iterative', 'images', FP16X3),
    ('tf32', 'images', dict(FP16X3, kernel_products='fused')),
    ('auto', 'images', TRITON_CHUNKS), ('tf32', 'images', dict(FP16X3, **TRITON_CHUNKS)),
    ('tf32', 'images', GUARDED)])
def test_parity_on_cuda(pinv_method, layout, choices, force_plan):
    force_plan(local_conv_layout=layout, **choices, device='cuda')
    expected = torch.load(data_path('soft_public_expected.pth'))
    model = fixture_model(pinv_method=pinv_method).cuda()
    with torch.no_grad():
        outs = model(expected['input'].cuda())
    for out, name in zip(outs, ['stage1', 'stage2', 'stage3', 'stage4_norm']):
        assert rel_err(out.cpu(), expected[name]) <= 1e-5, (name, pinv_method, layout)


@pytest.mark.parametrize('choices', [{}, dict(kernel_products='fused'), SPLIT,
                                     dict(SPLIT, kernel_products='fused'),
                                     dict(float32_products='fp16x3'), TRITON_CHUNKS,
                                     dict(TRITON_CHUNKS, float32_products='fp16x3'),
                                     dict(GUARDED, pinv='tf32')],
                         ids=['plan', 'fused', 'split', 'fused split', 'fp16 split',
                              'triton chunks', 'triton chunks fp16 split', 'guarded'])
def test_training_gradients_on_cuda_equal_cpu(choices, force_plan):
    """One training step's gradients on CUDA (memory-lean path; P's products from the
    library, its chunks written by the library or by one Triton kernel, or the fused
    kernels; the iterate's float32 products as they are or split) equal the CPU's.

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
    force_plan(**choices, device='cuda')
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


@pytest.mark.parametrize('kwargs, choices', [
    ({}, {}), (dict(pinv_method='regularized'), {}), (dict(landmark_grid=16), {}),
    ({}, dict(kernel_products='fused')), ({}, SPLIT), ({}, dict(FP16X3, pinv='tf32')),
    ({}, TRITON_CHUNKS)],
    ids=['auto', 'regularized', 'grid16', 'fused', 'split', 'fp16', 'triton chunks'])
def test_no_host_device_sync(kwargs, choices, force_plan):
    """Forward and training step of SOFT-S run without a synchronizing CUDA call (one
    raises in sync-debug 'error' mode): the host never waits for the GPU's queue.
    (``tf32_first_steps='guarded'``, an opt-in, reads one value per layer by design.)"""
    force_plan(**choices, device='cuda')
    model = SOFT(arch='small', **kwargs).cuda()
    x = torch.randn(2, 3, 256, 320, device='cuda')
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        with torch.no_grad():
            model.eval()(x)
        sum(o.mean() for o in model.train()(x)).backward()
    finally:
        torch.cuda.set_sync_debug_mode('default')


@pytest.mark.parametrize('gemm', ['triton', 'cublas'])
@pytest.mark.parametrize('precision', ['fp16', 'fp16x3'])
def test_fp16_products_on_cuda(precision, gemm):
    """The iterate's fp16 products each way (``iterate_matmul.GEMMS``) on the tensor
    cores: a Newton step's epilogue 2c - a·b for matrices of 1e-7, 1 and 3e6 (outside
    fp16's range unscaled) within float32's accuracy of float64 (of the operands as
    'fp16' rounds them), maxima passed on; five Newton steps as far from float64 as the
    emulation's, within a quarter or float32's rounding. Bounds: the tensor cores'
    float32 sums were within 2.1e-6 of float64 at m = 1056 on an H200; 5× that."""
    from mmsoft.models.attention import iterate_matmul, newton
    if gemm == 'cublas' and iterate_matmul.fp16_gemm() != 'cublas':
        pytest.skip("cuBLAS's fp16 products with float32 results need torch 2.8")
    scale = torch.tensor([1e-7, 1., 3e6], device='cuda').view(3, 1, 1)
    a = torch.randn(3, 200, 150, device='cuda') * scale
    b = torch.randn(3, 150, 130, device='cuda')
    c = torch.randn(3, 200, 130, device='cuda') * scale
    out, amax = iterate_matmul.baddbmm(c, a, b, beta=2, alpha=-1, precision=precision,
                                       gemm=gemm)
    x, y = ((newton.round_fp16_scaled(t) for t in (a, b)) if precision == 'fp16' else (a, b))
    ref = 2 * c.double() - x.double() @ y.double()
    for i in range(3):
        assert rel_err(out[i], ref[i]) <= 1e-5, (i, rel_err(out[i], ref[i]))
    assert torch.equal(amax, out.abs().amax((-2, -1)))
    q = torch.randn(2, 90, 8, device='cuda') * 0.3
    sq = (q * q).sum(-1)
    A = torch.exp(-(sq[:, :, None] + sq[:, None, :] - 2 * q @ q.transpose(1, 2)) / 2)
    V = newton.newton_alpha(A).reshape(-1, 1, 1) * A
    exact = newton._newton_steps(A.double(), V.double(), 5)
    steps = newton._newton_steps_fp16(A, V, 5, precision, gemm=gemm)
    emulated = newton._newton_steps(A.cpu(), V.cpu(), 5, precision).cuda()
    assert rel_err(steps, emulated) <= 1e-5
    assert rel_err(steps, exact) <= max(1.25 * rel_err(emulated, exact), 1.5e-6)
