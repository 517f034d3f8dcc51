"""The candidates on a GPU (skipped without one): each one's attention against the
library's 'tf32' under CUDA's plan, the fp16 products against float64, and no host-device
synchronization where the candidate does not read values by design."""
import pytest
import torch

import projects.soft_lab as lab
from mmsoft.models import SOFT
from mmsoft.models.attention import PLANS, attention_plan, newton, soft_attention
from mmsoft.testing import forbid_host_sync, relative_deviation

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')]

CANDIDATES = {'tf32-fp16': {}, 'tf32-guarded': {}, 'tf32-horner': {},
              'triton_chunks': dict(kernel_products=('triton_chunks', 'chunks'))}


@pytest.mark.parametrize('name', CANDIDATES)
def test_candidates_match_the_plan_on_cuda(name):
    """Outputs and a training step's input gradients within 1e-4 of CUDA's plan (m = 330
    landmarks: 'tf32' there)."""
    torch.manual_seed(0)
    q = (torch.randn(2, 2, 1320, 32, device='cuda') * 0.3).requires_grad_()
    lm = (torch.randn(2, 2, 330, 32, device='cuda') * 0.3).requires_grad_()
    v = torch.randn(2, 2, 1320, 32, device='cuda', requires_grad=True)
    results = []
    for choices, method in ((dict(), 'auto'), (CANDIDATES[name], name if not CANDIDATES[name]
                                                else 'auto')):
        with attention_plan(PLANS['cuda'], device='cuda', **choices):
            out = soft_attention(q, lm, v, pinv_method=method)
            grads = torch.autograd.grad(out.pow(2).sum(), (q, lm, v))
        results.append((out.detach(), *grads))
    for got, ref in zip(results[1], results[0]):
        assert relative_deviation(got, ref) < 1e-4, name


@pytest.mark.parametrize('precision', ['fp16', 'fp16x3'])
def test_fp16_products_on_cuda(precision):
    """A Newton step's epilogue 2c - a·b for matrices of 1e-7, 1 and 3e6 (outside fp16's
    range unscaled) within float32's accuracy of float64 (of the operands as 'fp16'
    rounds them), maxima passed on; five Newton steps as far from float64 as the
    emulation's, within a quarter or float32's rounding."""
    from projects.soft_lab import fp16_products
    if not fp16_products.cublas_fp16():
        pytest.skip("cuBLAS's fp16 products with float32 results need torch 2.8")
    scale = torch.tensor([1e-7, 1., 3e6], device='cuda').view(3, 1, 1)
    a = torch.randn(3, 200, 150, device='cuda') * scale
    b = torch.randn(3, 150, 130, device='cuda')
    c = torch.randn(3, 200, 130, device='cuda') * scale
    out, amax = fp16_products.product(c, a, b, beta=2, alpha=-1, precision=precision)
    x, y = ((lab.round_fp16_scaled(t) for t in (a, b)) if precision == 'fp16' else (a, b))
    ref = 2 * c.double() - x.double() @ y.double()
    for i in range(3):
        assert relative_deviation(out[i], ref[i]) <= 1e-5, i
    assert torch.equal(amax, out.abs().amax((-2, -1)))
    q = torch.randn(2, 90, 8, device='cuda') * 0.3
    sq = (q * q).sum(-1)
    A = torch.exp(-(sq[:, :, None] + sq[:, None, :] - 2 * q @ q.transpose(1, 2)) / 2)
    V = newton.newton_alpha(A).reshape(-1, 1, 1) * A
    kind = 'tf32' if precision == 'fp16' else 'float32'
    exact = newton._newton_steps(A.double(), V.double(), 5)
    steps = lab.FP16_PRODUCTS.steps(A, V, 5, kind)
    emulated = lab.FP16_PRODUCTS.steps(A.cpu(), V.cpu(), 5, kind).cuda()
    assert relative_deviation(steps, emulated) <= 1e-5
    assert relative_deviation(steps, exact) <= max(1.25 * relative_deviation(emulated, exact),
                                                   1.5e-6)


@pytest.mark.parametrize('name', ['tf32-fp16', 'tf32-horner', 'triton_chunks'])
def test_no_host_device_sync(name):
    """SOFT-S's forward and training step with the candidate run without a synchronizing
    CUDA call ('tf32-guarded' reads one value per layer by design)."""
    choices = CANDIDATES[name] or dict(pinv=((196, 'iterative'), (None, name),
                                             (None, 'iterative')))
    model = SOFT(arch='small').cuda()
    x = torch.randn(2, 3, 256, 320, device='cuda')
    with attention_plan(PLANS['cuda'], device='cuda', **choices), forbid_host_sync():
        with torch.no_grad():
            model.eval()(x)
        sum(o.mean() for o in model.train()(x)).backward()
