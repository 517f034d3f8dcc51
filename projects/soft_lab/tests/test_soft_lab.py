"""The lab's candidates: registered by import, held to the library's hard-kernel bound
(TF32 and fp16 emulated on the CPU), their Triton kernels checked in Triton's
interpreter. Run from the repository root: `python -m pytest projects/soft_lab/tests`."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

import projects.soft_lab as lab
from mmsoft.models.attention import (KERNEL_PRODUCTS, PLANS, VARIANTS, AttentionPlan,
                                     attention_plan, newton_alpha,
                                     round_tf32, soft_attention)
from mmsoft.testing import HARD_KERNELS, hard_problem, kernel_bound, relative_deviation

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
CUDA_PLAN = PLANS['cuda']
CANDIDATES = ('tf32-fp16', 'tf32-guarded', 'tf32-horner')


def test_importing_the_lab_registers_its_candidates():
    assert set(CANDIDATES) <= set(VARIANTS) and 'triton_chunks' in KERNEL_PRODUCTS
    lab.register()  # once only: a second import registers nothing twice
    plan = AttentionPlan(pinv=((196, 'iterative'), (None, 'tf32-guarded'),
                               (None, 'iterative')), kernel_products=('triton_chunks', 'chunks'))
    assert plan.variants_for(1050) == ('tf32-guarded', 'iterative')


def test_mmsoft_imports_neither_the_lab_nor_triton():
    """The product stands without its lab: importing mmsoft and running a SOFT backbone
    imports no module of projects/ and not Triton."""
    code = ('import sys, torch, mmsoft\n'
            'from mmsoft.models import SOFT\n'
            'SOFT(arch="tiny", out_indices=(0,))(torch.randn(1, 3, 64, 64))\n'
            'print(sorted(m for m in sys.modules if m.split(".")[0] in '
            '("projects", "triton")))\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == '[]'


def _candidate_apply(name, A, Z, grad):
    """A⁺·Z by candidate ``name`` under CUDA's plan (TF32 emulated on the CPU)."""
    with torch.set_grad_enabled(grad):
        W = VARIANTS[name].apply(A.clone().requires_grad_(grad), Z, 20, CUDA_PLAN)
    return W.detach()


@pytest.mark.parametrize('kind', HARD_KERNELS)
@pytest.mark.parametrize('name', CANDIDATES)
def test_candidates_keep_the_hard_kernel_bound(name, kind):
    """As every variant of the library: finite and within the hard-kernel bound of the
    float64 iterate, with and without gradients (m = 64, CUDA's plan)."""
    A, Z, ref, floor = hard_problem(kind, 64, seed=1)
    for grad in (False, True):
        W = _candidate_apply(name, A, Z, grad)
        assert torch.isfinite(W).all() and relative_deviation(W, ref) <= kernel_bound(floor), (
            name, kind, grad)


def test_the_first_step_guard_bounds_every_eigenvalue():
    """``first_steps_needed``'s bound α·max_j (|A|·(|A|·1))_j lies above α·λ_max² on every
    hard kernel and on Gaussian kernels of landmarks spread from near-identical to far
    apart, so a kernel it lets off the first float32 step has αλ² ≤ 1; it does not let
    off the kernels that sit at the boundary."""
    from mmsoft.models.attention import gaussian_kernel
    kernels = [hard_problem(kind, 64, seed=1)[0] for kind in HARD_KERNELS]
    for scale in (0.05, 0.2, 1., 5.):
        x = torch.randn(2, 48, 32, dtype=torch.float64) * scale
        kernels.append(gaussian_kernel(x, x).float())
    let_off = 0
    for A in kernels:
        alpha = newton_alpha(A, nonnegative=True)
        needed = lab.first_steps_needed(A, alpha, nonnegative=True)
        lam = torch.linalg.eigvalsh(A.double()).abs().amax(-1)
        x0 = alpha.double().reshape(needed.shape) * lam**2
        assert (x0[~needed] <= lab.FIRST_STEP_BOUND).all(), (x0, needed)
        let_off += int((~needed).sum())
    assert 0 < let_off < sum(A[..., 0, 0].numel() for A in kernels)


