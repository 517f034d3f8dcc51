"""The attention plan (one immutable entry per device type, forced per block of code) and
the dispatch that picks a variant for each call's inputs."""
import dataclasses
import importlib.util
import threading

import pytest
import torch
from conftest import needs_one_graph_dynamo

from mmsoft.models import attention
from mmsoft.models.attention import (DEFAULT_PLAN, PLANS, VARIANTS, AttentionPlan, Inputs,
                                     VariantNotSupported, attention_plan, plan_for,
                                     resolve_pinv_method, select_variant, soft_attention)
from mmsoft.models.attention.dispatch import InverseVariant


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
    assert resolve_pinv_method('spectral', 16, 'cuda') == 'spectral'  # asked for: taken
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
    """CUDA's plan applies its last float32 steps to the thin matrix. Forcing 'spectral'
    on every device type (the module docstring's example) keeps that choice for layers
    whose ``pinv_method`` ends in float32 steps, and applies none to the forced method."""
    cuda = PLANS['cuda']
    assert cuda.thin_steps > 0
    with attention_plan(pinv='spectral'):
        plan = plan_for('cuda')
        assert plan.variants_for(1050) == ('spectral', )
        assert plan.thin_steps_for('spectral', 20) == 0
        assert plan.thin_steps_for('tf32', 20) == cuda.thin_steps


