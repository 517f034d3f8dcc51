"""The lab's candidates: registered by import, kinds of the library's 'tf32' with its
options, held to the library's hard-kernel bound (TF32 emulated on the CPU). Run from the
repository root: `python -m pytest projects/soft_lab/tests`."""
import os
import subprocess
import sys
from dataclasses import fields, is_dataclass, replace

import pytest
import torch

import projects.soft_lab as lab
from mmsoft.benchmark.common import path_plan
from mmsoft.models.attention import (PLANS, TF32, VARIANTS, AttentionPlan, Inputs,
                                     attention_plan, select_variant,
                                     gaussian_kernel, newton_alpha, soft_attention)
from mmsoft.testing import HARD_KERNELS, hard_problem, kernel_bound, relative_deviation

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
CUDA_PLAN = PLANS['cuda']
# CUDA's 'tf32', with its options: what the candidates stand in for
CUDA_TF32 = next(v for _, v in CUDA_PLAN.pinv if v.name == 'tf32')
CANDIDATES = ('tf32-guarded', 'tf32-horner')


def _cuda_like(name):
    """Variant ``name`` with CUDA's 'tf32''s options (for 'tf32', CUDA's own)."""
    if name == 'tf32':
        return CUDA_TF32
    return replace(VARIANTS[name], **{f.name: getattr(CUDA_TF32, f.name)
                                      for f in fields(CUDA_TF32)})


def test_importing_the_lab_registers_its_candidates():
    assert set(CANDIDATES) <= set(VARIANTS)
    assert isinstance(VARIANTS['tf32-guarded'], lab.GuardedTF32)
    assert isinstance(VARIANTS['tf32-horner'], lab.HornerTF32)
    lab.register()  # once only: a second import registers nothing twice
    plan = AttentionPlan(pinv=((197, 'tf32-guarded'), (1, 'iterative')))
    def auto(m):
        return select_variant('auto', plan, Inputs('cpu', torch.float32, m)).name

    assert (auto(1050), auto(196)) == ('tf32-guarded', 'iterative')
    assert plan.may_run('tf32-horner') == (VARIANTS['tf32-horner'], )


@pytest.mark.parametrize('name', CANDIDATES)
def test_candidates_are_kinds_of_tf32_with_its_options(name):
    """A candidate is a frozen ``TF32`` dataclass: registered with TF32's defaults, given
    CUDA's options by ``dataclasses.replace`` or a path modifier (``path_plan``), which
    carries the plan's 'tf32' options over; its options are checked as TF32's."""
    variant = VARIANTS[name]
    assert isinstance(variant, TF32) and is_dataclass(variant)
    assert [f.name for f in fields(variant)] == [f.name for f in fields(TF32)]
    default = TF32()
    assert (variant.float32_steps, variant.pad_to, variant.thin_steps) == (
        default.float32_steps, default.pad_to, default.thin_steps)
    cuda = _cuda_like(name)
    assert type(cuda) is type(variant) and cuda.name == name
    assert (cuda.float32_steps, cuda.pad_to, cuda.thin_steps) == ((1, 4), 32, 4)
    assert repr(cuda) == (f'{type(variant).__name__}(float32_steps=(1, 4), pad_to=32, '
                          'thin_steps=4)')
    plan = path_plan(f'cuda+{name}', 'cpu')
    assert plan.pinv == ((197, cuda), (1, VARIANTS['iterative']))
    with pytest.raises(ValueError, match='thin_steps'):
        replace(variant, float32_steps=(1, 2), thin_steps=4)


