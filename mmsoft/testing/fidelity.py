"""SOFT's fidelity where users see it: a network's output maps and a training step's
parameter gradients, against the float64 computation in the official order.

The floor every default path keeps (docs/en/notes/numerics.md):

- each output map within ``OUTPUT_TOL`` (max |Δ| / max |ref| per map) of the float64
  model run in the official order (``official_order``: P computed twice, the reference
  iterate formed, (P·Â)·(Pᵀ·V)), on real images, flat ones included, or
  within twice the float32 official order's deviation on that map where float32 itself
  misses ``OUTPUT_TOL`` (``output_bounds``);
- the parameter gradients of one training step within ``GRADIENT_TOL`` (‖Δ‖ / ‖ref‖ per
  tensor), BatchNorm in eval mode, tensors not zero by construction, against the
  float64 step that takes the float32 step's branch at every ReLU input within rounding
  of 0 (``gradient_deviations``: such a flip moves the gradients by up to ~5e-2 on any
  path, the float32 official order's included), or within twice the float32 official
  order's deviation where that is larger.

Used by tests/models/backbones/test_fidelity.py and tools/analysis_tools/fidelity.py.
"""
import copy
from contextlib import contextmanager, nullcontext
from typing import Dict, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ..models.attention import attention_plan
from ..models.attention import soft as soft_math
from .numerics import relative_deviation

__all__ = [
    'FIDELITY_IMAGES', 'FLIP_TOL', 'GRADIENT_TOL', 'GradientDeviations', 'GradientReference',
    'NATURAL_IMAGES', 'OUTPUT_TOL', 'check_crop', 'fidelity_image', 'gradient_deviations',
    'official_order', 'output_bounds', 'output_deviations', 'reference_gradients',
    'reference_outputs'
]

OUTPUT_TOL = 1e-5
GRADIENT_TOL = 1e-4
# A ReLU input that a float32 step puts on the other side of 0 than float64 is a flip of
# rounding where its |float64 value| is at most this share of its ReLU's largest |input|
# (the output floor's share; the flips measured sat at 3e-9 to 2e-7: numerics.md).
FLIP_TOL = OUTPUT_TOL

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
# The fidelity tool's gradient images by default (a reference per image; the floor holds
# on every image of FIDELITY_IMAGES, flat ones included: tests/models/backbones/
# test_fidelity.py sweeps them).
NATURAL_IMAGES = ('astronaut', 'coffee', 'chelsea')

_MEAN = (123.675, 116.28, 103.53)
_STD = (58.395, 57.12, 57.375)


def check_crop(crop, size):
    """``crop`` = (top, left, height, width) as a tuple of 4 ints, checked to fit in an
    image of ``size`` = (H, W); ValueError otherwise."""
    H, W = size
    try:
        top, left, h, w = (int(v) for v in crop)
    except (TypeError, ValueError):
        raise ValueError(f'crop must be 4 ints (top, left, height, width), got {crop!r}')
    if top < 0 or left < 0 or h < 1 or w < 1 or top + h > H or left + w > W:
        raise ValueError(f'crop (top, left, height, width) = {(top, left, h, w)} does not '
                         f'fit in the {H}×{W} image')
    return top, left, h, w


def fidelity_image(name, size, crop=None):
    """Image ``name`` (``FIDELITY_IMAGES``) resized to ``size`` = (H, W), as a (1, 3, H, W)
    float32 tensor normalized with the ImageNet statistics of the shipped configs; with
    ``crop`` = (top, left, height, width), that window of the resized image."""
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
    if crop is not None:
        top, left, h, w = check_crop(crop, size)
        img = img[top:top + h, left:left + w]
    x = torch.from_numpy(img.copy()).permute(2, 0, 1).float()[None]
    return (x - torch.tensor(_MEAN).view(1, 3, 1, 1)) / torch.tensor(_STD).view(1, 3, 1, 1)


@contextmanager
def official_order():
    """Inside the block every SOFT layer computes its attention in the official order,
    ``official_order_attention`` ((P·Â)·(Pᵀ·V), the reference iterate formed), whatever
    its ``pinv_method`` and the plan: the reference of the floor, and the official cost
    the benchmark times. (It swaps the function the SOFT backbone calls, for this
    process: a test and tool helper, not a mode of the library.)"""
    from ..models.backbones import soft as backbone

    def official(q, landmarks, v, iters=20, normalize=True, pinv_method='auto', plan=None):
        return soft_math.official_order_attention(q, landmarks, v, iters, normalize)

    before = backbone.soft_attention
    backbone.soft_attention = official
    try:
        yield
    finally:
        backbone.soft_attention = before


def _float64_official(model):
    """A float64 copy of ``model`` and the context that runs it in the official order."""
    return copy.deepcopy(model).double(), official_order()


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
    float32 official order's (``output_deviations`` under ``official_order``) where
    that is larger. float32 alone can miss ``OUTPUT_TOL``: on the cat photo at 384×640,
    one thread without SIMD kernels on an AVX2 CPU, the official order in float32 is
    1.06e-5 from float64 on stage 4's map (every path 1.0e-5 to 1.1e-5 there)."""
    with official_order():
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


