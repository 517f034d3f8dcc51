"""What users of a backbone run into: odd sizes, batch sizes, half precision, flat and
non-finite images, and whole models built from the shipped configs at such sizes."""
import contextlib
import os.path as osp

import pytest
import torch

from mmsoft.models import SOFT, XCiTSimA
from conftest import ROOT, cpu_autocast_supports

SIZES = [(32, 32), (33, 47), (97, 131), (300, 2000), (2000, 300)]
# float16 only where this torch's CPU autocast takes it (not torch 2.1)
DTYPES = [d for d in (torch.float32, torch.float16, torch.bfloat16)
          if d == torch.float32 or cpu_autocast_supports(d)]


def autocast(dtype):
    """CPU autocast to ``dtype``; float32: none (torch 2.1 refuses a float32 autocast
    even when it is disabled)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast('cpu', dtype=dtype)


def conv_out(n, times):
    for _ in range(times):
        n = (n - 1) // 2 + 1
    return n


def expected_shapes(model, h, w):
    """A convolutional backbone's sizes, ⌈H / s⌉ × ⌈W / s⌉ for strides 4, 8, 16, 32."""
    widths = model.embed_dims if isinstance(model, SOFT) else [model.embed_dims] * 4
    return [(widths[i], conv_out(h, i + 2), conv_out(w, i + 2)) for i in range(4)]


@pytest.fixture(scope='module')
def backbones():
    soft = SOFT(arch='tiny', drop_path_rate=0.)
    xcit = XCiTSimA(arch='t12', drop_path_rate=0.)
    for m in (soft, xcit):
        m.init_weights()
        m.eval()
    return {'SOFT': soft, 'XCiTSimA': xcit}


def check_sizes(model, hw, batch, dtypes):
    x = torch.randn(batch, 3, *hw)
    for dtype in dtypes:
        with torch.no_grad(), autocast(dtype):
            outs = model(x)
        shapes = [tuple(o.shape[1:]) for o in outs]
        assert shapes == expected_shapes(model, *hw), (dtype, shapes)
        for o in outs:
            assert o.shape[0] == batch and torch.isfinite(o).all(), (dtype, batch)


def is_large(hw):
    return hw[0] * hw[1] > 200 * 200


@pytest.mark.parametrize('name', ['SOFT', 'XCiTSimA'])
@pytest.mark.parametrize('hw', SIZES, ids=lambda s: f'{s[0]}x{s[1]}')
def test_sizes_batches_and_precisions(backbones, name, hw):
    """Batches of 1 and 3 in every precision; the large inputs in float32, one image (in
    half precision and in a batch: the next test)."""
    if is_large(hw):
        check_sizes(backbones[name], hw, 1, DTYPES[:1])
    else:
        for batch in (1, 3):
            check_sizes(backbones[name], hw, batch, DTYPES)


@pytest.mark.slow  # CPU autocast at 600k pixels: 45-51 s per size for SOFT, 2 CPU cores
@pytest.mark.parametrize('name', ['SOFT', 'XCiTSimA'])
@pytest.mark.parametrize('hw', [s for s in SIZES if is_large(s)],
                         ids=lambda s: f'{s[0]}x{s[1]}')
def test_large_inputs_in_half_precision_and_in_a_batch(backbones, name, hw):
    check_sizes(backbones[name], hw, 1, DTYPES[1:])
    check_sizes(backbones[name], hw, 3, DTYPES[:1])


@pytest.mark.parametrize('name', ['SOFT', 'XCiTSimA'])
def test_flat_image_is_finite(backbones, name):
    """Constant images (the position embeddings still tell the tokens apart, so SOFT's
    landmark kernel is ill-conditioned here, not singular: see the next test)."""
    with torch.no_grad():
        for value in (0., 1.):
            outs = backbones[name](torch.full((2, 3, 64, 96), value))
            assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('pinv_method', ['iterative', 'spectral', 'tf32'])
def test_equal_landmarks_singular_kernel(monkeypatch, pinv_method):
    """All m landmarks of a head equal: A = κ(Q̃, Q̃) is the all-ones matrix, rank 1.
    The Newton iterate converges to its Moore–Penrose inverse 11ᵀ/m² (paper Alg. 2: the zero
    eigenvalues map to 0), so with D = m·I every row of P equal to p_i·1ᵀ gives
    P·Â·Pᵀ·V = p·(pᵀ·V)/m: the attention of one landmark, divided by m."""
    from mmsoft.models.attention import gaussian_kernel
    from mmsoft.models.backbones import soft
    landmarks, attention, calls = soft.SoftKernelAttention.landmarks, soft.soft_attention, []

    def equal_landmarks(self, q, hw):
        lm = landmarks(self, q, hw)
        return lm.mean(-2, keepdim=True).expand_as(lm).contiguous()

    def recorded(q, lm, v, **kwargs):
        out = attention(q, lm, v, **kwargs)
        calls.append((q, lm, v, out))
        return out

    monkeypatch.setattr(soft.SoftKernelAttention, 'landmarks', equal_landmarks)
    monkeypatch.setattr(soft, 'soft_attention', recorded)
    model = SOFT(arch='tiny', pinv_method=pinv_method, drop_path_rate=0.)
    model.init_weights()
    with torch.no_grad():
        outs = model.eval()(torch.randn(2, 3, 128, 160))
    assert all(torch.isfinite(o).all() for o in outs)
    assert len(calls) == sum(model.depths[:3])
    for q, lm, v, out in calls:
        lm64 = lm.double()
        A = gaussian_kernel(lm64, lm64)
        assert lm.shape[-2] == 20 and (torch.linalg.matrix_rank(A) == 1).all()
        p = gaussian_kernel(q.double(), lm64[..., :1, :])  # (B, h, N, 1)
        expected = p @ (p.transpose(-1, -2) @ v.double()) / lm.shape[-2]
        assert torch.isfinite(out).all()
        err = ((out.double() - expected).abs().max() / expected.abs().max()).item()
        assert err < 1e-5, err


