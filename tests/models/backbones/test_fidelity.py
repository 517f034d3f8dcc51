"""The fidelity floor, judged where users see it: SOFT-S's output maps and a training
step's gradients under each device's default plan, against the float64 computation in
the official order (``mmsoft.testing.fidelity``; docs/en/notes/numerics.md).

At 384×640 every landmark kernel of stages 1-3 has m = 12·20 = 240 landmarks: above the
CPU's switch to 'spectral' (128) and CUDA's to 'tf32' (196), so each plan runs the path
it runs at detection sizes. CUDA's plan runs here on the CPU with its TF32 products
emulated (``round_tf32``: operands rounded to TF32 to nearest, as an H200's tensor cores
were measured to round).
Random weights (seed 0); tools/analysis_tools/fidelity.py measures the same at any size
and on a GPU. The training step's gradients are swept over photos, crops, landmark
counts and two seeds (``GRADIENT_CASES``), each compared along the float32 step's own
branches at ReLU inputs within rounding of 0 (``mmsoft.testing.gradient_deviations``).

The float64 references take half of this module's time; a run stores them in pytest's
cache folder (``float64_reference``) for the runs after it in the same checkout (CI runs
these tests again in another numeric configuration and on another torch).
"""
import glob
import hashlib
import os
import os.path as osp
import weakref
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import mmsoft
from mmsoft.models import SOFT
from mmsoft.models.attention import PLANS, TF32, Inputs, select_variant
from mmsoft.testing import (FIDELITY_IMAGES, GRADIENT_TOL, GradientReference,
                            fidelity_image, gradient_deviations, official_order,
                            output_bounds, output_deviations, reference_gradients,
                            reference_outputs)

SIZE = (384, 640)
M = (SIZE[0] // 32) * (SIZE[1] // 32)  # landmarks per head in stages 1-3
# Each device type's plan, and CUDA's list with its float32 iterate alone (the variant
# its plan takes up to 196 landmarks, and for float64 kernels), all run here on the CPU.
# CUDA's 'tf32' applies its last float32 steps to the thin matrix (``thin_steps``): its
# maps are that path; at this size (m = 240, below a launch's worth of flops per
# product) its training step forms them, as at 512×512 (larger kernels run them thin in
# training too: the sweep below forces them; tests/models/attention/test_attention.py).
PATHS = {'cpu': PLANS['cpu'], 'cuda': PLANS['cuda'],
         'cuda, float32 iterate': replace(PLANS['cuda'], pinv='iterative')}
# and for the maps the CPU's list on larger kernels, forced here: 'tridiagonal', the
# filter through the kernels' tridiagonal form where SciPy is installed (this size's
# kernels take eigenvectors, as they do with gradients and without SciPy at every size)
MAP_PATHS = dict(PATHS, **{'cpu, tridiagonal form': replace(
    PLANS['cpu'], pinv=((1, 'tridiagonal'), (1, 'spectral'), (1, 'iterative')))})


def resolve(m, device_type, grad=False):
    """The variant 'auto' takes for m landmarks under a device's plan."""
    inputs = Inputs(device=device_type, dtype=torch.float32, m=m, grad=grad)
    return select_variant('auto', PLANS[device_type], inputs).name


def _digest(*parts):
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode())
    return h.hexdigest()


def _tensor_bytes(t):
    return t.detach().cpu().contiguous().numpy().tobytes()


@pytest.fixture(scope='module')
def float64_reference(request):
    """``float64_reference(kind, model, x, compute)``: ``compute()``, a float64 reference
    of ``model`` on ``x`` ('outputs' or 'gradients'), or what a run before this one
    stored for the same computation: the same kind, every source file of mmsoft, the
    model's weights and buffers and the input, byte for byte. It does not depend on this
    run's threads, SIMD kernels or torch version beyond float64's rounding (~1e-15 of
    the floors). Nothing is stored where pytest's cache is off (-p no:cacheprovider)."""
    cache = getattr(request.config, 'cache', None)
    root = osp.dirname(mmsoft.__file__)
    sources = _digest(*(Path(f).read_bytes() for f in sorted(
        glob.glob(osp.join(root, '**', '*.py'), recursive=True))))
    weights = weakref.WeakKeyDictionary()  # model -> digest of its state

    def get(kind, model, x, compute):
        if cache is None:
            return compute()
        if model not in weights:
            weights[model] = _digest(*(part for k, v in model.state_dict().items()
                                       for part in (k, _tensor_bytes(v))))
        folder = cache.mkdir('mmsoft-float64-references')
        path = folder / f'{_digest(kind, sources, weights[model], _tensor_bytes(x))}.pt'
        if path.exists():
            stored = torch.load(path, map_location='cpu', weights_only=True)
            return GradientReference(*stored) if kind == 'gradients' else stored
        result = compute()
        tmp = folder / f'{path.name}.{os.getpid()}.tmp'
        torch.save(tuple(result) if kind == 'gradients' else result, tmp)
        os.replace(tmp, path)
        return result
    return get


