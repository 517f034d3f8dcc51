"""The candidates on a GPU (skipped without one): each one's attention against CUDA's plan,
with the plan's 'tf32' options, and no host-device synchronization where the candidate
does not read values by design."""
import pytest
import torch

import projects.soft_lab  # noqa: F401  (registers the candidates the paths name)
from mmsoft.benchmark.common import path_plan
from mmsoft.models import SOFT
from mmsoft.models.attention import PLANS, attention_plan, soft_attention
from mmsoft.testing import forbid_host_sync, relative_deviation

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')]

CANDIDATES = ('tf32-guarded', 'tf32-horner')


@pytest.mark.parametrize('name', CANDIDATES)
def test_candidates_match_the_plan_on_cuda(name):
    """Outputs and a training step's input gradients within 1e-4 of CUDA's plan (m = 330
    landmarks: 'tf32' there), the candidate in its place with its options
    (``path_plan('cuda+NAME')``)."""
    torch.manual_seed(0)
    q = (torch.randn(2, 2, 1320, 32, device='cuda') * 0.3).requires_grad_()
    lm = (torch.randn(2, 2, 330, 32, device='cuda') * 0.3).requires_grad_()
    v = torch.randn(2, 2, 1320, 32, device='cuda', requires_grad=True)
    results = []
    for plan in (PLANS['cuda'], path_plan(f'cuda+{name}', 'cuda')):
        with attention_plan(plan, device='cuda'):
            out = soft_attention(q, lm, v, pinv_method='auto')
            grads = torch.autograd.grad(out.pow(2).sum(), (q, lm, v))
        results.append((out.detach(), *grads))
    for got, ref in zip(results[1], results[0]):
        assert relative_deviation(got, ref) < 1e-4, name


def test_no_host_device_sync():
    """SOFT-S's forward and training step with 'tf32-horner' run without a synchronizing
    CUDA call ('tf32-guarded' reads one value per layer by design)."""
    model = SOFT(arch='small').cuda()
    x = torch.randn(2, 3, 256, 320, device='cuda')
    with attention_plan(path_plan('cuda+tf32-horner', 'cuda'), device='cuda'), \
            forbid_host_sync():
        with torch.no_grad():
            model.eval()(x)
        sum(o.mean() for o in model.train()(x)).backward()