@contextmanager
def _relu_branches(model, record=None, force=None, signs=False):
    """Inside the block every ``nn.ReLU`` of ``model`` writes its input into ``record``
    ({name: tensor}; with ``signs``, only where it is > 0, a bool tensor) and, where
    ``force`` ({name: bool tensor}) names it, passes exactly where its mask is True (a
    forced input within rounding of 0 passes as itself, not as 0; its gradient passes
    where the mask is True)."""
    relus = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ReLU)]

    def forward(name, mod):
        def relu(x):
            if record is not None:
                record[name] = x.detach() > 0 if signs else x.detach().clone()
            if force is not None and name in force:
                if x.requires_grad:
                    # the gradient handed back contiguous, as ReLU's own backward hands
                    # it: where's keeps the incoming layout, which for a patch
                    # embedding's last ReLU is channels-last with a batch stride (batch
                    # 1) that torch 2.14's CPU BatchNorm backward misreads
                    x.register_hook(torch.Tensor.contiguous)
                return torch.where(force[name], x, 0.)
            return F.relu(x, inplace=mod.inplace)
        return relu

    for name, mod in relus:
        mod.forward = forward(name, mod)
    try:
        yield
    finally:
        for _, mod in relus:
            del mod.forward


def _gradients(model, x, record=None, force=None, signs=False):
    model.zero_grad(set_to_none=True)
    with _relu_branches(model, record, force, signs):
        _loss(model(x)).backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()
            if p.grad is not None}


class GradientReference(NamedTuple):
    """One training step of a model in float64, in the official order
    (``reference_gradients``).

    Attributes:
        gradients (dict[str, Tensor]): every parameter's gradient.
        relu_inputs (dict[str, Tensor]): the input of every ``nn.ReLU`` in its forward.
    """
    gradients: Dict[str, torch.Tensor]
    relu_inputs: Dict[str, torch.Tensor]


def reference_gradients(model, x, branches=None):
    """One training step's parameter gradients in float64, in the official order, with
    ``model``'s BatchNorm in eval mode (the model is put in eval mode: SOFT's training
    path runs whenever gradients are needed, and without drop path or dropout eval mode
    differs from train mode only in BatchNorm).

    Args:
        branches (dict[str, Tensor], optional): {ReLU name: bool mask}: those ReLUs pass
            exactly where their mask is True (the branches a float32 run took,
            ``gradient_deviations``) instead of where their float64 input is > 0.
    Returns:
        GradientReference
    """
    ref, order = _float64_official(model.eval())
    inputs = {}
    with order:
        grads = _gradients(ref, x.double(), record=inputs, force=branches)
    return GradientReference(grads, inputs)


class GradientDeviations(NamedTuple):
    """A float32 training step against the float64 one (``gradient_deviations``).

    Attributes:
        deviations (dict[str, float]): per parameter, ‖∇ - ∇ref‖ / ‖∇ref‖ against the
            float64 step that takes the same branch at every ReLU input within rounding
            of 0 (``FLIP_TOL``) as the float32 step did.
        flips (int): how many ReLU inputs the float32 step put on the other side of 0
            than float64 did, each within rounding of 0.
        largest_flip (float): the largest of those inputs' |float64 value|, relative to
            the largest |input| of its ReLU (0 without flips).
        with_flips (dict[str, float]): the deviations against the float64 step's own
            branches: what the flips did besides the rounding (``deviations`` where
            there is none).
        beyond_rounding (int): ReLU inputs on the other side of 0 by more than
            ``FLIP_TOL``: not rounding (their branch is the float64 step's in
            ``deviations`` too, so that they count against the path).
    """
    deviations: Dict[str, float]
    flips: int
    largest_flip: float
    with_flips: Dict[str, float]
    beyond_rounding: int


def _relative(grads, refs, scale):
    """‖∇ - ∇ref‖ / ‖∇ref‖ per parameter whose reference is not zero by construction
    (≤ 1e-12 of ``scale``, the largest reference entry)."""
    return {k: ((grads[k].double() - ref).norm() / ref.norm()).item()
            for k, ref in refs.items() if ref.abs().max() > 1e-12 * scale}


def gradient_deviations(model, x, ref, plan=None, device_type=None):
    """One float32 training step of ``model`` (eval mode) on ``x`` under ``plan`` (as in
    ``output_deviations``) against the float64 step ``ref`` (``reference_gradients``).

    A ReLU input within rounding of 0 can land on the other side of 0 in float32 than in
    float64, on any path (the float32 official order's too), and the gradient through
    it goes with it: one such flip in a patch embedding moves the parameter gradients
    before it by up to ~5e-2 (docs/en/notes/numerics.md). That is a discrete event of the
    float32 forward, not the rounding of the backward: ``deviations`` compares with the
    float64 step run along the float32 step's branches at those inputs (the float64
    reference again, only where there are flips), ``with_flips`` with ``ref`` itself.
    Parameters whose reference gradient is zero by construction are left out.

    Returns:
        GradientDeviations
    """
    passed = {}  # where each ReLU's float32 input was > 0
    with _forced(plan, device_type or x.device.type):
        grads = _gradients(model.eval(), x, record=passed, signs=True)
    scale = max(g.abs().max() for g in ref.gradients.values())
    with_flips = _relative(grads, ref.gradients, scale)
    branches, flips, largest, beyond = {}, 0, 0., 0
    for name, r in ref.relu_inputs.items():
        flipped = passed[name] != (r > 0)
        if not flipped.any():
            continue
        size = r.abs() / r.abs().max()
        rounding = flipped & (size <= FLIP_TOL)
        beyond += int((flipped & ~rounding).sum())
        if rounding.any():
            flips += int(rounding.sum())
            largest = max(largest, float(size[rounding].max()))
            branches[name] = torch.where(rounding, ~(r > 0), r > 0)
    if not branches:
        return GradientDeviations(with_flips, 0, 0., with_flips, beyond)
    matched = reference_gradients(model, x, branches).gradients
    return GradientDeviations(_relative(grads, matched, scale), flips, largest, with_flips,
                              beyond)
