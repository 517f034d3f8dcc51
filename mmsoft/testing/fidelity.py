"""SOFT's fidelity where users see it: a network's output maps and a training step's
parameter gradients, against the float64 computation in the official order.

The floor every default path keeps (docs/en/notes/numerics.md):

- each output map within ``OUTPUT_TOL`` (max |Δ| / max |ref| per map) of the float64
  model run in the official order (``attention_plan(order='official')``: P computed
  twice, the m×m iterate formed, (P·Â)·(Pᵀ·V)), on real images, flat ones included, or
  within twice the float32 official order's deviation on that map where float32 itself
  misses ``OUTPUT_TOL`` (``output_bounds``);
- the parameter gradients of one training step within ``GRADIENT_TOL`` (‖Δ‖ / ‖ref‖ per
  tensor) on natural photos, BatchNorm in eval mode, tensors not zero by construction.

Used by tests/models/backbones/test_fidelity.py and tools/analysis_tools/fidelity.py.
"""
import copy
from contextlib import nullcontext

import numpy as np
import torch

from ..models.attention import attention_plan
from .numerics import relative_deviation

__all__ = [
    'FIDELITY_IMAGES', 'GRADIENT_TOL', 'NATURAL_IMAGES', 'OUTPUT_TOL', 'fidelity_image',
    'gradient_deviations', 'output_bounds', 'output_deviations', 'reference_gradients',
    'reference_outputs', 'reference_relu_inputs', 'relu_flips'
]

OUTPUT_TOL = 1e-5
GRADIENT_TOL = 1e-4

# Images with what makes them hard: flat regions make landmarks (near) duplicates.
FIDELITY_IMAGES = {
    'astronaut': 'natural photo (scikit-image astronaut)',
    'coffee': 'natural photo (scikit-image coffee)',
    'chelsea': 'natural photo (scikit-image chelsea, a cat)',
    'rocket': 'photo with a large flat sky (scikit-image rocket)',
    'horse': 'binary silhouette (scikit-image horse)',
    'page': 'scanned text page (scikit-image page)',
    'blank': 'near-blank wall: one grey with ±2 levels of noise',
}
# The gradient floor's images. Not the flat ones: there some gradients are cancelling
# sums that float32 alone moves by ~1e-3 (rocket at 640×640: 2.1e-3 on a stage-2 depthwise
# conv, the same for every path, the float32 official order included).
NATURAL_IMAGES = ('astronaut', 'coffee', 'chelsea')

_MEAN = (123.675, 116.28, 103.53)
_STD = (58.395, 57.12, 57.375)


def fidelity_image(name, size):
    """Image ``name`` (``FIDELITY_IMAGES``) resized to ``size`` = (H, W), as a (1, 3, H, W)
    float32 tensor normalized with the ImageNet statistics of the shipped configs."""
    from PIL import Image
    if name not in FIDELITY_IMAGES:
        raise ValueError(f'image must be one of {sorted(FIDELITY_IMAGES)}, got {name!r}')
    if name == 'blank':
        noise = np.random.default_rng(0).integers(-2, 3, (64, 64, 1))
        img = np.clip(np.array([182, 176, 165]) + noise, 0, 255).astype(np.uint8)
    else:
        from skimage import data as skdata
        img = getattr(skdata, name)()
        if img.dtype == bool:
            img = img.astype(np.uint8) * 255
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, -1)
    H, W = size
    img = np.asarray(Image.fromarray(img[..., :3]).resize((W, H), Image.BILINEAR))
    x = torch.from_numpy(img.copy()).permute(2, 0, 1).float()[None]
    return (x - torch.tensor(_MEAN).view(1, 3, 1, 1)) / torch.tensor(_STD).view(1, 3, 1, 1)


def _float64_official(model):
    """A float64 copy of ``model`` and the context that runs it in the official order."""
    return copy.deepcopy(model).double(), attention_plan(order='official')


def _forced(plan, device_type):
    """``plan`` forced for ``device_type`` inside the block (nothing for None)."""
    return attention_plan(plan, device=device_type) if plan is not None else nullcontext()


def reference_outputs(model, x):
    """The output maps of ``model`` on ``x`` in float64, in the official order."""
    ref, order = _float64_official(model)
    with torch.no_grad(), order:
        return [o.detach() for o in ref(x.double())]


