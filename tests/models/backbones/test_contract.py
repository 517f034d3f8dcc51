"""What MMDetection, MMSegmentation and MMPretrain check of their own backbones (Swin,
PVT, MiT, ViT, XCiT), asked of both mmsoft backbones: the pyramid's sizes, out_indices
subsets and errors, frozen_stages, norm_eval, with_cp (outputs, gradients, memory, every
trainable block), the deprecated pretrained= and init_cfg forms, and a DDP step."""
import copy
import warnings

import pytest
import torch
import torch.distributed as dist
from conftest import SIMA_FIXTURE_ARCH, SOFT_FIXTURE_ARCH, data_path, rel_err
from torch.nn.modules.batchnorm import _BatchNorm

import mmsoft.models.utils as backbone_utils
from mmsoft.models import SOFT, XCiTSimA

FAMILIES = ['SOFT', 'XCiTSimA']
STRIDES = (4, 8, 16, 32)
# XCiT-SimA at depth 12 with its default taps (3, 5, 7, 11), narrow enough to be quick
SIMA_ARCH = dict(embed_dims=64, depth=12, num_heads=2, eta=1.0)


def build(name, **kwargs):
    kwargs.setdefault('drop_path_rate', 0.)
    if name == 'SOFT':
        return SOFT(arch='tiny', **kwargs)
    return XCiTSimA(arch=SIMA_ARCH, **kwargs)


def stage_of(model, param_name):
    """The stage a parameter belongs to, as the backbones' docstrings define one: 0 the
    stem, k = 1..4 what makes level k-1."""
    head = param_name.split('.')[0]
    if isinstance(model, SOFT):
        if head in ('patch_embed1', 'pos_embed1'):
            return 0
        if head in ('norm', 'cls_token'):
            return 4
        return int(head[-1])
    if head in ('patch_embed', 'pos_embeder'):
        return 0
    if head.startswith('fpn'):
        return int(head[3:])
    block = int(param_name.split('.')[1])
    return next(k + 1 for k, tap in enumerate(model.tap_blocks) if block <= tap)


def loss(outs):
    return sum(o.float().square().mean() for o in outs)


# -- sizes and out_indices ------------------------------------------------------------
@pytest.mark.parametrize('name, hw', [
    ('SOFT', (33, 33)), ('SOFT', (67, 93)), ('SOFT', (29, 29)),  # SOFT's smallest input
    ('XCiTSimA', (33, 33)), ('XCiTSimA', (67, 93)), ('XCiTSimA', (1, 1))])
