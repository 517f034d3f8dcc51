"""The attention plan: one immutable entry per device type, forced per block of code."""
import dataclasses
import threading

import pytest
import torch
from conftest import needs_one_graph_dynamo

from mmsoft.models import attention
from mmsoft.models.attention import (DEFAULT_PLAN, PLANS, AttentionPlan, attention_plan,
                                     plan_for, resolve_pinv_method, soft_attention)
from mmsoft.models.attention.plan import triton_available


def test_plans_are_immutable():
    with pytest.raises(TypeError):
        PLANS['cpu'] = DEFAULT_PLAN
    with pytest.raises(dataclasses.FrozenInstanceError):
        PLANS['cpu'].kernel_chunk = 1
    assert plan_for('mps') is DEFAULT_PLAN  # no measurements there
    assert plan_for('cpu') is PLANS['cpu']


def test_auto_reads_the_plan():
    assert [resolve_pinv_method('auto', m, 'cpu') for m in (128, 129)] == [
        'iterative', 'spectral']
    assert [resolve_pinv_method('auto', m, 'cuda') for m in (196, 197, 1050)] == [
        'iterative', 'tf32', 'tf32']
    # elsewhere (no measurements, no native TF32) the formed float32 iterate
    assert resolve_pinv_method('auto', 1050, 'mps') == 'iterative'
    assert (DEFAULT_PLAN.pinv_pad, DEFAULT_PLAN.local_conv_layout) == (1, 'images')
    with attention_plan(pinv='spectral', device='cuda'):
        assert resolve_pinv_method('auto', 16, 'cuda') == 'spectral'
        assert resolve_pinv_method('auto', 16, 'cpu') == 'iterative'  # not forced there
        assert resolve_pinv_method('iterative', 16, 'cuda') == 'iterative'  # not 'auto'
    assert resolve_pinv_method('auto', 16, 'cuda') == 'iterative'


def test_forced_choices_nest_and_are_restored():
    with attention_plan(kernel_chunk=64) as outer:
        assert plan_for('cpu').kernel_chunk == plan_for('xpu').kernel_chunk == 64
        assert outer.kernel_chunk == 64
        with attention_plan(PLANS['cpu'], device='meta'):
            assert plan_for('meta') == PLANS['cpu']  # a whole plan, the inner block's
            assert plan_for('cpu').kernel_chunk == 64
        assert plan_for('meta').kernel_chunk == 64
        # other fields keep each device's own value
        assert plan_for('cpu').local_conv_layout == 'channels'
        assert plan_for('cuda').local_conv_layout == 'images'
    assert plan_for('cpu') is PLANS['cpu'] and plan_for('meta') is DEFAULT_PLAN
    with pytest.raises(RuntimeError), attention_plan(order='official'):
        raise RuntimeError  # an error in the block restores the plan too
    assert plan_for('cpu').order == 'thin'


def test_forcing_a_method_without_float32_steps_keeps_the_thin_steps():
    """CUDA's plan applies its last float32 steps to the thin matrix. Forcing
    'spectral' or 'tf32x3' on every device type (the module docstring's example) keeps
    that choice for layers whose ``pinv_method`` ends in float32 steps, and applies none
    to the forced method."""
    cuda = PLANS['cuda']
    assert cuda.thin_steps > 0
    for method in ('spectral', 'tf32x3'):
        with attention_plan(pinv=method):
            plan = plan_for('cuda')
            assert plan.pinv_method(1050) == method
            assert plan.thin_steps_for(method, 20) == 0
            assert plan.thin_steps_for('tf32', 20) == cuda.thin_steps


@pytest.mark.parametrize('choices, error', [
    (dict(chunk=4), TypeError),  # not a field
    (dict(local_conv_layout='bogus'), ValueError),
    (dict(pinv='auto'), ValueError),  # a plan names concrete methods
    (dict(pinv=((128, 'iterative'), )), ValueError),  # no entry for every m
    (dict(spectral_inference=((448, 'eigh'), )), ValueError),  # the same
    (dict(spectral_inference=((448, 'eigh', 1), (None, 'eigh'))), ValueError),  # not a pair
    (dict(spectral_inference=((448, 'lanczos'), (None, 'eigh'))), ValueError),
    (dict(kernel_chunk=0), ValueError),
    (dict(compiled_kernel_chunks=0), ValueError),
    (dict(compiled_kernel_chunks=True), ValueError),  # not a count
    (dict(order='fast'), ValueError),
    (dict(kernel_products='triton'), ValueError),
    (dict(float32_products='tf32'), ValueError),  # TF32 alone is not float32's accuracy
    (dict(tf32_products='bf16'), ValueError),  # 8 bits: not TF32's rounding
    (dict(float32_products='fp16'), ValueError),  # fp16 alone is not float32's accuracy
    (dict(eigh_dtype='float16'), ValueError),
    (dict(tf32_float32_steps=(1, )), ValueError),
    (dict(tf32_float32_steps=(1, -2)), ValueError),
    (dict(tf32_first_steps='never'), ValueError),
    (dict(thin_horner='inference'), ValueError),
    (dict(thin_horner=True), ValueError),
    # 'guarded' decides where the first float32 steps run: a schedule without any
    (dict(pinv='tf32', tf32_float32_steps=(0, 4), tf32_first_steps='guarded'), ValueError),
    (dict(pinv_pad=0), ValueError),
    (dict(pinv='tf32', thin_steps=-1), ValueError),
    (dict(pinv='tf32', tf32_float32_steps=(1, 4), thin_steps=5), ValueError),  # TF32 steps
    (dict(pinv='iterative', tf32_float32_steps=(1, 0), thin_steps=1), ValueError),
    # CUDA's plan applies 4 thin steps: a schedule with fewer last ones lowers them too
    (dict(tf32_float32_steps=(1, 2)), ValueError),
])
def test_bad_choices_are_refused(choices, error):
    with pytest.raises(error):
        with attention_plan(**choices):
            pass
    assert plan_for('cpu') is PLANS['cpu']
    with pytest.raises(TypeError, match='AttentionPlan'):
        with attention_plan(dict(order='thin')):
            pass