@pytest.fixture(scope='module')
def model():
    torch.manual_seed(0)
    model = SOFT(arch='small', drop_path_rate=0.)
    model.init_weights()
    return model.eval()


@pytest.fixture(scope='module')
def references(model, float64_reference):
    """image -> (input, float64 official-order output maps, each map's bound)."""
    out = {}
    for name in FIDELITY_IMAGES:
        x = fidelity_image(name, SIZE)
        refs = float64_reference('outputs', model, x, lambda: reference_outputs(model, x))
        out[name] = x, refs, output_bounds(model, x, refs)
    return out


# Worst map over the seven images at 384×640, 2 threads (AVX-512), measured with this
# file's models and images (all on the cat photo): the CPU's plan 6.1e-6, CUDA's ('tf32'
# 1 + 15 + 4, emulated) 6.4e-6, CUDA's with the float32 iterate 6.6e-6 (the floor is
# 1e-5: ≥ 1.5× margin); 20 TF32 steps 1.1e-4 on the text page. CUDA's with its last
# float32 steps thin 7.2e-6 (2 threads, AVX2, where CUDA's formed was 6.6e-6). The CPU's
# list with the tridiagonal application 6.6e-6 (AVX2; `tools/analysis_tools/fidelity.py
# --size 384x640 --paths spectral cpu` runs it where a kernel has 449 landmarks or more:
# at 384×640 force it as this test does). On CUDA
# itself at 384×640 CUDA's plan is within 4.0e-6; at 640×640 and 800×1344:
# docs/en/notes/numerics.md.
@pytest.mark.parametrize('path', MAP_PATHS)
def test_output_maps_keep_the_floor(model, references, path):
    """Each map within 1e-5 of float64, or within twice the float32 official order's
    deviation where float32 itself misses 1e-5 (``output_bounds``)."""
    # the size takes each plan's path for large kernels
    assert (resolve(M, 'cpu'), resolve(M, 'cuda')) == ('spectral', 'tf32')
    for name, (x, refs, bounds) in references.items():
        devs = output_deviations(model, x, refs, MAP_PATHS[path], device_type='cpu')
        assert all(d <= b for d, b in zip(devs, bounds)), (path, name, devs, bounds)


# The gradient floor, swept over inputs: photos with and without flat regions (sky, a
# silhouette, a text page, a near-blank wall), whole and cropped, three random models, at
# landmark counts (stages 1-3: (h/32)·(w/32)) that take each path of both plans in a
# training step: 64 ('iterative' on both), 160 and 196 (the CPU's 'spectral', which
# decomposes in float64 in training; CUDA's formed float32 iterate), 208 (CUDA's 'tf32'
# 1 + 4, TF32 emulated, and its last 4 float32 steps thin, which its training step takes
# from m ≈ 448 up: forced here; and CUDA's list with the float32 iterate alone, beyond
# the 196 landmarks its plan takes it up to). id: (image, resized to, crop (top, left, h, w) or None, seed).
GRADIENT_CASES = {
    'rocket-sky-256x256-seed0': ('rocket', (512, 768), (0, 256, 256, 256), 0),
    'chelsea-256x256-seed1': ('chelsea', (300, 451), (22, 97, 256, 256), 1),
    'astronaut-256x256-seed0': ('astronaut', (256, 256), None, 0),
    'page-256x256-seed1': ('page', (256, 256), None, 1),
    'coffee-320x512-seed0': ('coffee', (400, 600), (40, 44, 320, 512), 0),
    'rocket-sky-320x512-seed1': ('rocket', (427, 640), (0, 64, 320, 512), 1),
    'horse-320x512-seed0': ('horse', (320, 512), None, 0),
    'chelsea-416x512-seed1': ('chelsea', (416, 624), (0, 56, 416, 512), 1),
    'blank-416x512-seed0': ('blank', (416, 512), None, 0),
    # flat regions at 196 landmarks, where the CPU's 'spectral' runs in a training step
    # (the largest cases: ``slow``, run by the whole suite)
    'rocket-sky-448x448-seed1': ('rocket', (512, 512), (32, 32, 448, 448), 1),
    'blank-448x448-seed3': ('blank', (448, 448), None, 3),
}
SLOW_CASES = ('rocket-sky-448x448-seed1', 'blank-448x448-seed3')
PLAN_PATHS = {'cpu': PLANS['cpu'], 'cuda': PLANS['cuda']}
THIN_FROM = 200  # landmarks from which the sweep also forces CUDA's thin training steps


