"""P's products in the fused Triton kernels (``kernel_products='fused'``), and P and G
written by one Triton kernel for the library's products (``kernel_products='triton_chunks'``).

Without a GPU the kernels run in Triton's interpreter, which Triton selects when it is
imported (TRITON_INTERPRET=1): ``fused_checks.py`` runs them in a process of its own and
prints its deviations from float64, which the tests below bound. On CUDA,
tests/models/test_cuda.py checks them compiled (parity fixtures, training gradients, no
host-device syncs).
"""
import os
import os.path as osp
import re

import pytest
import torch
from conftest import (needs_one_graph_dynamo, needs_sm90_compiler, rel_err, run_interpreted,
                      sm90_resources)

from mmsoft.models.attention import attention_plan, soft_attention
from mmsoft.models.attention.plan import triton_available
from mmsoft.testing import GRADIENT_TOL, OUTPUT_TOL

pytestmark = pytest.mark.skipif(not triton_available(),
                                reason='the fused kernels need Triton 3 or later')

# float32 sums of up to 150 terms against float64: the fused kernels and the library
# products both measured ≤ 3.8e-7 (products, backward) and ≤ 1.2e-6 (the layer's outputs
# and gradients); bounds 5× and 3.3× that
PRODUCT_TOL = 2e-6
LAYER_TOL = 4e-6
# the kernels' pointer arguments (the others are ints or constants)
FUSED_POINTERS = ('fq', 'fl', 'x', 'y', 'left', 'right', 'out', 'grad_q', 'grad_l')
TRITON_CHUNKS_POINTERS = ('fq', 'fl', 'left', 'right', 'p', 'g')


@pytest.fixture(scope='module')
def interpreted():
    """``fused_checks.py``'s deviations, run in Triton's interpreter."""
    return run_interpreted(osp.join(osp.dirname(__file__), 'fused_checks.py'))


def test_partial_sums_over_row_slices(interpreted):
    # the columns kernel summed over more than one slice of the rows
    assert interpreted['splits'] >= 2


@pytest.mark.parametrize('transpose', ['False', 'True'])
def test_products_match_float64(interpreted, transpose):
    fused, chunks, split = interpreted['products'][transpose]
    assert fused <= PRODUCT_TOL, (fused, chunks)
    assert split <= PRODUCT_TOL, (split, chunks)  # TF32 products of split operands
    assert chunks <= PRODUCT_TOL  # the library products meet the same bound


def test_backward_gives_what_is_needed_within_float32(interpreted):
    for case, (fused, chunks, split) in interpreted['backward'].items():
        needs = eval(case.split(' ', 1)[1])  # (∇W, ∇q, ∇l) asked for
        for i, need in enumerate(needs):
            # the same gradients as the library products, None where not asked for
            assert (fused[i] is None) == (chunks[i] is None) == (not need), case
            if need:
                assert fused[i] <= PRODUCT_TOL, (case, i, fused, chunks)
                assert split[i] <= PRODUCT_TOL, (case, i, split, chunks)


@pytest.mark.parametrize('transpose', ['False', 'True'])
def test_backward_takes_an_expanded_gradient(interpreted, transpose):
    # ∇out of a sum: a float32 scalar expanded, with no unit stride
    devs = interpreted['expanded'][transpose]
    assert max(devs) <= PRODUCT_TOL, devs


@pytest.mark.parametrize('kind', ['float32', 'split'])
def test_triton_chunks_kernel_writes_p_and_g_within_float32(interpreted, kind):
    chunks = interpreted['triton_chunks']
    assert chunks['kernel'][kind] <= PRODUCT_TOL, chunks['kernel']
    p, g = chunks['grad'][f'{kind} True']
    assert p <= PRODUCT_TOL and g <= PRODUCT_TOL, (p, g)
    p, g = chunks['grad'][f'{kind} False']  # G alone: P not written
    assert p is None and g <= PRODUCT_TOL, (p, g)


@pytest.mark.parametrize('kind', ['float32', 'split'])
def test_triton_chunks_products_and_backward(interpreted, kind):
    # the library's products over the chunks the kernel writes, against float64
    chunks = interpreted['triton_chunks']
    for transpose in ('False', 'True'):
        assert chunks['products'][f'{kind} {transpose}'] <= PRODUCT_TOL, chunks['products']
    for case, devs in chunks['backward'].items():
        if not case.startswith(kind):
            continue
        needs = eval(case.split(' ', 2)[2])
        for i, need in enumerate(needs):
            assert (devs[i] is None) == (not need), case
            assert devs[i] is None or devs[i] <= PRODUCT_TOL, (case, devs)
    for transpose, devs in chunks['expanded'].items():
        assert max(devs) <= PRODUCT_TOL, (transpose, devs)


def test_attention_layer_matches_float64(interpreted):
    # outputs with and without gradients, then ∇q, ∇landmarks, ∇v
    for kind in ('fused', 'chunks', 'fused split', 'triton_chunks', 'triton_chunks split'):
        devs = interpreted['layer'][kind]
        assert max(devs) <= LAYER_TOL, (kind, devs)


def test_backbone_keeps_the_floor(interpreted):
    # SOFT-T's four output maps and one training step's parameter gradients against the
    # float64 official order, as tools/analysis_tools/fidelity.py measures the floor
    for kind in ('fused', 'chunks', 'fused split', 'triton_chunks', 'triton_chunks split'):
        result = interpreted['backbone'][kind]
        assert max(result['maps']) <= OUTPUT_TOL, (kind, result)
        assert result['gradient'] <= GRADIENT_TOL, (kind, result)


