"""The fidelity floor, judged where users see it: SOFT-S's output maps and a training
step's gradients under each device's default plan, against the float64 computation in
the official order (``mmsoft.testing.fidelity``; docs/en/notes/numerics.md).

At 384×640 every landmark kernel of stages 1-3 has m = 12·20 = 240 landmarks: above the
CPU's switch to 'spectral' (128) and CUDA's to 'tf32' (196), so each plan runs the path
it runs at detection sizes. CUDA's plan runs here on the CPU with its TF32 products
emulated (``truncate_tf32``: operands cut to TF32, more error than the rounding to
nearest measured on an H200's tensor cores).
Random weights (seed 0); tools/analysis_tools/fidelity.py measures the same at any size
and on a GPU.
"""
import importlib.util
from dataclasses import replace

import pytest
import torch

from mmsoft.models import SOFT
from mmsoft.models.attention import PLANS, resolve_pinv_method
from mmsoft.testing import (FIDELITY_IMAGES, GRADIENT_TOL, fidelity_image,
                            gradient_deviations, output_bounds, output_deviations,
                            reference_gradients, reference_outputs)

SIZE = (384, 640)
M = (SIZE[0] // 32) * (SIZE[1] // 32)  # landmarks per head in stages 1-3
# Each device type's plan, CUDA's plan with the float32 iterate (its plan before TF32),
# with its float32 products as three TF32 products of split operands, with its
# products on fp16 tensor cores (TF32 ones as fp16, float32 ones as three fp16 products)
# and with its first float32 step only where a kernel may sit near the step size's
# boundary (none of these images' kernels: TF32 instead; candidates), all run here on
# the CPU.
PATHS = {'cpu': PLANS['cpu'], 'cuda': PLANS['cuda'],
         'cuda, float32 iterate': replace(PLANS['cuda'], pinv='iterative', pinv_pad=1,
                                          thin_steps=0),
         'cuda, float32 products split': replace(PLANS['cuda'], float32_products='tf32x3'),
         'cuda, products on fp16 tensor cores': replace(
             PLANS['cuda'], tf32_products='fp16', float32_products='fp16x3'),
         'cuda, first float32 step guarded': replace(PLANS['cuda'],
                                                     tf32_first_steps='guarded')}
# and for the maps the CPU's plan on larger kernels, forced here: their tridiagonal form
# where SciPy is installed (this size's kernels take eigenvectors, as they do with
# gradients and without SciPy at every size). CUDA's plan applies its last float32 steps
# to the thin matrix (``thin_steps``): its maps are that path; at this size (m = 256,
# below a launch's worth of flops per product) its training step forms them, as at
# 512×512 (larger kernels run them thin in training too:
# tests/models/attention/test_attention.py, docs/en/notes/numerics.md).
MAP_PATHS = dict(PATHS)
if importlib.util.find_spec('scipy'):
    MAP_PATHS['cpu, tridiagonal form'] = replace(PLANS['cpu'],
                                                 spectral_inference='tridiagonal')


@pytest.fixture(scope='module')
def model():
    torch.manual_seed(0)
    model = SOFT(arch='small', drop_path_rate=0.)
    model.init_weights()
    return model.eval()


@pytest.fixture(scope='module')
def references(model):
    """image -> (input, float64 official-order output maps, each map's bound)."""
    out = {}
    for name in FIDELITY_IMAGES:
        x = fidelity_image(name, SIZE)
        refs = reference_outputs(model, x)
        out[name] = x, refs, output_bounds(model, x, refs, device_type='cpu')
    return out


def test_the_size_reaches_each_plans_path_for_large_kernels():
    assert resolve_pinv_method('auto', M, 'cpu') == 'spectral'
    assert resolve_pinv_method('auto', M, 'cuda') == PLANS['cuda'].pinv[-1][1]


# Worst map over the seven images at 384×640, 2 threads (AVX-512), measured with this
# file's models and images (all on the cat photo): the CPU's plan 6.1e-6, CUDA's ('tf32'
# 1 + 15 + 4, emulated) 6.4e-6, CUDA's with the float32 iterate 6.6e-6 (the floor is
# 1e-5: ≥ 1.5× margin); 20 TF32 steps 1.1e-4 on the text page. CUDA's with its last
# float32 steps thin 7.2e-6 (2 threads, AVX2, where CUDA's formed was 6.6e-6). The CPU's
# plan with the tridiagonal application (its way above 448 landmarks) 6.6e-6, with
# eigenvectors (its way at this size's 240) 6.1e-6 (AVX2;
# `tools/analysis_tools/fidelity.py --size 384x640 --paths spectral-mixed
# spectral-tridiagonal`). On CUDA
# itself at 384×640 CUDA's plan is within 4.0e-6; at 640×640 and 800×1344:
# docs/en/notes/numerics.md. CUDA's plan with its float32 products split (emulated):
# 2.1e-6 where CUDA's plan was 2.4e-6 (`fidelity.py --size 384x640 --paths cuda
# cuda+tf32x3`, AVX-512; that tool's weights and images differ from this file's).
@pytest.mark.parametrize('path', MAP_PATHS)
def test_output_maps_keep_the_floor(model, references, path):
    """Each map within 1e-5 of float64, or within twice the float32 official order's
    deviation where float32 itself misses 1e-5 (``output_bounds``)."""
    for name, (x, refs, bounds) in references.items():
        devs = output_deviations(model, x, refs, MAP_PATHS[path], device_type='cpu')
        assert all(d <= b for d, b in zip(devs, bounds)), (path, name, devs, bounds)


@pytest.fixture(scope='module')
def photo_gradients(model):
    x = fidelity_image('astronaut', SIZE)
    return x, reference_gradients(model, x)


# Worst parameter, same configurations: the CPU's plan 5.7e-6, CUDA's 7.7e-6, CUDA's with
# the float32 iterate 6.4e-6 (the floor is 1e-4: ≥ 13× margin); with its float32 products
# split, 4.1e-6 where CUDA's was 3.5e-6 (fidelity.py, astronaut, its own weights).
@pytest.mark.parametrize('path', PATHS)
def test_training_gradients_keep_the_floor(model, photo_gradients, path):
    """One training step's gradients on a natural photo, BatchNorm in eval mode: every
    parameter's gradient within 1e-4 (norm-relative) of the float64 official order."""
    x, refs = photo_gradients
    devs = gradient_deviations(model, x, refs, PATHS[path], device_type='cpu')
    assert len(devs) == len(refs) > 100  # every tensor, none zero by construction
    worst = max(devs, key=devs.get)
    assert devs[worst] <= GRADIENT_TOL, (path, worst, devs[worst])


def test_the_floor_tells_tf32_without_float32_steps_apart(model, references):
    """The output test can fail: 'tf32' with all 20 steps in TF32 (no float32 steps)
    misses the floor on the text page (1.1e-4, emulated by rounding to nearest)."""
    from dataclasses import replace
    plan = replace(PLANS['cuda'], pinv='tf32', tf32_float32_steps=(0, 0), thin_steps=0)
    x, refs, bounds = references['page']
    devs = output_deviations(model, x, refs, plan, device_type='cpu')
    assert any(d > b for d, b in zip(devs, bounds)), (devs, bounds)


def test_relu_flips_are_counted():
    """A ReLU input that float32 rounds to the other side of 0 than float64 is counted
    (1e8 + 1 - 1e8: 1 in float64, 0 in float32)."""
    from mmsoft.testing import reference_relu_inputs, relu_flips
    net = torch.nn.Sequential(torch.nn.Linear(3, 1, bias=False), torch.nn.ReLU())
    with torch.no_grad():
        net[0].weight.fill_(1.)
    for x, counted in (([[1e8, 1., -1e8]], (1, 1.0)), ([[1e8, 16., -1e8]], (0, float('inf')))):
        x = torch.tensor(x)
        assert relu_flips(net, x, reference_relu_inputs(net, x)) == counted