@pytest.mark.parametrize('kind', HARD_KERNELS)
def test_the_guarded_first_step_runs_only_where_needed(kind):
    """'tf32-guarded' runs CUDA's schedule with its first float32 step where a kernel may
    sit near the step size's boundary (near-identity kernels, and those built on them)
    and in TF32 elsewhere, where the iterate then moves."""
    A, Z, _, _ = hard_problem(kind, 64, seed=1)
    moved = relative_deviation(_candidate_apply('tf32-guarded', A, Z, False),
                               _candidate_apply('tf32', A, Z, False))
    needed = bool(lab.first_steps_needed(A, newton_alpha(A, nonnegative=True), True).any())
    assert needed == (kind in ('near_identity', 'boundary'))
    assert moved < 1e-12 if needed else moved > 1e-8, moved


def test_horner_in_inference_takes_fewer_products():
    """'tf32-horner' applies the last of CUDA's 4 thin steps as one sum by Horner's rule
    in inference where that costs less (``newton._horner_steps``; at m = 500 here some,
    at SOFT-S's m = 1056 all 4), the same iterate up to rounding (TF32 emulated)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    counts = []

    class Squares(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default):
                b = args[2] if func is torch.ops.aten.baddbmm.default else args[1]
                counts[-1] += b.shape[-1] == b.shape[-2]
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 500, 32) * 0.3
    from mmsoft.models.attention import gaussian_kernel
    A, Z = gaussian_kernel(x, x), torch.randn(4, 500, 8)
    out = {}
    for name in ('tf32', 'tf32-horner'):
        counts.append(0)
        with Squares(), torch.no_grad():
            out[name] = VARIANTS[name].apply(A, Z, 20, CUDA_PLAN)
    assert counts[1] < counts[0]  # fewer X_k formed
    assert relative_deviation(out['tf32-horner'], out['tf32']) < 1e-5


def test_fp16_rounding_is_tf32_rounding():
    """The 'fp16' products' rounding (each matrix scaled by a power of two, then fp16)
    is ``round_tf32``'s for every entry down to 2^-28 of the matrix's largest."""
    x = torch.randn(4, 64, 64) * torch.logspace(-6, 6, 4).reshape(4, 1, 1)
    big = x.abs() >= x.abs().amax((-2, -1), keepdim=True) * 2.0**-28
    assert torch.equal(lab.round_fp16_scaled(x)[big], round_tf32(x)[big])
    hi, lo = lab.split_fp16(x)
    exact = (hi.double() + lo.double() - x.double()).abs() / x.abs().amax((-2, -1), keepdim=True)
    assert exact.max() < 2.0**-21


def test_candidates_run_in_a_soft_layer():
    """A plan that lists a candidate runs it in soft_attention, within float32's reach
    of the library's 'tf32' (TF32 emulated)."""
    q, v = torch.randn(1, 2, 120, 16) * 0.4, torch.randn(1, 2, 120, 16)
    lm = torch.randn(1, 2, 30, 16) * 0.4
    with attention_plan(CUDA_PLAN, device='cpu'):
        ref = soft_attention(q, lm, v, pinv_method='tf32')
        for name in CANDIDATES:
            assert relative_deviation(soft_attention(q, lm, v, pinv_method=name), ref) < 1e-4


@pytest.mark.skipif(importlib.util.find_spec('triton') is None, reason='needs Triton')
def test_triton_kernels_in_the_interpreter():
    """P's chunks and G from one Triton kernel, and the fp16 products, in Triton's
    interpreter (``interpreted_checks.py``, a process of its own)."""
    env = dict(os.environ, TRITON_INTERPRET='1', PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__),
                                                       'interpreted_checks.py')],
                         capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    chunks = r['chunks']
    assert max(chunks['P'], chunks['P_with_G'], chunks['G'], chunks['G_alone']) < 1e-6, chunks
    assert not chunks['p_kept']
    assert max(r['attention']) < 1e-5, r['attention']
    assert r['fp16x3'] < 4 * r['float32'] + 1e-7, r
    assert r['fp16'] < 1e-6 and r['amax'] < 1e-6 and r['epilogue'] < 1e-6, r
