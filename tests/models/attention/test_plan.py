"""The attention plan (one immutable entry per device type, forced per block of code) and
the dispatch that picks a variant for each call's inputs."""
import dataclasses
import importlib.util
import threading

import pytest
import torch
from conftest import needs_one_graph_dynamo

from mmsoft.models import attention
from mmsoft.models.attention import (DEFAULT_PLAN, PLANS, TF32, VARIANTS, AttentionPlan,
                                     Inputs, Variant, VariantNotSupported, attention_plan,
                                     plan_for, select_variant, soft_attention)


def resolve(method, m, device_type='cpu', dtype=torch.float32, grad=False):
    """The variant a layer's ``pinv_method`` runs for m landmarks under the plan in force
    for a device type (eager code)."""
    inputs = Inputs(device=device_type, dtype=dtype, m=m, grad=grad)
    return select_variant(method, plan_for(device_type), inputs).name


def test_plans_are_immutable():
    with pytest.raises(TypeError):
        PLANS['cpu'] = DEFAULT_PLAN
    with pytest.raises(dataclasses.FrozenInstanceError):
        PLANS['cpu'].kernel_chunk = 1
    assert plan_for('mps') is DEFAULT_PLAN  # no measurements there
    assert plan_for('cpu') is PLANS['cpu']


def test_auto_reads_the_plan():
    assert [resolve('auto', m, 'cpu') for m in (128, 129)] == [
        'iterative', 'spectral']
    assert [resolve('auto', m, 'cuda') for m in (196, 197, 1050)] == [
        'iterative', 'tf32', 'tf32']
    # elsewhere (no measurements, no native TF32) the formed float32 iterate
    assert resolve('auto', 1050, 'mps') == 'iterative'
    assert resolve('spectral', 16, 'cuda') == 'spectral'  # asked for: taken
    assert DEFAULT_PLAN.local_conv_layout == 'images'
    assert DEFAULT_PLAN.pinv == ((1, VARIANTS['iterative']), )
    with attention_plan(pinv='spectral', device='cuda'):
        assert resolve('auto', 16, 'cuda') == 'spectral'
        assert resolve('auto', 16, 'cpu') == 'iterative'  # not forced there
        assert resolve('iterative', 16, 'cuda') == 'iterative'  # not 'auto'
    assert resolve('auto', 16, 'cuda') == 'iterative'


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
    with pytest.raises(RuntimeError), attention_plan(kernel_chunk=3):
        raise RuntimeError  # an error in the block restores the plan too
    assert plan_for('cpu') is PLANS['cpu']


def test_a_forced_name_runs_the_plans_own_variant():
    """A layer's ``pinv_method`` names a variant: the plan's own where it lists one (CUDA's
    'tf32' with CUDA's options, for any m), else the registered one (the defaults)."""
    cuda_tf32 = PLANS['cuda'].pinv[0][1]
    assert (cuda_tf32.float32_steps, cuda_tf32.pad_to, cuda_tf32.thin_steps) == ((1, 4), 32, 4)
    assert select_variant('tf32', PLANS['cuda'], Inputs('cuda', torch.float32, 16)) is cuda_tf32
    assert PLANS['cpu'].may_run('tf32') == (VARIANTS['tf32'], )
    assert VARIANTS['tf32'] == TF32() and TF32().float32_steps == (1, 8)
    assert PLANS['cuda'].may_run('auto') == (cuda_tf32, VARIANTS['iterative'])
    with attention_plan(pinv='spectral'):
        assert plan_for('cuda').may_run('auto') == (VARIANTS['spectral'], )


@pytest.mark.parametrize('choices, error', [
    (dict(chunk=4), TypeError),  # not a field
    (dict(local_conv_layout='bogus'), ValueError),
    (dict(pinv='auto'), ValueError),  # a plan names variants
    (dict(pinv='tf32x3'), ValueError),  # not a registered variant
    (dict(pinv=((128, 'iterative'), )), ValueError),  # no entry from 1 landmark on
    (dict(pinv=((1, 'iterative', 1), )), ValueError),  # not a pair
    (dict(pinv=((None, 'iterative'), )), ValueError),  # the old (largest m, name) form
    (dict(kernel_chunk=0), ValueError),
    (dict(compiled_kernel_chunks=0), ValueError),
    (dict(compiled_kernel_chunks=True), ValueError),  # not a count
    (dict(kernel_once_up_to=-1), ValueError),
    (dict(order='official'), TypeError),  # not a field: mmsoft.testing.official_order
    (dict(tf32_float32_steps=(1, 4)), TypeError),  # the TF32 variant's own: TF32(...)
])
def test_bad_choices_are_refused(choices, error):
    with pytest.raises(error):
        with attention_plan(**choices):
            pass
    assert plan_for('cpu') is PLANS['cpu']
    with pytest.raises(TypeError, match='AttentionPlan'):
        with attention_plan(dict(kernel_chunk=3)):
            pass