def test_mmsoft_imports_not_the_lab():
    """The product stands without its lab: importing mmsoft and running a SOFT backbone
    imports no module of projects/."""
    code = ('import sys, torch, mmsoft\n'
            'from mmsoft.models import SOFT\n'
            'SOFT(arch="tiny", out_indices=(0,))(torch.randn(1, 3, 64, 64))\n'
            'print(sorted(m for m in sys.modules if m.split(".")[0] == "projects"))\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == '[]'


def _candidate_apply(name, A, Z, grad):
    """A⁺·Z by candidate ``name`` with CUDA's 'tf32' options (TF32 emulated on the CPU)."""
    with torch.set_grad_enabled(grad):
        W = _cuda_like(name).apply(A.clone().requires_grad_(grad), Z, 20)
    return W.detach()


@pytest.mark.parametrize('kind', HARD_KERNELS)
@pytest.mark.parametrize('name', CANDIDATES)
def test_candidates_keep_the_hard_kernel_bound(name, kind):
    """As every variant of the library: finite and within the hard-kernel bound of the
    float64 iterate, with and without gradients (m = 64), with CUDA's options and with
    the registered ones (TF32's defaults)."""
    A, Z, ref, floor = hard_problem(kind, 64, seed=1)
    for grad in (False, True):
        for variant in (_cuda_like(name), VARIANTS[name]):
            with torch.set_grad_enabled(grad):
                W = variant.apply(A.clone().requires_grad_(grad), Z, 20).detach()
            assert torch.isfinite(W).all() and (
                relative_deviation(W, ref) <= kernel_bound(floor)), (variant, kind, grad)


def test_the_first_step_guard_bounds_every_eigenvalue():
    """``first_steps_needed``'s bound α·max_j (|A|·(|A|·1))_j lies above α·λ_max² on every
    hard kernel and on Gaussian kernels of landmarks spread from near-identical to far
    apart, so a kernel it lets off the first float32 step has αλ² ≤ 1; it does not let
    off the kernels that sit at the boundary."""
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
    and in TF32 elsewhere, where the iterate then moves: exactly CUDA's 'tf32' with no
    first float32 step."""
    A, Z, _, _ = hard_problem(kind, 64, seed=1)
    guarded = _candidate_apply('tf32-guarded', A, Z, False)
    moved = relative_deviation(guarded, _candidate_apply('tf32', A, Z, False))
    needed = bool(lab.first_steps_needed(A, newton_alpha(A, nonnegative=True), True).any())
    assert needed == (kind in ('near_identity', 'boundary'))
    assert moved < 1e-12 if needed else moved > 1e-8, moved
    if not needed:
        unguarded = replace(CUDA_TF32, float32_steps=(0, CUDA_TF32.float32_steps[1]))
        with torch.no_grad():
            assert torch.equal(guarded, unguarded.apply(A, Z, 20))


def test_horner_in_inference_takes_fewer_products():
    """'tf32-horner' applies the last of CUDA's 4 thin steps as one sum by Horner's rule
    in inference where that costs less (``newton._horner_steps``; at m = 500 here some,
    at SOFT-S's m = 1056 all 4), the same iterate up to rounding (TF32 emulated); with
    gradients, or without thin steps (the registered options), it is 'tf32' itself."""
    from torch.utils._python_dispatch import TorchDispatchMode
    counts = []

    class Squares(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default):
                b = args[2] if func is torch.ops.aten.baddbmm.default else args[1]
                counts[-1] += b.shape[-1] == b.shape[-2]
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 500, 32) * 0.3
    A, Z = gaussian_kernel(x, x), torch.randn(4, 500, 8)
    out = {}
    for name in ('tf32', 'tf32-horner'):
        counts.append(0)
        with Squares(), torch.no_grad():
            out[name] = _cuda_like(name).apply(A, Z, 20)
    assert counts[1] < counts[0]  # fewer X_k formed
    assert relative_deviation(out['tf32-horner'], out['tf32']) < 1e-5
    small, Zs = A[:1, :64, :64].contiguous(), Z[:1, :64]
    with torch.no_grad():  # no thin steps: TF32's defaults
        assert torch.equal(VARIANTS['tf32-horner'].apply(small, Zs, 20),
                           TF32().apply(small, Zs, 20))
    with torch.enable_grad():  # with gradients: CUDA's 'tf32'
        Ag = small.clone().requires_grad_()
        assert torch.equal(_cuda_like('tf32-horner').apply(Ag, Zs, 20),
                           CUDA_TF32.apply(Ag, Zs, 20))


def test_candidates_run_in_a_soft_layer():
    """A plan that lists a candidate runs it in soft_attention, by 'auto' and by its
    name (the plan's own, with CUDA's options), within float32's reach of CUDA's
    'tf32' (TF32 emulated)."""
    q, v = torch.randn(1, 2, 120, 16) * 0.4, torch.randn(1, 2, 120, 16)
    lm = torch.randn(1, 2, 30, 16) * 0.4
    with attention_plan(CUDA_PLAN, device='cpu', pinv=((1, CUDA_TF32), )):
        ref = soft_attention(q, lm, v, pinv_method='auto')
    for name in CANDIDATES:
        with attention_plan(CUDA_PLAN, device='cpu', pinv=((1, _cuda_like(name)), )):
            for method in ('auto', name):
                out = soft_attention(q, lm, v, pinv_method=method)
                assert relative_deviation(out, ref) < 1e-4, (name, method)