@pytest.mark.parametrize('name', ['SOFT', 'XCiTSimA'])
def test_non_finite_input_is_reported(backbones, name):
    for bad in (float('nan'), float('inf')):
        x = torch.randn(1, 3, 64, 64)
        x[0, 1, 5, 7] = bad
        with pytest.raises(ValueError, match='NaN or inf'):
            backbones[name](x)


def test_minimum_sizes_are_documented_errors():
    with pytest.raises(ValueError, match='at least 29×29'):
        SOFT(arch='tiny')(torch.randn(1, 3, 28, 200))
    SOFT(arch='tiny').eval()(torch.randn(1, 3, 29, 29))
    # XCiTSimA has no minimum: every level of a 1×1 image is 1×1 (the contract tests)
    with pytest.raises(ValueError, match=r'\(B, C, H, W\)'):
        SOFT(arch='tiny')(torch.randn(3, 64, 64))


def _build(cfg_rel):
    from mmsoft.apis import init_model
    return init_model(osp.join(ROOT, 'configs', cfg_rel)).eval()


@pytest.mark.openmmlab  # mmdet and mmseg build the models
@pytest.mark.parametrize('cfg', ['soft/retinanet_soft-t_fpn_1x_coco.py',
                                 'soft/upernet_soft-s_8xb2-160k_ade20k-512x512.py'])
def test_shipped_models_on_odd_sizes(cfg):
    """Odd sizes in half precision and in a batch; the extreme aspect ratio through the
    detector's FPN, which adds each level to the next one up (UperNet resizes every level
    to the first one's size, whatever the sizes; the backbone alone at 300×2000: above).
    UperNet's head under CPU autocast takes a slow path: one forward at 97×131 took 22 s
    in float16 or bfloat16 against 0.25 s in float32, so it runs half precision at
    33×47."""
    model = _build(cfg)
    half = torch.float16 if cpu_autocast_supports(torch.float16) else torch.bfloat16
    if 'retinanet' in cfg:
        sizes = [((33, 47), 3, torch.bfloat16), ((97, 131), 1, half),
                 ((300, 2000), 1, torch.float32)]
    else:
        sizes = [((33, 47), 3, torch.bfloat16), ((33, 47), 1, half),
                 ((97, 131), 1, torch.float32)]
    for hw, batch, dtype in sizes:
        x = torch.randn(batch, 3, *hw)
        with torch.no_grad(), autocast(dtype):
            out = model._forward(x)
        flat = out if isinstance(out, torch.Tensor) else [
            t for level in out for t in (level if isinstance(level, (list, tuple))
                                         else [level])]
        flat = [flat] if isinstance(flat, torch.Tensor) else flat
        assert all(torch.isfinite(t).all() for t in flat), (cfg, hw, dtype)


@pytest.mark.parametrize('name', ['SOFT', 'XCiTSimA'])
def test_norm_eval_freezes_batch_norm_statistics(name):
    """norm_eval=True (frozen BN, e.g. for multi-process CPU training, where SyncBN is not
    available): BN layers stay in eval mode in train(), their statistics do not move."""
    from torch.nn.modules.batchnorm import _BatchNorm
    cls, arch = (SOFT, 'tiny') if name == 'SOFT' else (XCiTSimA, 't12')
    for norm_eval in (True, False):
        model = cls(arch=arch, norm_eval=norm_eval, drop_path_rate=0.).train()
        bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
        assert bns and all(m.training != norm_eval for m in bns)
        before = [m.running_mean.clone() for m in bns]
        model(torch.randn(2, 3, 64, 64) * 3 + 1)
        same = all(torch.equal(b, m.running_mean) for b, m in zip(before, bns))
        assert same == norm_eval
        assert model.training


@pytest.mark.parametrize('cls, arch', [(SOFT, 'tiny'), (XCiTSimA, 't12')],
                         ids=['SOFT', 'XCiTSimA'])
@pytest.mark.parametrize('kwargs, match', [
    (dict(drop_path_rate=1.0), 'drop_path_rate'),
    (dict(drop_path_rate=-0.1), 'drop_path_rate'),
    (dict(frozen_stages=-2), 'frozen_stages'),
    (dict(frozen_stages=1.5), 'frozen_stages'),
    (dict(norm_eval='yes'), 'norm_eval'),
    (dict(with_cp=1), 'with_cp'),
    (dict(out_indices=()), 'out_indices'),
], ids=lambda v: str(v) if isinstance(v, dict) else '')
def test_shared_arguments_are_checked_alike(cls, arch, kwargs, match):
    """The arguments every family has are checked by the base class, with the family's
    name in the message."""
    with pytest.raises(ValueError, match=f'{cls.__name__}: {match}'):
        cls(arch=arch, **kwargs)