@pytest.fixture(scope='module')
def soft_models():
    """seed -> SOFT-S with random weights, eval mode."""
    def build(seed):
        torch.manual_seed(seed)
        model = SOFT(arch='small', drop_path_rate=0.)
        model.init_weights()
        return model.eval()
    return {seed: build(seed) for seed in sorted({case[-1] for case in GRADIENT_CASES.values()})}


@pytest.fixture(scope='module')
def gradient_references(soft_models, float64_reference):
    """case id -> (model, input, float64 reference, bound), computed once per case."""
    cache = {}

    def get(case):
        if case not in cache:
            image, size, crop, seed = GRADIENT_CASES[case]
            model, x = soft_models[seed], fidelity_image(image, size, crop)
            ref = float64_reference('gradients', model, x,
                                    lambda: reference_gradients(model, x))
            with official_order():
                official = gradient_deviations(model, x, ref)
            cache[case] = model, x, ref, max(GRADIENT_TOL, 2 * max(official.deviations.values()))
        return cache[case]
    return get


def _worst(result):
    worst = max(result.deviations, key=result.deviations.get)
    return worst, result.deviations[worst]


@pytest.mark.parametrize('case', [
    pytest.param(case, marks=pytest.mark.slow) if case in SLOW_CASES else case
    for case in GRADIENT_CASES])
