"""The SOFT backbone: parity with the official code, shapes, options, checkpoints."""
import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import SOFT_FIXTURE_ARCH as FIXTURE_ARCH
from conftest import data_path, fixture_model, needs_one_graph_dynamo, rel_err

from mmsoft import checkpoint
from mmsoft.models import SOFT
from mmsoft.models.attention import attention_plan
from mmsoft.models.backbones.soft import HeadSharedConv
from mmsoft.models.backbones.soft import guard_gelu_grad

CKPT = data_path('soft_public_checkpoint.pth')


@pytest.fixture(scope='module')
def expected():
    return torch.load(data_path('soft_public_expected.pth'))


# Every exact pinv mode reproduced the official outputs to 6.4e-7–8.8e-7 (max over the
# four maps; 2-core x86, 2 threads), to 8.3e-7–9.5e-7 with OMP_NUM_THREADS=1 and
# ATEN_CPU_CAPABILITY=default; the official float32 outputs are themselves 2.6e-6 from
# the float64 iterate. 19 or 21 Newton steps instead of 20 deviate by 5.5e-4 / 8.8e-5
# (both configurations): 1e-5 is 10x the largest of the first and tells both apart.
PARITY_TOL = 1e-5
STAGES = ['stage1', 'stage2', 'stage3', 'stage4_norm']


def max_parity_error(expected, grad=False, **kwargs):
    model = fixture_model(**kwargs)
    with torch.set_grad_enabled(grad):
        outs = model(expected['input'])
    for out, name in zip(outs, STAGES):
        assert out.shape == expected[name].shape, name
    return max(rel_err(out, expected[name]) for out, name in zip(outs, STAGES))


@pytest.mark.parametrize('pinv_method', ['auto', 'iterative', 'spectral', 'tf32'])
def test_parity_with_official_checkpoint(expected, pinv_method):
    """Inference (the iterate applied without forming it) and a forward with gradients
    (memory-lean kernel products, the iterate formed for backward) both match."""
    for grad in (False, True):
        err = max_parity_error(expected, grad=grad, pinv_method=pinv_method)
        assert err <= PARITY_TOL, (pinv_method, grad, err)


@pytest.mark.parametrize('iters', [19, 21])
def test_parity_tolerance_tells_newton_steps_apart(expected, iters):
    assert max_parity_error(expected, newton_iters=iters) > PARITY_TOL


@pytest.mark.parametrize('layout', ['images', 'channels'])
def test_parity_in_both_local_conv_layouts(expected, layout, force_plan):
    force_plan(local_conv_layout=layout, device='cpu')
    assert max_parity_error(expected) <= PARITY_TOL


def test_parity_in_the_official_order(expected):
    """The official computation order (the reference, ``official_order``) on the fixture."""
    from mmsoft.testing import official_order
    with official_order():
        assert max_parity_error(expected) <= PARITY_TOL