@pytest.mark.parametrize('options', [
    dict(float32_steps=(1, )), dict(float32_steps=(1, -2)), dict(pad_to=0),
    dict(thin_steps=-1), dict(float32_steps=(1, 4), thin_steps=5)])  # thin: last steps only
def test_bad_tf32_options_are_refused(options):
    with pytest.raises(ValueError):
        TF32(**options)


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


def test_official_order_runs_the_reference(monkeypatch):
    """``mmsoft.testing.official_order`` makes a SOFT layer compute the official order
    (``official_order_attention``) whatever its ``pinv_method``, and only inside."""
    from mmsoft.models.backbones.soft import SoftKernelAttention
    from mmsoft.testing import official_order
    layer = SoftKernelAttention(8, 2, 2, 3, pinv_method='spectral').double()
    q = torch.randn(1, 2, 64, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 64, 8, dtype=torch.float64)
    calls = []
    official = attention.soft.official_order_attention
    monkeypatch.setattr(attention.soft, 'official_order_attention',
                        lambda *a: calls.append(1) or official(*a))
    with torch.no_grad():
        ours = layer(q, v, (8, 8))
        with official_order():
            ref = layer(q, v, (8, 8))
        assert calls == [1]
        layer(q, v, (8, 8))
    assert calls == [1]
    # float64: the two orders and the two variants differ by rounding only
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
    assert plan.pinv == ((1, VARIANTS['spectral']), )
    assert plan.may_run('auto') == (VARIANTS['spectral'], )
    assert dataclasses.replace(plan, kernel_chunk=8) == AttentionPlan(pinv='spectral',
                                                                      kernel_chunk=8)
    assert AttentionPlan(pinv=TF32(pad_to=8)) == AttentionPlan(pinv=((1, TF32(pad_to=8)), ))


def test_the_iterates_options_are_the_variants_own(monkeypatch):
    """'tf32' computes with its own options (the plan lists a configured ``TF32``); the
    reference 'iterative' takes none: formed, unpadded, every step formed."""
    from mmsoft.models.attention import newton
    calls = []

    def recording(cls):
        plain = cls.apply

        def apply(self, A, Z, iters):
            options = dataclasses.astuple(self) if dataclasses.is_dataclass(self) else ()
            calls.append((self.name, A.shape[-1], iters, options))
            return plain(self, A, Z, iters)
        monkeypatch.setattr(cls, 'apply', apply)

    recording(newton.TF32)
    recording(newton.Iterative)
    q, v = torch.randn(1, 1, 64, 8) * 0.3, torch.randn(1, 1, 64, 8)
    lm = torch.randn(1, 1, 16, 8) * 0.3
    with attention_plan(pinv=TF32(float32_steps=(2, 3), pad_to=8, thin_steps=2)):
        soft_attention(q, lm, v)
        soft_attention(q, lm, v, pinv_method='iterative')
    soft_attention(q, lm, v, pinv_method='tf32')  # the registered one, off a plan
    assert calls == [('tf32', 16, 20, ((2, 3), 8, 2)), ('iterative', 16, 20, ()),
                     ('tf32', 16, 20, ((1, 8), 1, 0))]


# ----------------------------------------------------------------------------- dispatch
def _inputs(device='cpu', dtype=torch.float32, m=64, grad=False, **flags):
    return Inputs(device=device, dtype=dtype, m=m, grad=grad,
                  compiling=flags.get('compiling', False), tracing=flags.get('tracing', False),
                  capturing=flags.get('capturing', False))