@pytest.mark.parametrize('products', ['fused', 'triton_chunks'])
def test_triton_kernel_products_need_triton(products):
    # Triton 3 comes with PyTorch's wheels for Linux with CUDA (torch 2.1's is 2.1)
    if triton_available():
        assert AttentionPlan(kernel_products=products).kernel_products == products
    else:
        with pytest.raises(ValueError, match='Triton 3'):
            AttentionPlan(kernel_products=products)


def test_forced_plans_are_thread_local():
    seen = {}

    def other():
        seen['other'] = plan_for('cpu').kernel_chunk

    with attention_plan(kernel_chunk=64, device='cpu'):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        seen['this'] = plan_for('cpu').kernel_chunk
    assert seen == {'other': PLANS['cpu'].kernel_chunk, 'this': 64}


@needs_one_graph_dynamo
def test_compiled_code_sees_the_forced_plan():
    """Dynamo guards on the plan it read: a forced plan recompiles, it is never stale."""

    @torch.compile(fullgraph=True, backend='eager')
    def chunk_times(x):
        return x * plan_for(x.device.type).kernel_chunk

    x = torch.ones(2)
    torch.compiler.reset()
    assert chunk_times(x)[0] == PLANS['cpu'].kernel_chunk
    with attention_plan(kernel_chunk=3):
        assert chunk_times(x)[0] == 3
    assert chunk_times(x)[0] == PLANS['cpu'].kernel_chunk


def test_official_order_is_a_forced_choice(monkeypatch):
    q = torch.randn(2, 3, 40, 8, dtype=torch.float64) * 0.5
    lm = torch.randn(2, 3, 10, 8, dtype=torch.float64) * 0.5
    v = torch.randn(2, 3, 40, 8, dtype=torch.float64)
    calls = []
    official = attention.soft.official_order_attention
    monkeypatch.setattr(attention.soft, 'official_order_attention',
                        lambda *a: calls.append(1) or official(*a))
    ours = soft_attention(q, lm, v)
    with attention_plan(order='official'):
        ref = soft_attention(q, lm, v)
    assert calls == [1]
    # float64: the two orders differ by rounding only
    assert torch.allclose(ours, ref, rtol=1e-9, atol=1e-10)


def test_backward_chunks_as_its_forward_did():
    """The chunk of P is fixed when the forward runs: a backward outside the block (or on
    autograd's device thread, which has its own plan) recomputes P in the same chunks."""
    from mmsoft.testing import LaunchCounter
    q = (torch.randn(1, 2, 30, 4, dtype=torch.float64) * 0.5).requires_grad_()
    lm = (torch.randn(1, 2, 6, 4, dtype=torch.float64) * 0.5).requires_grad_()
    v = torch.randn(1, 2, 30, 4, dtype=torch.float64, requires_grad=True)
    with LaunchCounter(shapes_of=['exp_']) as ops:  # P, its chunks and A end in exp_
        with attention_plan(kernel_chunk=2 * 6 * 10, device='cpu'):  # 10 rows a chunk
            out = soft_attention(q, lm, v, pinv_method='iterative')
        forward = [shape[-2] for shape in ops.shapes['exp_']]
        out.sum().backward()
    backward = [shape[-2] for shape in ops.shapes['exp_'][len(forward):]]
    assert forward == [10, 10, 10, 6, 10, 10, 10]  # Pᵀ·V, A, P·W
    assert backward and set(backward) == {10}


def test_a_plan_is_data():
    plan = AttentionPlan(pinv='spectral', kernel_chunk=7)
    assert plan.pinv == ((None, 'spectral'), ) and plan.pinv_method(10**6) == 'spectral'
    assert dataclasses.replace(plan, kernel_chunk=8) == AttentionPlan(pinv='spectral',
                                                                      kernel_chunk=8)