def test_local_conv_layouts_compute_the_official_conv():
    """Both layouts of the depthwise conv on V give the values and gradients of a conv of
    every (head, channel) map with its head's filter; a layer's plan picks the layout."""
    torch.manual_seed(0)
    B, h, d, (H, W), k = 2, 3, 4, (7, 9), 5
    conv = HeadSharedConv(h, d, k).double()
    # V as the projection makes it: (B, N, h, d) memory viewed as (B, h, N, d)
    v0 = torch.randn(B, H * W, h, d, dtype=torch.float64).transpose(1, 2)
    grad_out = torch.randn(B, h, H * W, d, dtype=torch.float64)

    def reference(v):  # one map at a time: (B, 1, H, W) with the head's (1, 1, k, k)
        maps = v.transpose(-1, -2).reshape(B, h, d, 1, H, W)
        out = torch.stack([torch.stack([
            F.conv2d(maps[:, i, j], conv.weight[i:i + 1], padding=k // 2)
            for j in range(d)], 2) for i in range(h)], 1)  # (B, h, d, 1, H, W)
        return out.reshape(B, h, d, H * W).transpose(-1, -2)

    v = v0.clone().requires_grad_()
    ref = reference(v)
    ref_grads = torch.autograd.grad((ref * grad_out).sum(), (v, conv.weight))
    for layout in ('images', 'channels'):
        v = v0.clone().requires_grad_()
        out = conv(v, (H, W), layout)
        out.backward(grad_out)
        for got, want in zip((out, v.grad, conv.weight.grad), (ref, *ref_grads)):
            assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), layout
        conv.zero_grad()
    with pytest.raises(ValueError, match='layout'):
        conv(v0, (H, W), 'bogus')
    # A SOFT layer runs the layout of its device's plan: 'images' convolves B·d images of
    # h channels, 'channels' B images of h·d channels.
    from mmsoft.models.backbones.soft import SoftKernelAttention
    from mmsoft.testing import LaunchCounter
    layer = SoftKernelAttention(d, h, 1, k).double()
    for layout, images in (('images', (B * d, h)), ('channels', (B, h * d))):
        with attention_plan(local_conv_layout=layout, device='cpu'), \
                LaunchCounter(shapes_of=['convolution']) as ops, torch.no_grad():
            layer(v0, v0, (H, W))
        assert [shape[:2] for shape in ops.shapes['convolution']][-1] == images, layout


def test_parity_needs_the_normalization(expected):
    """Switching attention normalization off must change the outputs (it is not a no-op)."""
    model = fixture_model(attn_normalize=False)
    with torch.no_grad():
        outs = model(expected['input'])
    assert rel_err(outs[0], expected['stage1']) > 1e-2


def test_loads_mmengine_and_plain_formats(tmp_path, expected):
    ref = fixture_model()
    sd = ref.state_dict()
    torch.save({'state_dict': {'backbone.' + k: v for k, v in sd.items()},
                'meta': {}}, tmp_path / 'mm.pth')
    torch.save(sd, tmp_path / 'plain.pth')
    for name in ('mm.pth', 'plain.pth'):
        model = fixture_model(init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / name)))
        for k, v in model.state_dict().items():
            assert torch.equal(v, sd[k]), k


def test_prefers_ema_weights(tmp_path):
    """timm checkpoints hold the training weights and their EMA; evaluation uses the EMA
    (as the official repository's evaluation does). The fixture's two copies are equal, so perturb the EMA copy."""
    ck = checkpoint.load(CKPT)  # a timm checkpoint: needs the allow-listed Namespace
    ck['state_dict_ema'] = {k: v + 0.01 if v.is_floating_point() else v
                            for k, v in ck['state_dict'].items()}
    path = tmp_path / 'ema.pth'
    torch.save(ck, path)
    own = fixture_model(init_cfg=dict(type='Pretrained', checkpoint=str(path))).state_dict()
    key = 'block1.0.att.mha.W_q.weight'
    assert not torch.equal(ck['state_dict'][key], ck['state_dict_ema'][key])
    for k, v in own.items():
        assert torch.equal(v, ck['state_dict_ema'][k]), k


def save_official_with(tmp_path, transform, name='ckpt.pth'):
    """The fixture checkpoint with its EMA state dict rewritten by ``transform``."""
    ck = checkpoint.load(CKPT)
    torch.save({'state_dict': transform(ck['state_dict_ema'])}, tmp_path / name)
    return str(tmp_path / name)