def _layer_inputs(dtype=torch.float32):
    torch.manual_seed(0)
    q = torch.randn(1, 2, 70, 16, dtype=dtype) * 0.4
    lm = torch.randn(1, 2, 9, 16, dtype=dtype) * 0.4
    return q, lm, torch.randn(1, 2, 70, 16, dtype=dtype)


@pytest.mark.skipif(os.environ.get('TRITON_INTERPRET') == '1',
                    reason="this process runs Triton's interpreter")
@pytest.mark.parametrize('products', ['fused', 'triton_chunks'])
@pytest.mark.parametrize('grad', [False, True])
def test_cpu_tensors_need_the_interpreter(products, grad):
    inputs = [t.requires_grad_(grad) for t in _layer_inputs()]
    with attention_plan(kernel_products=products, device='cpu'):
        with pytest.raises(ValueError, match='interpreter'):
            soft_attention(*inputs)


@pytest.mark.parametrize('products', ['fused', 'triton_chunks'])
def test_float64_runs_the_library_products(products):
    # the Triton kernels are float32 only: float64 keeps P's row chunks (no interpreter
    # needed in this process)
    inputs = _layer_inputs(torch.float64)
    ref = soft_attention(*inputs)
    with attention_plan(kernel_products=products, device='cpu'):
        assert rel_err(soft_attention(*inputs), ref) < 1e-12


@needs_one_graph_dynamo
@pytest.mark.parametrize('products', ['fused', 'triton_chunks'])
def test_compiled_code_runs_the_library_products(products):
    # under torch.compile P's products keep the row chunks, whatever the plan says
    inputs = _layer_inputs()
    ref = soft_attention(*inputs)
    with attention_plan(kernel_products=products, device='cpu'):
        out = torch.compile(soft_attention, backend='eager', fullgraph=True)(*inputs)
    assert rel_err(out, ref) < 1e-6  # float32: measured identical, one chunk either way


def _compiled(backward, split, kernel, has):
    """(registers and stack per thread, PTX) of a fused program as ``fused.product`` /
    ``fused.backward`` launch it, compiled for sm_90."""
    from mmsoft.models.attention import fused
    options = fused._launch_options(64 if backward else 0, backward, split)
    warps = options.pop('num_warps')
    options.update(HAS_G=backward, EXACT_EXP=True, DP=32)
    size = 'XP' if has == 'HAS_X' else 'YP'
    return sm90_resources(kernel, {**options, has: True, size: 32}, warps,
                          pointers=FUSED_POINTERS)


@needs_sm90_compiler
@pytest.mark.parametrize('backward, split', [(False, False), (True, False), (False, True)])
def test_kernels_compile_for_h100_without_spills(backward, split):
    """The programs as ``fused.product`` and ``fused.backward`` launch them compile for
    sm_90 and keep their blocks in registers (a spill to local memory would cost each
    program a round trip to memory per block): what a GPU call would otherwise find out
    first. They multiply in float32 on the CUDA cores, with no TF32 tensor-core
    instruction (mma/wgmma), which would miss the floor; with split products (forward
    programs only: ``fused._launch_options``) in TF32 wgmma products of split operands,
    their logits too: the CUDA cores' FMAs of the logits are gone."""
    from mmsoft.models.attention import fused
    assert fused._launch_options(0, backward, split)['SPLIT'] == (split and not backward)
    assert not fused._launch_options(64, True, True)['SPLIT']  # backward never splits
    for kernel, has in ((fused._rows, 'HAS_X'), (fused._cols, 'HAS_Y')):
        use, ptx = _compiled(backward, split, kernel, has)
        assert use['STACK'] == 0 and use['REG'] <= 255, (kernel.__name__, use)
        mma = re.findall(r'\b(?:wg)?mma\.\S*', ptx)  # mma.sync, wgmma.mma_async
        if split:
            products = [m for m in mma if 'mma_async' in m]
            assert products and all('.tf32.tf32' in m for m in products), set(mma)
            _, float32 = _compiled(backward, False, kernel, has)
            assert 4 * ptx.count('fma.rn.f32') < float32.count('fma.rn.f32'), kernel.__name__
        else:
            assert 'fma.rn.f32' in ptx, kernel.__name__  # the logits, the products
            assert 'tf32' not in ptx and not mma, kernel.__name__


@needs_sm90_compiler
@pytest.mark.parametrize('split', [False, True])
@pytest.mark.parametrize('has_p, has_g', [(True, False), (True, True), (False, True)])
def test_triton_chunks_kernel_compiles_for_h100_without_spills(split, has_p, has_g):
    """The kernel that writes P (and G) compiles for sm_90 as ``triton_chunks.py`` launches it,
    its blocks in registers (SOFT's head depth 32, ∇P's depth 64 as kernel_attention's
    backward gives it); float32 products on the CUDA cores, or with ``split`` TF32 wgmma
    products of split operands, as ``fused.py``'s forward programs."""
    from mmsoft.models.attention import triton_chunks
    options = triton_chunks.launch_options(split)
    warps = options.pop('num_warps')
    options.update(HAS_P=has_p, HAS_G=has_g, DP=32)
    use, ptx = sm90_resources(triton_chunks._form, options, warps,
                              pointers=TRITON_CHUNKS_POINTERS)
    # two programs of 8 warps per streaming multiprocessor (measured 80-120)
    assert use['STACK'] == 0 and use['REG'] <= 128, use
    mma = re.findall(r'\b(?:wg)?mma\.\S*', ptx)
    if split:
        products = [m for m in mma if 'mma_async' in m]
        assert products and all('.tf32.tf32' in m for m in products), set(mma)
    else:
        assert 'fma.rn.f32' in ptx and 'tf32' not in ptx and not mma