def test_training_gradients_keep_the_floor(gradient_references, case, monkeypatch):
    """Both plans' training step: every parameter's gradient within 1e-4 (norm-relative),
    or twice the float32 official order's deviation, of the float64 official order along
    the float32 step's branches at ReLU inputs within rounding of 0
    (``gradient_deviations``), BatchNorm in eval mode."""
    model, x, ref, bound = gradient_references(case)
    m = (x.shape[-2] // 32) * (x.shape[-1] // 32)
    assert m in (64, 160, 196, 208)
    assert resolve(m, 'cpu', grad=True) == ('iterative' if m <= 128 else 'spectral')
    assert resolve(m, 'cuda', grad=True) == ('iterative' if m <= 196 else 'tf32')
    results = {name: gradient_deviations(model, x, ref, plan, 'cpu')
               for name, plan in PLAN_PATHS.items()}
    # beyond the landmarks for which CUDA's plan takes its float32 iterate: worst parameter
    # 8.1e-6 on the cat's crop, 1.2e-5 on the blank wall (2 threads), where the float32
    # official order is 9.3e-6 and 1.2e-5: ≥ 8x below the floor
    if m > 196:
        results['cuda, float32 iterate'] = gradient_deviations(
            model, x, ref, PATHS['cuda, float32 iterate'], 'cpu')
    if m >= THIN_FROM:
        from mmsoft.models.attention import newton
        calls = []

        def thin_pays(*args):
            calls.append(args)
            return True
        monkeypatch.setattr(newton, '_thin_pays_in_training', thin_pays)
        results['cuda, thin steps'] = gradient_deviations(model, x, ref, PLANS['cuda'], 'cpu')
        assert calls  # the thin training steps ran
    for name, r in results.items():
        assert len(r.deviations) == len(ref.gradients) > 100, name  # none zero by construction
        assert r.beyond_rounding == 0, (name, r.beyond_rounding)
        worst, dev = _worst(r)
        assert dev <= bound, (case, name, worst, dev, bound, r.flips)


def test_the_gradient_floor_tells_missing_float32_steps_apart(gradient_references):
    """The sweep can fail: 'tf32' without its last float32 steps (TF32 emulated) is ~1e-3
    from float64 on the rocket's sky at 256×256, where both plans are within ~5e-6."""
    model, x, ref, bound = gradient_references('rocket-sky-256x256-seed0')
    plan = replace(PLANS['cuda'], pinv=TF32(float32_steps=(1, 0)))
    worst, dev = _worst(gradient_deviations(model, x, ref, plan, 'cpu'))
    assert dev > bound, (worst, dev, bound)


def test_the_floor_tells_tf32_without_float32_steps_apart(model, references):
    """The output test can fail: 'tf32' with all 20 steps in TF32 (no float32 steps)
    misses the floor on the text page (1.1e-4, emulated by rounding to nearest)."""
    plan = replace(PLANS['cuda'], pinv=TF32(float32_steps=(0, 0)))
    x, refs, bounds = references['page']
    devs = output_deviations(model, x, refs, plan, device_type='cpu')
    assert any(d > b for d, b in zip(devs, bounds)), (devs, bounds)


def test_forcing_the_float64_branches_reproduces_the_reference(soft_models):
    """The float64 step with every ReLU forced to its own branches has its gradients: the
    forced ReLUs hand their gradient back as a ReLU does (in torch 2.14 a batch-1
    gradient in the layout the stage outputs' transpose gives, handed on as it came,
    makes the CPU's BatchNorm backward 10-100× off)."""
    model, x = soft_models[0], fidelity_image('astronaut', (128, 160))
    ref = reference_gradients(model, x)
    forced = reference_gradients(model, x, {n: r > 0 for n, r in ref.relu_inputs.items()})
    assert len(ref.relu_inputs) == 6  # every patch embedding's ReLU
    for k, g in ref.gradients.items():
        torch.testing.assert_close(forced.gradients[k], g, rtol=1e-12, atol=1e-12 * g.abs().max())


class _Flipper(torch.nn.Module):
    """Linear(3, 2) -> ReLU -> Linear(2, 1) whose first ReLU input on [1e8, 1, -1e8] is 1
    in float64 and 0 in float32 (1e8 + 1 rounds to 1e8), beside a second input of
    ``other``: within rounding of 0 for other = 1e6 (1e-6 of it), not for other = 1."""

    def __init__(self, other):
        super().__init__()
        self.fc1 = torch.nn.Linear(3, 2, bias=False)
        self.relu = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.tensor([[1., 1., 1.], [other / 1e8, 0., 0.]]))
            self.fc2.weight.fill_(1.)

    def forward(self, x):
        return (self.fc2(self.relu(self.fc1(x))), )


def test_a_flip_within_rounding_is_compared_along_the_float32_branch():
    """A ReLU input that float32 rounds to the other side of 0 is counted and its branch
    followed in float64 too: the gradient it blocks (fc1's first row) leaves the
    comparison, which the deviation against float64's own branch keeps."""
    net, x = _Flipper(1e6), torch.tensor([[1e8, 1., -1e8]])
    ref = reference_gradients(net, x)
    assert ref.relu_inputs['relu'][0, 0] == 1  # float64: passes
    r = gradient_deviations(net, x, ref)
    assert (r.flips, r.beyond_rounding) == (1, 0)
    assert r.largest_flip == pytest.approx(1e-6)
    assert r.with_flips['fc1.weight'] > 0.1  # the blocked row
    assert r.deviations['fc1.weight'] <= 1e-7 and r.deviations['fc2.weight'] <= 1e-7


def test_a_flip_beyond_rounding_counts_against_the_path():
    """The same input beside a second one of 1 is no rounding of 0 (FLIP_TOL): the float64
    branch stays, and the deviation shows it."""
    net, x = _Flipper(1.), torch.tensor([[1e8, 1., -1e8]])
    ref = reference_gradients(net, x)
    r = gradient_deviations(net, x, ref)
    assert (r.flips, r.beyond_rounding) == (0, 1)
    assert r.deviations['fc1.weight'] > 0.1