@pytest.mark.parametrize('prefix', ['model.', 'module.encoder.'])
def test_wrong_prefix_is_named(tmp_path, prefix):
    """Keys under an unknown prefix match nothing: the error names the prefix and the
    init_cfg that loads them (before, the depth check reported depths [0, 0, 0, 0])."""
    path = save_official_with(tmp_path, lambda sd: {prefix + k: v for k, v in sd.items()})
    model = SOFT(arch=FIXTURE_ARCH, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(ValueError, match=rf"matches none.*prefix '{prefix}'.*"
                       rf"prefix='{prefix}'.*Expected keys like \['pos_embed1'.*"
                       rf"found keys like \['{prefix}pos_embed1'"):
        model.init_weights()
    model = fixture_model(init_cfg=dict(type='Pretrained', checkpoint=path, prefix=prefix))
    assert torch.equal(model.block3[1].att.ff1.weight,
                       checkpoint.load(CKPT)['state_dict_ema']['block3.1.att.ff1.weight'])


def test_nested_state_dict_is_named(tmp_path):
    path = save_official_with(tmp_path, lambda sd: {'model': sd})
    model = SOFT(arch=FIXTURE_ARCH, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(ValueError, match=r"nests further dicts under \['model'\]"):
        model.init_weights()


def test_ignored_checkpoint_keys_are_logged(mmengine_log):
    """Loading the ImageNet checkpoint says that the classifier was ignored; a model that
    stops after stage 2 also says that the stages it does not build were."""
    fixture_model()
    line = next(m for m in mmengine_log if 'SOFT: loaded' in m)
    assert "loaded 135 of 137 tensors" in line
    assert "ignored checkpoint keys: ['head.*']" in line
    mmengine_log.clear()
    fixture_model(out_indices=(0, 1))
    assert any('stages 3-4 of the checkpoint are not built' in m for m in mmengine_log)
    line = next(m for m in mmengine_log if 'SOFT: loaded' in m)
    assert "'block3.*', 'block4.*', 'cls_token', 'head.*'" in line


def test_depth_mismatch_is_reported():
    arch = dict(FIXTURE_ARCH, depths=[1, 1, 3, 1])
    model = SOFT(arch=arch, init_cfg=dict(type='Pretrained', checkpoint=CKPT))
    with pytest.raises(ValueError, match=r'depths \[1, 1, 2, 1\].*\[1, 1, 3, 1\]'):
        model.init_weights()


def test_width_mismatch_names_the_parameter():
    arch = dict(FIXTURE_ARCH, embed_dims=[32, 64, 128, 128], num_heads=[1, 2, 4, 4])
    model = SOFT(arch=arch, init_cfg=dict(type='Pretrained', checkpoint=CKPT))
    with pytest.raises(ValueError, match=r'parameter pos_embed3 has shape \(1, 196, 96\)'):
        model.init_weights()


def test_missing_checkpoint_names_the_path():
    model = SOFT(arch=FIXTURE_ARCH, init_cfg=dict(type='Pretrained', checkpoint='/no/such.pth'))
    with pytest.raises(FileNotFoundError, match='/no/such.pth'):
        model.init_weights()


def contrasting_images(size=224):
    """A flat image (near-equal landmarks: kernel row sums near m) and block noise at four
    scales, 224×224 (49 landmarks per kernel in stages 1-3). On the fixture model the α
    of one layer's kernels span 2.4x to 11x over this batch (2.6e-5 to 3.7e-3 over all
    layers)."""
    gen = torch.Generator().manual_seed(0)  # the numbers below are for these images
    flat = torch.zeros(1, 3, size, size)
    noise = [F.interpolate(amp * torch.randn(1, 3, size // b, size // b, generator=gen),
                           scale_factor=b) for b, amp in ((32, 8), (16, 2), (8, 2), (4, 1))]
    return torch.cat([flat, *noise])


def batch_deviation(model, x):
    """Max over the images and the four maps of rel_err(batched, the image alone)."""
    with torch.no_grad():
        batched = model(x)
        return max(rel_err(b[i:i + 1], s) for i in range(len(x))
                   for b, s in zip(batched, model(x[i:i + 1])))


# batch_deviation of contrasting_images on the fixture model (2-core x86, torch 2.14.1):
# 1.5e-6 to 1.7e-6 with the per-matrix α, under 2 threads or OMP_NUM_THREADS=1, with
# ATEN_CPU_CAPABILITY avx512 (this CPU's), avx2 or default (float32 sums in another order
# for another batch size, through five blocks); 8.0e-4 with one α for the whole batch.
# 3e-5 is 18x above the first and 27x below the second.
BATCH_TOL = 3e-5


def test_batch_invariance(monkeypatch):
    """An image's outputs do not depend on the other images of its batch: the Newton
    inverse's α is chosen per landmark kernel. Negative control: the official code's
    batch-global α (the smallest of the batch, from its largest row sum) breaks it."""
    from mmsoft.models.attention import newton
    model = fixture_model()
    x = contrasting_images()
    assert batch_deviation(model, x) < BATCH_TOL
    per_matrix = newton.newton_alpha  # newton.py's functions look it up at call time

    def batch_global_alpha(A, **kwargs):
        alpha = per_matrix(A, **kwargs)
        return alpha.amin().expand_as(alpha)

    monkeypatch.setattr(newton, 'newton_alpha', batch_global_alpha)
    assert batch_deviation(model, x) > BATCH_TOL


@pytest.mark.parametrize('hw', [(97, 131), (64, 33), (29, 29)])
def test_odd_input_sizes(hw):
    model = SOFT(arch='tiny')
    model.init_weights()
    model.eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *hw))
    h, w = hw
    for i, out in enumerate(outs):
        for _ in range(2 if i == 0 else 1):  # stem: two stride-2 convs; later stages: one
            h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        assert out.shape == (1, model.embed_dims[i], h, w)
        assert torch.isfinite(out).all()


def test_too_small_input_raises():
    model = SOFT(arch='tiny')
    with pytest.raises(ValueError, match='at least 29'):
        model(torch.randn(1, 3, 28, 64))


# The ImageNet models of the paper that no shipped config builds (tiny, small and medium:
# their ImageNet configs' counts, tests/configs/test_configs.py).
PAPER_PARAMS = {'large': 64e6, 'huge': 87e6}


@pytest.mark.parametrize('arch', list(PAPER_PARAMS))
def test_parameter_counts_match_paper(arch):
    model = SOFT(arch=arch)
    n = sum(p.numel() for p in model.parameters()) + 512 * 1000 + 1000  # + linear head
    assert abs(n - PAPER_PARAMS[arch]) / PAPER_PARAMS[arch] < 0.02, n


def test_out_indices_and_cls_token():
    model = SOFT(arch='tiny', out_indices=(1, 2))
    assert model.num_stages == 3 and not hasattr(model, 'block4')
    outs = model(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [128, 320]
    a = SOFT(arch='tiny', with_cls_token=True, drop_path_rate=0.)
    a.init_weights()
    b = SOFT(arch='tiny', with_cls_token=False, drop_path_rate=0.)
    b.load_state_dict(a.state_dict(), strict=False)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert not torch.allclose(a.eval()(x)[3], b.eval()(x)[3])
        assert torch.allclose(a(x)[2], b(x)[2])


def test_checkpoint_of_another_pretraining_size_is_resized(tmp_path, mmengine_log):
    """Position embeddings pre-trained at 384² (grids 96, 48, 24, 12) load into the 224²
    grids (56, 28, 14, 7), resized and logged; stage 4's class-token position is kept.
    Per-channel constants survive any interpolation, so the loaded values are known."""
    model = SOFT(arch='tiny', drop_path_rate=0.)
    model.init_weights()
    state = model.state_dict()
    big = dict(state)
    for s, grid in enumerate((96, 48, 24, 12)):
        C = model.embed_dims[s]
        lead = 1 if s == 3 else 0
        big[f'pos_embed{s + 1}'] = torch.cat(
            [torch.full((1, lead, C), -3.), torch.arange(C, dtype=torch.float32).expand(
                1, grid * grid, C)], dim=1)
    torch.save({'state_dict': big}, tmp_path / 'soft384.pth')
    loaded = SOFT(arch='tiny', init_cfg=dict(type='Pretrained',
                                             checkpoint=str(tmp_path / 'soft384.pth')))
    loaded.init_weights()
    for s, grid in enumerate((56, 28, 14, 7)):
        pos = getattr(loaded, f'pos_embed{s + 1}')
        lead = 1 if s == 3 else 0
        assert pos.shape[1] == grid * grid + lead
        assert rel_err(pos[:, lead:], torch.arange(model.embed_dims[s],
                                                   dtype=torch.float32).expand_as(
                                                       pos[:, lead:])) <= 1e-6
    assert torch.equal(loaded.pos_embed4[:, :1], torch.full((1, 1, 512), -3.))
    assert torch.equal(loaded.block3[0].att.mha.W_q.weight,
                       state['block3.0.att.mha.W_q.weight'])
    logged = [m for m in mmengine_log if 'resized from the checkpoint' in m]
    assert [m.split()[1] for m in logged] == ['pos_embed1', 'pos_embed2', 'pos_embed3',
                                              'pos_embed4']
    assert "pos_embed1 resized from the checkpoint's 96×96 grid to 56×56" in logged[0]
    bad = dict(big, pos_embed2=torch.zeros(1, 50, 128))
    torch.save({'state_dict': bad}, tmp_path / 'bad.pth')
    with pytest.raises(ValueError, match='pos_embed2 holds 50 spatial positions, not a '
                       'square grid'):
        SOFT(arch='tiny', init_cfg=dict(type='Pretrained',
                                        checkpoint=str(tmp_path / 'bad.pth'))).init_weights()


def test_gelu_gradient_laid_out_unlike_its_input():
    """A GELU's input gradient, where its output's gradient arrives transposed (as the
    landmarks' does, from A = κ(Q̃, Q̃)): torch 2.1's CPU kernel returned uninitialized
    memory there without ``guard_gelu_grad``. Against GELU's derivative in float64."""
    x = torch.randn(6, 8, requires_grad=True)
    grad_y = torch.randn(8, 6).t()
    (grad_x,) = torch.autograd.grad(guard_gelu_grad(F.gelu(x)), x, grad_y)
    x64 = x.detach().double()
    normal = torch.distributions.Normal(0., 1.)
    derivative = normal.cdf(x64) + x64 * normal.log_prob(x64).exp()
    # float32 erf and exp: ~1e-7 relative; 1e-5 is 100x that
    assert rel_err(grad_x, grad_y.double() * derivative) < 1e-5


def test_layer_gradients_match_float64():
    """A SOFT layer's training gradients (landmarks made from q, so every gradient path
    of the kernel products and the middle meets in the landmark conv and its GELU) in
    float32 against the same layer in float64. Measured: ~1e-6 (2-core x86, torch 2.1
    and 2.14); 1e-4 is the network's gradient floor."""
    from mmsoft.models.backbones.soft import SoftKernelAttention
    torch.manual_seed(0)
    B, h, H, W, d = 2, 2, 16, 16, 16
    layer = SoftKernelAttention(d, h, 4, 3)
    q, v = torch.randn(2, B, h, H * W, d).unbind(0)
    grads = []
    for dtype in (torch.float32, torch.float64):
        lay = copy.deepcopy(layer).to(dtype)
        inputs = [t.to(dtype).requires_grad_() for t in (q, v)]
        out = lay(*inputs, (H, W))
        grads.append(torch.autograd.grad((out * out).sum(), [*inputs, *lay.parameters()]))
    for g32, g64 in zip(*grads):
        assert g64.norm() > 0
        assert (g32.double() - g64).norm() / g64.norm() < 1e-4


def residual_branch_kinds(model, x, rate):
    """Per sample and call of a block's ``drop_path`` in a forward of x: how many branch
    outputs are all zero (dropped), the branch scaled by 1/(1 - p) (kept; p rises
    linearly from 0 in the first block to ``rate`` in the last) or anything else."""
    modules = [m for name, m in model.named_modules() if name.endswith('.drop_path')]
    assert len(modules) == sum(model.depths)
    kinds = dict(dropped=0, kept=0, other=0)

    def check(module, args, out, p):
        for branch, o in zip(args[0], out):
            if not o.any():
                kinds['dropped'] += 1
            # rtol 1e-6: 8 float32 ulps (x * (1 / keep) is within 1 ulp of x / keep)
            elif torch.allclose(o, branch / (1 - p), rtol=1e-6, atol=0):
                kinds['kept'] += 1
            else:
                kinds['other'] += 1

    hooks = [m.register_forward_hook(
        lambda mod, args, out, p=rate * k / (len(modules) - 1): check(mod, args, out, p))
        for k, m in enumerate(modules)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return kinds


def test_drop_path_is_stochastic_depth(monkeypatch):
    """Stochastic depth: in training a sample's residual branch is dropped whole or kept
    whole (scaled by 1/(1 - p)); in eval it passes unchanged. Negative control: element
    dropout (nn.Dropout: single values of every sample zeroed) fails the same check."""
    from mmsoft.models.backbones import soft as soft_backbone
    x = torch.randn(8, 3, 64, 64)

    def branch_kinds(mode):
        model = SOFT(arch=FIXTURE_ARCH, drop_path_rate=0.5)
        model.init_weights()
        rate = 0.5 if mode == 'train' else 0.  # eval: every branch kept, unscaled
        return residual_branch_kinds(getattr(model, mode)(), x, rate)

    kinds = branch_kinds('train')  # 8 samples, 5 blocks, 2 branches each
    assert kinds['other'] == 0 and kinds['dropped'] > 0 and kinds['kept'] > 0, kinds
    assert branch_kinds('eval') == dict(dropped=0, kept=80, other=0)
    monkeypatch.setattr(soft_backbone, 'DropPath', torch.nn.Dropout)
    assert branch_kinds('train')['other'] > 0


def test_invalid_configs():
    with pytest.raises(ValueError, match='Unknown SOFT arch'):
        SOFT(arch='gigantic')
    with pytest.raises(ValueError, match='needs a dict with keys'):
        SOFT(arch=dict(embed_dims=[64] * 4))
    with pytest.raises(ValueError, match=r"unknown keys \['sr_ratio'\]"):  # a typo
        SOFT(arch=dict(FIXTURE_ARCH, sr_ratio=[4, 2, 1, 1]))
    with pytest.raises(ValueError, match='not divisible'):
        SOFT(arch=dict(embed_dims=[64, 128, 320, 512], num_heads=[3, 4, 10, 16],
                       depths=[1, 1, 1, 1]))
    with pytest.raises(ValueError, match='out_indices'):
        SOFT(arch='tiny', out_indices=(0, 4))
    with pytest.raises(ValueError, match='frozen_stages'):
        SOFT(arch='tiny', frozen_stages=5)
    with pytest.raises(ValueError, match='pinv_method'):
        SOFT(arch='tiny', pinv_method='svd')


def test_autocast_bfloat16_is_finite():
    model = SOFT(arch='tiny')
    model.init_weights()
    model.eval()
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            outs = model(x)
    for o, r in zip(outs, ref):
        assert torch.isfinite(o).all()
        assert rel_err(o.float(), r) < 0.1


@pytest.mark.parametrize('mode', ['eval', 'train'])
@needs_one_graph_dynamo
def test_traces_into_one_graph(mode):
    """torch.compile(fullgraph=True) traces the whole backbone without a graph break (a
    break, e.g. a host sync or an autograd Function that Dynamo cannot trace, raises
    here), and the traced model gives the same outputs and gradients. The 'eager'
    backend checks the tracing only, without compiling kernels."""
    import torch._dynamo
    torch._dynamo.reset()
    model = fixture_model()
    getattr(model, mode)()
    compiled = torch.compile(model, backend='eager', fullgraph=True)
    x = torch.randn(1, 3, 64, 96)
    results = []
    for m in (model, compiled):
        model.zero_grad()
        with torch.set_grad_enabled(mode == 'train'):
            outs = m(x)
            if mode == 'train':
                sum(o.pow(2).mean() for o in outs).backward()
        grad = model.block1[0].att.mha.W_q.weight.grad
        results.append(([o.detach() for o in outs], None if grad is None else grad.clone()))
    (ref_outs, ref_grad), (outs, grad) = results
    # the compiled graph computes P in its own row chunks (the plan's
    # compiled_kernel_chunks; eager here: one), so Pᵀ·V sums in another order: float32
    # rounding, each order within the fidelity floor (1e-5) of float64 (measured up to
    # 1.8e-6 on the outputs, 7e-7 on the gradient)
    for o, r in zip(outs, ref_outs):
        assert rel_err(o, r) < 1e-5
    if mode == 'train':
        assert rel_err(grad, ref_grad) < 1e-5


@needs_one_graph_dynamo
@pytest.mark.slow  # Dynamo traces the training forward twice: 56 s on 2 CPU cores, 68 s with one thread
def test_training_graph_holds_across_image_sizes(force_plan):
    """A detector trains on many image sizes (mmdet pads to multiples of 32). After the
    first size, torch.compile traces one graph with dynamic sizes, and that graph must
    hold for the next sizes: nothing may fix the token count N to its traced value
    (``range(0, N, step)`` over P's row chunks did), nor P's number of row chunks,
    which eager mode takes from the size (a graph per count did, each traced slowly).
    With ``kernel_chunk=1`` every size here has another count in eager mode (one chunk
    per row); under torch.compile P runs in ``compiled_kernel_chunks`` chunks."""
    import torch._dynamo
    torch._dynamo.reset()
    force_plan(kernel_chunk=1, device='cpu')
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = fixture_model().train()
    compiled = torch.compile(model, backend=backend)
    # the second size differs in H and W, so that Dynamo makes both dynamic at once
    for hw in ((64, 96), (96, 128), (64, 128), (96, 96)):  # N = 384, 768, 512, 576
        sum(o.mean() for o in compiled(torch.randn(2, 3, *hw))).backward()
    assert len(graphs) == 2  # the first size's static graph, then one dynamic graph


@pytest.mark.parametrize('kwargs', [{}, dict(pinv_method='regularized'),
                                    dict(landmark_grid=2)], ids=['auto', 'regularized',
                                                                 'grid2'])
def test_cuda_plan_waits_for_no_device(kwargs, monkeypatch):
    """What CUDA runs (its entries of the plan tables, on PyTorch's data-less meta device):
    no value is read back to the host (which raises on meta) and no host data is copied
    to the device. On a GPU either makes the host wait for the device in every forward."""
    from mmsoft.models.attention import PLANS
    from mmsoft.testing import LaunchCounter
    made_on_device = []
    for name in ('tensor', 'as_tensor'):

        def on_device(*args, _make=getattr(torch, name), _name=name, **kw):
            if kw.get('device') is not None and torch.device(kw['device']).type != 'cpu':
                made_on_device.append(_name)
            return _make(*args, **kw)

        monkeypatch.setattr(torch, name, on_device)
    model = SOFT(arch=FIXTURE_ARCH, **kwargs).to('meta')
    x = torch.zeros(2, 3, 64, 96, device='meta')
    with attention_plan(PLANS['cuda'], device='meta'), LaunchCounter() as count:
        with torch.no_grad():
            model.eval()(x)
        sum(o.mean() for o in model.train()(x)).backward()
    assert count.total > 0 and count.transfers == [] and made_on_device == []