def test_levels_are_ceil_of_the_stride(name, hw):
    """Level i is ⌈H / s_i⌉ × ⌈W / s_i⌉ for s = 4, 8, 16, 32, as for a convolutional
    backbone, at the peers' odd sizes (PVT's 33×33) and the smallest input."""
    model = build(name).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *hw))
    assert [tuple(o.shape[-2:]) for o in outs] == [(-(-hw[0] // s), -(-hw[1] // s))
                                                    for s in STRIDES]


@pytest.mark.parametrize('name', FAMILIES)
@pytest.mark.parametrize('out_indices, levels', [
    (0, (0, )), ((3, ), (3, )), ((1, 3), (1, 3)), (-1, (3, )), ((0, -1), (0, 3)),
    ([-2, 1], (1, 2))], ids=str)
def test_out_indices_choose_levels(name, out_indices, levels):
    """Any subset of the four levels, negative indices counted from the end (mmpretrain's
    -1): the maps returned are the full model's at those levels, and what makes only
    later levels is not built."""
    full = build(name)
    full.init_weights()
    part = build(name, out_indices=out_indices)
    assert part.out_indices == levels
    own = part.state_dict()
    assert set(own) <= set(full.state_dict())
    part.load_state_dict({k: v for k, v in full.state_dict().items() if k in own})
    built = {stage_of(full, n) for n, _ in part.named_parameters()}
    assert max(built) == levels[-1] + 1
    if name == 'XCiTSimA':  # and the branches of the levels not returned
        assert [hasattr(part, f'fpn{i + 1}') for i in range(4)] == [i in levels
                                                                   for i in range(4)]
    x = torch.randn(1, 3, 67, 93)
    with torch.no_grad():
        ref, outs = full.eval()(x), part.eval()(x)
    assert len(outs) == len(levels)
    for out, level in zip(outs, levels):
        assert out.shape == ref[level].shape
        assert rel_err(out, ref[level]) <= 1e-6


@pytest.mark.parametrize('name', FAMILIES)
@pytest.mark.parametrize('bad', [(), (4, ), (-5, ), (1, 1), (1, -3), {0: 1}, 1.0, '0',
                                 (True, ), None], ids=repr)
def test_bad_out_indices_are_refused(name, bad):
    with pytest.raises(ValueError, match=f'{name}: out_indices must be an int or a list or '
                       r'tuple of distinct .* indices in \[0, 3\]'):
        build(name, out_indices=bad)


# -- frozen_stages and norm_eval -----------------------------------------------------
@pytest.mark.parametrize('name', FAMILIES)
@pytest.mark.parametrize('frozen_stages', [-1, 0, 1, 2, 3, 4])
def test_frozen_stages(name, frozen_stages):
    """mmdet's count: 0 the stem, k also stages 1..k; their parameters get no gradient
    and their norms stay in eval mode through train(); the rest trains. All four: nothing
    trainable and no statistic moves (mmdet's Swin check)."""
    model = build(name, frozen_stages=frozen_stages)
    assert model.train() is model
    for n, p in model.named_parameters():
        assert p.requires_grad == (stage_of(model, n) > frozen_stages), n
    norms = {n: m for n, m in model.named_modules()
             if isinstance(m, (_BatchNorm, torch.nn.LayerNorm))}
    for n, m in norms.items():
        stage = stage_of(model, f'{n}.weight')
        assert m.training == (stage > frozen_stages), n
    if frozen_stages == 4:
        stats = [m.running_mean.clone() for m in model.modules() if isinstance(m, _BatchNorm)]
        outs = model(torch.randn(2, 3, 64, 64))
        assert not any(o.requires_grad for o in outs)
        assert all(torch.equal(s, m.running_mean) for s, m in
                   zip(stats, (m for m in model.modules() if isinstance(m, _BatchNorm))))


@pytest.mark.parametrize('name', FAMILIES)
def test_frozen_stages_beyond_the_built_levels_are_refused(name):
    with pytest.raises(ValueError, match=rf'{name}: frozen_stages must be in \[-1, 4\]'):
        build(name, frozen_stages=5)
    with pytest.raises(ValueError, match=rf'{name}: frozen_stages must be in \[-1, 2\]'):
        build(name, out_indices=(0, 1), frozen_stages=3)


# -- with_cp --------------------------------------------------------------------------
@pytest.mark.parametrize('name', FAMILIES)
@pytest.mark.parametrize('frozen_stages', [-1, 1])
def test_with_cp_gives_the_same_outputs_and_gradients(name, frozen_stages):
    """Recomputing the blocks in the backward pass gives the outputs and gradients of the
    plain step (the same operations on the same values; 1e-6 leaves room for a kernel
    that sums in another order on the recomputation)."""
    torch.manual_seed(0)
    plain = build(name, frozen_stages=frozen_stages)
    plain.init_weights()
    cp = copy.deepcopy(plain)
    cp.with_cp = True
    x = torch.randn(2, 3, 64, 96)
    results = []
    for model in (plain, cp):
        model.train()
        outs = model(x)
        loss(outs).backward()
        results.append((outs, {n: p.grad for n, p in model.named_parameters()
                               if p.grad is not None}))
    (outs, grads), (outs_cp, grads_cp) = results
    for o, o_cp in zip(outs, outs_cp):
        assert rel_err(o_cp.detach(), o.detach()) <= 1e-6
    assert grads.keys() == grads_cp.keys() and grads
    for n in grads:
        assert rel_err(grads_cp[n], grads[n]) <= 1e-5, n


@pytest.mark.parametrize('name', FAMILIES)
def test_with_cp_checkpoints_every_trainable_block(name, monkeypatch):
    """Also the first block after frozen ones, whose input needs no gradient (its
    parameters do); nothing is checkpointed without autograd."""
    checkpointed = []
    original = backbone_utils.cp.checkpoint

    def recorded(fn, *args, **kwargs):
        checkpointed.append(fn)
        return original(fn, *args, **kwargs)

    monkeypatch.setattr(backbone_utils.cp, 'checkpoint', recorded)
    model = build(name, frozen_stages=0, with_cp=True).train()
    blocks = ([b for s in range(1, 5) for b in getattr(model, f'block{s}')]
              if name == 'SOFT' else list(model.blocks))
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
    assert checkpointed == []
    loss(model(torch.randn(1, 3, 64, 64))).backward()
    assert checkpointed == blocks


def _step_peak_bytes(model, x):
    """The CPU allocator's peak during a training step's forward and backward, above what
    was allocated before it (the profiler's allocation events, summed in time order)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss(model(x)).backward()
    events, todo = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        node = todo.pop()
        if 'Allocation' in str(node.tag):
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        todo.extend(node.children)
    current = peak = 0
    for _, size in sorted(events):
        current += size
        peak = max(peak, current)
    return peak


@pytest.mark.parametrize('name', FAMILIES)
def test_with_cp_lowers_the_training_peak(name):
    """with_cp keeps each block's input instead of its activations: the step's allocator
    peak drops, with the stem frozen too. Measured at 128×160, batch 2 (torch 2.14.1):
    SOFT-T 87.5 -> 67.0 MiB (0.77), 81.2 -> 60.7 frozen (0.75); the 12-block XCiT-SimA
    17.0 -> 5.4 MiB (0.32), 15.3 -> 3.7 (0.24). Allocation sizes depend on the shapes,
    not on timing: 0.85 leaves room for another torch's kernels."""
    x = torch.randn(2, 3, 128, 160)
    for frozen_stages in (-1, 0):
        torch.manual_seed(0)
        plain = build(name, frozen_stages=frozen_stages).train()
        cp = copy.deepcopy(plain)
        cp.with_cp = True
        ratio = _step_peak_bytes(cp, x) / _step_peak_bytes(plain, x)
        assert ratio < 0.85, (frozen_stages, ratio)


# -- pretrained= and init_cfg ---------------------------------------------------------
FIXTURES = {'SOFT': (SOFT, dict(arch=SOFT_FIXTURE_ARCH), 'soft_public_checkpoint.pth'),
            'XCiTSimA': (XCiTSimA, dict(arch=SIMA_FIXTURE_ARCH, tap_blocks=(0, 1, 2, 3)),
                         'sima_public_checkpoint.pth')}


@pytest.mark.parametrize('name', FAMILIES)
def test_pretrained_is_the_deprecated_init_cfg(name):
    """As Swin, PVT, MiT and ViT take it: a path, with a deprecation warning, loads as
    init_cfg=dict(type='Pretrained', checkpoint=path) does; with init_cfg too, or not a
    path, it is refused."""
    cls, kwargs, ckpt = FIXTURES[name]
    path = data_path(ckpt)
    torch.manual_seed(0)  # what the checkpoint does not hold is initialized alike
    with pytest.warns(UserWarning, match=f'{name}: pretrained is deprecated, use init_cfg'):
        old = cls(pretrained=path, **kwargs)
    assert old.init_cfg == dict(type='Pretrained', checkpoint=path)
    old.init_weights()
    torch.manual_seed(0)
    new = cls(init_cfg=dict(type='Pretrained', checkpoint=path), **kwargs)
    new.init_weights()
    for k, v in new.state_dict().items():
        assert torch.equal(old.state_dict()[k], v), k
    with pytest.raises(ValueError, match=f'{name}: init_cfg and pretrained cannot both'):
        cls(pretrained=path, init_cfg=dict(type='Pretrained', checkpoint=path), **kwargs)
    with pytest.raises(TypeError, match=f'{name}: pretrained must be a checkpoint path'):
        cls(pretrained=123, **kwargs)


@pytest.mark.parametrize('name', FAMILIES)
def test_init_cfg_list_loads_the_checkpoint_last(name):
    """A list of initializers with ``Pretrained`` (mmdet configs' form): the others run
    first, so the checkpoint's values win where it holds them."""
    cls, kwargs, ckpt = FIXTURES[name]
    pretrained = dict(type='Pretrained', checkpoint=data_path(ckpt))
    model = cls(init_cfg=[dict(type='Constant', layer='Linear', val=0.5), pretrained],
                **kwargs)
    model.init_weights()
    alone = cls(init_cfg=pretrained, **kwargs)
    alone.init_weights()
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert linears
    for n in linears:
        weight = model.get_submodule(n).weight
        assert not torch.all(weight == 0.5), n
        assert torch.equal(weight, alone.get_submodule(n).weight), n


# -- DDP ------------------------------------------------------------------------------
@pytest.mark.parametrize('name, with_cp', [('SOFT', False), ('XCiTSimA', False),
                                           ('XCiTSimA', True)])
def test_ddp_step_without_stride_warnings(name, with_cp, tmp_path):
    """A DistributedDataParallel step (gloo, one process): every gradient reaches DDP's
    buckets in its parameter's layout (XCiT-SimA's depthwise LPI convs computed theirs
    channels-last: 'Grad strides do not match bucket view strides', and a copy)."""
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/store', rank=0,
                            world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(build(name, with_cp=with_cp))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            for _ in range(2):
                model.zero_grad()
                loss(model(torch.randn(2, 3, 64, 64))).backward()
    finally:
        dist.destroy_process_group()
    assert not [w for w in caught if 'strides' in str(w.message)]
    assert all(p.grad is not None and p.grad.stride() == p.stride()
               for p in model.parameters())