def output_deviations(model, x, refs, plan=None, device_type=None):
    """Per output map, max |out - ref| / max |ref| of ``model`` (float32) on ``x`` under
    ``plan`` (an ``AttentionPlan`` forced for ``device_type``, default x's: e.g. CUDA's
    plan run on the CPU with TF32 emulated), without gradients."""
    with torch.no_grad(), _forced(plan, device_type or x.device.type):
        outs = model(x)
    return [relative_deviation(o, r) for o, r in zip(outs, refs)]


def output_bounds(model, x, refs, device_type=None):
    """Per output map, the deviation a path may have: ``OUTPUT_TOL``, or twice the
    float32 official order's (``output_deviations`` under ``order='official'``) where
    that is larger. float32 alone can miss ``OUTPUT_TOL``: on the cat photo at 384×640,
    one thread without SIMD kernels on an AVX2 CPU, the official order in float32 is
    1.06e-5 from float64 on stage 4's map (every path 1.0e-5 to 1.1e-5 there)."""
    device_type = device_type or x.device.type
    with attention_plan(order='official', device=device_type):
        official = output_deviations(model, x, refs)
    return [max(OUTPUT_TOL, 2 * d) for d in official]


def _loss(outs):
    """A training loss whose gradients reach every parameter: each output map against a
    fixed random map (seeded by its index, the same in every dtype). Not the maps' mean
    squares: after the final LayerNorm those are ~1 whatever the input, so stage 4's
    gradients would cancel to rounding noise."""
    loss = 0
    for i, o in enumerate(outs):
        g = torch.randn(o.shape, generator=torch.Generator().manual_seed(i),
                        dtype=torch.float64)
        loss = loss + (o * g.to(o.device, o.dtype)).mean()
    return loss


def _gradients(model, x):
    model.zero_grad(set_to_none=True)
    _loss(model(x)).backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()
            if p.grad is not None}


def reference_gradients(model, x):
    """One training step's parameter gradients in float64, in the official order, with
    ``model``'s BatchNorm in eval mode (the model is put in eval mode: SOFT's training
    path runs whenever gradients are needed, and without drop path or dropout eval mode
    differs from train mode only in BatchNorm)."""
    ref, order = _float64_official(model.eval())
    with order:
        return _gradients(ref, x.double())


def gradient_deviations(model, x, refs, plan=None, device_type=None):
    """Per parameter, ‖∇ - ∇ref‖ / ‖∇ref‖ of one float32 training step of ``model`` (eval
    mode) on ``x`` under ``plan`` (as in ``output_deviations``). Parameters whose
    reference gradient is zero by construction (≤ 1e-12 of the largest) are left out."""
    with _forced(plan, device_type or x.device.type):
        grads = _gradients(model.eval(), x)
    scale = max(g.abs().max() for g in refs.values())
    out = {}
    for k, ref in refs.items():
        if ref.abs().max() <= 1e-12 * scale:
            continue
        out[k] = ((grads[k].double() - ref).norm() / ref.norm()).item()
    return out


def reference_relu_inputs(model, x):
    """The inputs of every ReLU of ``model`` on ``x`` in float64, in the official order
    (``relu_flips``' reference)."""
    from ..analysis import module_inputs
    ref, order = _float64_official(model)
    with order:
        return module_inputs(ref, x.double(), torch.nn.ReLU)


def relu_flips(model, x, refs, plan=None, device_type=None):
    """How many ReLU inputs of ``model`` on ``x`` under ``plan`` (float32) lie on the other
    side of 0 than the reference's ``refs`` (``reference_relu_inputs``), and the smallest
    |input| among them.

    A ReLU input within rounding of 0 may flip with any change of the forward at the
    1e-6 level, and the whole gradient through that element with it: one flip in a flat
    region moved stage 1's parameter gradients by ~5e-2 at 640×640. Such a gradient
    deviation is a discrete event, not the path's accuracy: the tool reports it beside
    the gradients.
    """
    from ..analysis import module_inputs
    with _forced(plan, device_type or x.device.type):
        inputs = module_inputs(model, x, torch.nn.ReLU)
    flips, smallest = 0, float('inf')
    for name, (_, a) in inputs.items():
        b = refs[name][1]
        changed = (a > 0) != (b > 0)
        if changed.any():
            flips += int(changed.sum())
            smallest = min(smallest, float(b[changed].abs().min()))
    return flips, smallest