def test_each_device_lists_its_variants_in_order():
    """The order each device's plan tries, by landmark count, ending with the reference
    ('iterative', which runs on every input; the variant 'auto' takes for a float32
    kernel in eager code: test_auto_reads_the_plan)."""
    cpu, cuda = PLANS['cpu'], PLANS['cuda']
    assert cpu.pinv == ((449, VARIANTS['tridiagonal']), (129, VARIANTS['spectral']),
                        (1, VARIANTS['iterative']))
    assert [v.name for _, v in cuda.pinv] == ['tf32', 'iterative'] and cuda.pinv[0][0] == 197
    assert DEFAULT_PLAN.pinv == ((1, VARIANTS['iterative']), )

    def auto(plan, m, **flags):
        return select_variant('auto', plan, _inputs(m=m, **flags)).name

    assert [auto(cpu, m) for m in (128, 129, 448, 449)] == [
        'iterative', 'spectral', 'spectral', 'tridiagonal']
    assert [auto(cpu, m, grad=True) for m in (128, 448, 449)] == [
        'iterative', 'spectral', 'spectral']
    assert [auto(cuda, m) for m in (196, 197)] == ['iterative', 'tf32']
    assert all(plan.pinv[-1] == (1, VARIANTS['iterative'])
               for plan in (*PLANS.values(), DEFAULT_PLAN))
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


class _SmallOnly(Variant):
    """A test variant: inference on the CPU, recording its calls."""
    name = 'test-small'
    devices = ('cpu', )
    gradients = False
    requires = ('a_module_that_is_not_installed_here', )
    calls = []

    def apply(self, A, Z, iters):
        self.calls.append(A.shape[-1])
        return VARIANTS['iterative'].apply(A, Z, iters)


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
    assert reasons == ['runs on cpu, not cuda', 'computes no gradients',
                       'needs a_module_that_is_not_installed_here, which is not installed']
    with pytest.raises(ValueError, match='exists already'):
        register_variant(_SmallOnly())
    with pytest.raises(TypeError, match='named Variant'):
        register_variant(object())
    small_variant.requires = ()  # on the instance: as if installed
    q, v = torch.randn(1, 1, 64, 8) * 0.3, torch.randn(1, 1, 64, 8)
    plan = AttentionPlan(pinv=((33, 'iterative'), (1, 'test-small'), (1, 'iterative')))
    with attention_plan(plan, device='cpu'):
        with torch.no_grad():
            for m in (16, 40):
                soft_attention(q, torch.randn(1, 1, m, 8) * 0.3, v)
        soft_attention(q.requires_grad_(), torch.randn(1, 1, 16, 8) * 0.3, v)  # no grads
    assert small_variant.calls == [16]  # 40 landmarks: 'iterative' first


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


def test_a_layer_reaches_the_iterate_through_few_functions():
    """What a reader follows from a SOFT layer's forward to the Newton iterate (CUDA's
    plan on the meta device, inference, m = 1050 as SOFT-S's stage 1 at 800×1344): each
    decision made once, the functions of mmsoft called on the way (comprehensions aside)
    at most 20, in at most 5 files."""
    import os
    import sys

    import mmsoft
    from mmsoft.models.backbones.soft import SoftKernelAttention
    root = os.path.dirname(mmsoft.__file__) + os.sep
    seen, reached = [], []

    def profile(frame, event, arg):
        code = frame.f_code
        if reached or event != 'call' or not code.co_filename.startswith(root):
            return
        name = getattr(code, 'co_qualname', code.co_name)  # Python >= 3.11: qualified
        if '<' not in name and (code.co_filename, name) not in seen:
            seen.append((code.co_filename, name))
        if code.co_name == '_newton_steps':
            reached.append(name)

    layer = SoftKernelAttention(32, 2, 8, 9).to('meta')
    q = torch.empty(1, 2, 200 * 336, 32, device='meta')
    with attention_plan(PLANS['cuda'], device='meta'), torch.no_grad():
        sys.setprofile(profile)
        try:
            layer(q, q, (200, 336))
        finally:
            sys.setprofile(None)
    assert reached, 'the iterate did not run'
    files = {f for f, _ in seen}
    assert len(seen) <= 20 and len(files) <= 5, [n for _, n in seen]
    names = [n.split('.')[-1] for _, n in seen]
    assert names.count('select_variant') == names.count('plan_for') == 1