@pytest.mark.parametrize('choices, error', [
    (dict(chunk=4), TypeError),  # not a field
    (dict(local_conv_layout='bogus'), ValueError),
    (dict(pinv='auto'), ValueError),  # a plan names variants
    (dict(pinv='tf32x3'), ValueError),  # not a registered variant
    (dict(pinv=((128, 'iterative'), )), ValueError),  # no entry for every m
    (dict(pinv=((128, 'iterative', 1), (None, 'iterative'))), ValueError),  # not a pair
    (dict(kernel_chunk=0), ValueError),
    (dict(compiled_kernel_chunks=0), ValueError),
    (dict(compiled_kernel_chunks=True), ValueError),  # not a count
    (dict(order='fast'), ValueError),
    (dict(kernel_products='fused'), ValueError),  # not registered
    (dict(kernel_products=()), ValueError),
    (dict(tf32_float32_steps=(1, )), ValueError),
    (dict(tf32_float32_steps=(1, -2)), ValueError),
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
    assert plan.pinv == ((None, 'spectral'), ) and plan.variants_for(10**6) == ('spectral', )
    assert plan.kernel_products == ('chunks', )
    assert dataclasses.replace(plan, kernel_chunk=8) == AttentionPlan(pinv='spectral',
                                                                      kernel_chunk=8)


@pytest.fixture
def pinv_calls(monkeypatch):
    """The calls the library's variants make to newton_pinv_apply while the test runs,
    each as (its kernel's landmark count m, its method, its keyword options); the calls
    still compute."""
    from mmsoft.models.attention import dispatch, newton_pinv_apply
    calls = []

    def recording(A, Z, iters, method, **kwargs):
        calls.append((A.shape[-1], method, kwargs))
        return newton_pinv_apply(A, Z, iters, method, **kwargs)

    monkeypatch.setattr(dispatch, 'newton_pinv_apply', recording)
    return calls


def test_the_iterates_options_come_from_the_plan(pinv_calls):
    """The variants pass the plan's options of the iterate ('tf32''s float32 steps, the
    padding, the thin steps) down to newton_pinv_apply, whose own defaults read no
    plan."""
    from mmsoft.models.attention import newton, newton_pinv_apply
    from mmsoft.testing import hard_problem
    q, v = torch.randn(1, 1, 64, 8) * 0.3, torch.randn(1, 1, 64, 8)
    lm = torch.randn(1, 1, 16, 8) * 0.3
    with attention_plan(pinv='tf32', tf32_float32_steps=(2, 3), pinv_pad=8, thin_steps=2):
        soft_attention(q, lm, v)
        soft_attention(q, lm, v, pinv_method='spectral')  # a layer's method without steps
        soft_attention(q, lm, v, iters=2)  # one formed step first, whatever the plan
        soft_attention(q, lm, v, pinv_method='iterative')
    tf32 = dict(nonnegative=True, tf32_float32_steps=(2, 3), pad_to=8)
    assert [(method, kwargs) for _, method, kwargs in pinv_calls] == [
        ('tf32', dict(tf32, thin_steps=2)), ('spectral', dict(nonnegative=True)),
        ('tf32', dict(tf32, thin_steps=1)),
        ('iterative', dict(nonnegative=True, pad_to=8, thin_steps=2))]
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


# ----------------------------------------------------------------------------- dispatch
def _inputs(device='cpu', dtype=torch.float32, m=64, grad=False, **flags):
    return Inputs(device=device, dtype=dtype, m=m, grad=grad,
                  compiling=flags.get('compiling', False), tracing=flags.get('tracing', False),
                  capturing=flags.get('capturing', False))


def test_each_device_lists_its_variants_in_order():
    """The order each device's plan tries, by landmark count, ending with the reference
    ('iterative', which runs on every input; the variant 'auto' takes for a float32
    kernel in eager code: test_auto_reads_the_plan)."""
    assert [PLANS['cpu'].variants_for(m) for m in (128, 129, 449)] == [
        ('iterative', 'spectral', 'tridiagonal'), ('spectral', 'tridiagonal', 'iterative'),
        ('tridiagonal', 'spectral', 'iterative')]
    assert [PLANS['cuda'].variants_for(m) for m in (196, 197)] == [
        ('iterative', 'tf32'), ('tf32', 'iterative')]
    assert DEFAULT_PLAN.variants_for(10**4) == ('iterative', )
    assert all(plan.pinv[-1] == (None, 'iterative') for plan in (*PLANS.values(), DEFAULT_PLAN))
    for inputs in (_inputs('meta', torch.float64, 10**4, True, compiling=True, tracing=True),
                   _inputs('cuda', capturing=True), _inputs('mps')):
        assert VARIANTS['iterative'].not_supported_reasons(inputs) == []


def test_the_first_variant_that_can_run_wins():
    """Where a listed variant cannot run on a call's inputs the next one does: CUDA's
    'tf32' rounds float32 operands (a float64 kernel runs the float32 list's reference),
    the CPU's 'tridiagonal' computes no gradients and runs eagerly (with gradients or
    under torch.compile 'spectral' runs), 'spectral' reads values on the host (under
    torch.jit.trace, as the ONNX export traces, the iterate runs)."""
    cuda, cpu = PLANS['cuda'], PLANS['cpu']
    assert select_variant('auto', cuda, _inputs('cuda', m=1050)).name == 'tf32'
    assert select_variant('auto', cuda, _inputs('cuda', torch.float64, 1050)).name == 'iterative'
    assert select_variant('auto', cpu, _inputs(m=400)).name == 'spectral'
    assert select_variant('auto', cpu, _inputs(m=1050, grad=True)).name == 'spectral'
    assert select_variant('auto', cpu, _inputs(m=1050, compiling=True)).name == 'spectral'
    if importlib.util.find_spec('scipy'):  # SciPy's LAPACK
        assert select_variant('auto', cpu, _inputs(m=1050)).name == 'tridiagonal'
    assert select_variant('auto', cpu, _inputs(m=1050, tracing=True)).name == 'iterative'
    q = torch.randn(1, 1, 300, 8, dtype=torch.float64) * 0.3
    lm = torch.randn(1, 1, 150, 8, dtype=torch.float64) * 0.3
    with attention_plan(PLANS['cuda'], device='cpu'):  # CUDA's list, on the CPU
        out = soft_attention(q, lm, q)
    torch.testing.assert_close(out, soft_attention(q, lm, q, pinv_method='iterative'),
                               rtol=1e-12, atol=1e-12)


def test_a_forced_variant_that_cannot_run_names_its_reasons():
    """A layer's ``pinv_method`` and a forced plan go through the same check and never
    fall back: the error names each variant asked for and why it cannot run."""
    q = torch.randn(1, 1, 40, 8, dtype=torch.float64) * 0.3
    lm = torch.randn(1, 1, 10, 8, dtype=torch.float64) * 0.3
    with pytest.raises(VariantNotSupported,
                       match=r"pinv_method='tf32'.*'tf32': takes float32 kernels, not float64"):
        soft_attention(q, lm, q, pinv_method='tf32')
    with attention_plan(pinv='tf32'), pytest.raises(VariantNotSupported, match='not float64'):
        soft_attention(q, lm, q)
    with pytest.raises(VariantNotSupported, match="'spectral': runs on cpu, cuda, not meta"):
        select_variant('spectral', DEFAULT_PLAN, _inputs('meta'))
    reasons = VARIANTS['spectral'].not_supported_reasons(_inputs('cuda', capturing=True,
                                                                 tracing=True))
    assert reasons == ['cannot be traced by torch.jit.trace',
                       'reads values on the host, which a CUDA graph capture cannot']
    with pytest.raises(ValueError, match='pinv_method must be one of'):
        soft_attention(q, lm, q, pinv_method='tf32x3')


class _SmallOnly(InverseVariant):
    """A test variant: inference on the CPU up to 32 landmarks, recording its calls."""
    name = 'test-small'
    devices = ('cpu', )
    max_m = 32
    gradients = False
    requires = ('a_module_that_is_not_installed_here', )
    calls = []

    def apply(self, A, Z, iters, plan):
        self.calls.append(A.shape[-1])
        return VARIANTS['iterative'].apply(A, Z, iters, plan)


@pytest.fixture
def small_variant():
    from mmsoft.models.attention import register_variant
    variant = register_variant(_SmallOnly())
    yield variant
    del VARIANTS[variant.name]


def test_a_registered_variant_joins_the_dispatch(small_variant):
    """A package outside the library registers a variant (``register_variant``): layers
    and plans may then name it, and its declared support decides where it runs."""
    from mmsoft.models.attention import register_variant
    from mmsoft.models.backbones.soft import SoftKernelAttention
    assert 'test-small' in attention.pinv_methods()
    assert SoftKernelAttention(8, 1, 2, 3, pinv_method='test-small').pinv_method == 'test-small'
    reasons = small_variant.not_supported_reasons(_inputs('cuda', m=40, grad=True))
    assert reasons == ['runs on cpu, not cuda', 'takes 1 to 32 landmarks, not 40',
                       'computes no gradients',
                       'needs a_module_that_is_not_installed_here, which is not installed']
    with pytest.raises(ValueError, match='exists already'):
        register_variant(_SmallOnly())
    with pytest.raises(TypeError, match='named InverseVariant'):
        register_variant(object())
    small_variant.requires = ()  # on the instance: as if installed
    q, v = torch.randn(1, 1, 64, 8) * 0.3, torch.randn(1, 1, 64, 8)
    plan = AttentionPlan(pinv=((None, 'test-small'), (None, 'iterative')))
    with attention_plan(plan, device='cpu'), torch.no_grad():
        for m in (16, 40):
            soft_attention(q, torch.randn(1, 1, m, 8) * 0.3, v)
    assert small_variant.calls == [16]  # 40 landmarks: the next in the list


def test_kernel_products_are_dispatched_too():
    """P's chunks go to the first of the plan's ``kernel_products`` that can run; the
    library's 'chunks' run everywhere."""
    from mmsoft.models.attention import KERNEL_PRODUCTS, KernelProducts
    from mmsoft.models.attention import register_kernel_products

    class Float64Only(KernelProducts):
        name = 'test-float64'
        dtypes = (torch.float64, )
        seen = []

        def form(self, fq, fl):
            self.seen.append(fq.dtype)
            return KERNEL_PRODUCTS['chunks'].form(fq, fl)

        def form_with_grad(self, fq, fl, left, right, keep_p):
            self.seen.append(fq.dtype)
            return KERNEL_PRODUCTS['chunks'].form_with_grad(fq, fl, left, right, keep_p)

    products = register_kernel_products(Float64Only())
    try:
        with attention_plan(kernel_products=('test-float64', 'chunks')):
            for dtype in (torch.float32, torch.float64):
                q = (torch.randn(1, 1, 30, 8, dtype=dtype) * 0.3).requires_grad_()
                soft_attention(q, q[..., :6, :].detach(), q.detach()).sum().backward()
        assert set(products.seen) == {torch.float64}
        with attention_plan(kernel_products='test-float64'), pytest.raises(
                VariantNotSupported, match="kernel_products.*'test-float64': takes float64"):
            soft_attention(torch.randn(1, 1, 30, 8), torch.randn(1, 1, 6, 8),
                           torch.randn(1, 1, 30, 8))
    finally:
        del KERNEL_PRODUCTS['test-float64']


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