@pytest.fixture
def pinv_calls(monkeypatch):
    """The calls soft_attention makes to newton_pinv_apply while the test runs, each as
    (its kernel's landmark count m, its keyword options); the calls still compute."""
    from mmsoft.models.attention import newton_pinv_apply
    from mmsoft.models.attention import soft as soft_mod
    calls = []

    def recording(A, Z, iters, method, **kwargs):
        calls.append((A.shape[-1], kwargs))
        return newton_pinv_apply(A, Z, iters, method, **kwargs)

    monkeypatch.setattr(soft_mod, 'newton_pinv_apply', recording)
    return calls


def test_spectral_inference_is_chosen_by_the_landmark_count(pinv_calls):
    """A layer's kernel of m landmarks gets the plan's ``spectral_inference`` for m: a
    plain choice for every m, or the first (largest m, choice) pair that holds (the
    CPU's plan decomposes small kernels by eigh, large ones through their tridiagonal
    form)."""
    pytest.importorskip('scipy')
    plan = AttentionPlan(pinv='spectral', eigh_dtype='mixed',
                         spectral_inference=((16, 'eigh'), (None, 'tridiagonal')))
    assert plan.spectral_inference == ((16, 'eigh'), (None, 'tridiagonal'))
    assert [plan.spectral_inference_for(m) for m in (1, 16, 17)] == [
        'eigh', 'eigh', 'tridiagonal']
    assert AttentionPlan(spectral_inference='eigh').spectral_inference == ((None, 'eigh'), )
    q, v = torch.randn(1, 1, 64, 8) * 0.3, torch.randn(1, 1, 64, 8)
    with attention_plan(plan, device='cpu'), torch.no_grad():
        for m in (16, 17):
            soft_attention(q, torch.randn(1, 1, m, 8) * 0.3, v)
    assert [(m, options['spectral_inference']) for m, options in pinv_calls] == [
        (16, 'eigh'), (17, 'tridiagonal')]


def test_the_iterates_options_come_from_the_plan(pinv_calls):
    """soft_attention passes the plan's options of the iterate (its eigendecomposition's
    dtype, 'tf32''s float32 steps, the padding, how 'spectral' applies its filter) down to
    newton_pinv_apply, whose own defaults read no plan."""
    from mmsoft.models.attention import newton, newton_pinv_apply
    from mmsoft.testing import hard_problem
    q, v = torch.randn(1, 1, 64, 8) * 0.3, torch.randn(1, 1, 64, 8)
    lm = torch.randn(1, 1, 16, 8) * 0.3
    with attention_plan(pinv='tf32', tf32_float32_steps=(2, 3), pinv_pad=8,
                        eigh_dtype='float32', thin_steps=2, spectral_inference='eigh',
                        float32_products='tf32x3', tf32_products='fp16',
                        tf32_first_steps='guarded', thin_horner='always'):
        soft_attention(q, lm, v)
        soft_attention(q, lm, v, pinv_method='spectral')  # a layer's method without steps
        soft_attention(q, lm, v, iters=2)  # one formed step first, whatever the plan
    options = dict(nonnegative=True, eigh_dtype='float32', tf32_float32_steps=(2, 3), pad_to=8,
                   float32_products='tf32x3', tf32_products='fp16',
                   tf32_first_steps='guarded', thin_horner='always',
                   spectral_inference='eigh')
    assert [kwargs for _, kwargs in pinv_calls] == [
        dict(options, thin_steps=2), dict(options, thin_steps=0), dict(options, thin_steps=1)]
    # A plan forcing 20 TF32 steps changes nothing for a direct call: the same float32
    # steps around the TF32 ones (the same operations, so the same bits) as outside it.
    A, Z = hard_problem('near_identity', 64, 0)[:2]
    plain = newton_pinv_apply(A, Z, method='tf32')
    with attention_plan(tf32_float32_steps=(0, 0), thin_steps=0):
        forced = newton_pinv_apply(A, Z, method='tf32')
    assert torch.equal(forced, plain)
    assert not torch.equal(plain, newton_pinv_apply(A, Z, method='tf32',
                                                    tf32_float32_steps=(0, 0)))
    assert newton.TF32_FLOAT32_STEPS == AttentionPlan().tf32_float32_steps


@needs_one_graph_dynamo
def test_a_compiled_layer_traces_one_graph_per_plan():
    """A SOFT layer reads the plan in its forward: under torch.compile each plan in force
    gets its own graph (Dynamo guards on it), and a plan seen before reuses its graph."""
    from mmsoft.models.backbones.soft import SoftKernelAttention
    layer = SoftKernelAttention(8, 2, 2, 3)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    q, v = torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8)
    torch.compiler.reset()
    with torch.no_grad():
        compiled(q, v, (8, 8))
        with attention_plan(local_conv_layout='images', device='cpu'):
            compiled(q, v, (8, 8))
        compiled(q, v, (8, 8))
    assert len(graphs) == 2 and graphs[0] != graphs[1]
