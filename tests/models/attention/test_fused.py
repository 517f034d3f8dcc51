"""P's products in the fused Triton kernels (``kernel_products='fused'``).

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


def test_attention_layer_matches_float64(interpreted):
    # outputs with and without gradients, then ∇q, ∇landmarks, ∇v
    for kind in ('fused', 'chunks', 'fused split'):
        devs = interpreted['layer'][kind]
        assert max(devs) <= LAYER_TOL, (kind, devs)


def test_backbone_keeps_the_floor(interpreted):
    # SOFT-T's four output maps and one training step's parameter gradients against the
    # float64 official order, as tools/analysis_tools/fidelity.py measures the floor
    for kind in ('fused', 'chunks', 'fused split'):
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
def test_cpu_tensors_need_the_interpreter():
    with attention_plan(kernel_products='fused', device='cpu'):
        with pytest.raises(ValueError, match='interpreter'):
            soft_attention(*_layer_inputs())


def test_float64_runs_the_library_products():
    # the fused kernels are float32 only: float64 keeps P's row chunks (no interpreter
    # needed in this process)
    inputs = _layer_inputs(torch.float64)
    ref = soft_attention(*inputs)
    with attention_plan(kernel_products='fused', device='cpu'):
        assert rel_err(soft_attention(*inputs), ref) < 1e-12


@needs_one_graph_dynamo
def test_compiled_code_runs_the_library_products():
    # under torch.compile P's products keep the row chunks, whatever the plan says
    inputs = _layer_inputs()
    ref = soft_attention(*inputs)
    with attention_plan(kernel_products='fused', device='cpu'):
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
