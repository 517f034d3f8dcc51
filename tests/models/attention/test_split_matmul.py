"""The iterate's float32 products as three TF32 products in one Triton kernel
(``float32_products='tf32x3'``, ``split_matmul.py``).

Without a GPU the kernel runs in Triton's interpreter (``split_checks.py``, a process of
its own). The kernel rounds its operands' parts to TF32 itself, so the interpreter
computes the products tensor cores would: checked there against float64 and against
``newton``'s emulation of the split, which the hard kernels (test_attention.py) and the
network's floor (test_fidelity.py) run. Compiled for an H100 below: tensor-core
instructions, registers. On CUDA, tests/models/test_cuda.py.
"""
import os
import os.path as osp
import re

import pytest
import torch
from conftest import needs_sm90_compiler, run_interpreted, sm90_resources

from mmsoft.models.attention import newton_pinv_apply
from mmsoft.models.attention.dtypes import triton_available
from mmsoft.testing import hard_problem

pytestmark = pytest.mark.skipif(not triton_available(),
                                reason='the split products need Triton 3 or later')

# float32 sums of up to 200 terms against float64, and against the emulation (another
# order of sums): measured ≤ 2.3e-7 and ≤ 3.9e-7 of the largest entry; bound ~4× that (a
# dropped cross term moves them by ~2^-11)
PRODUCT_TOL = 1.5e-6


@pytest.fixture(scope='module')
def interpreted():
    """``split_checks.py``'s deviations, run in Triton's interpreter."""
    return run_interpreted(osp.join(osp.dirname(__file__), 'split_checks.py'))


def test_products_match_float64_and_the_emulation(interpreted):
    for result in interpreted['cases']:
        B, M, _, N = result['case'][:4]
        assert result['shape'] == [B, M, N]
        assert result['deviation'] <= PRODUCT_TOL, result
        assert result['from_emulation'] <= PRODUCT_TOL, result


def test_the_split_rounds_to_tf32(interpreted):
    # a remainder TF32 cannot hold is rounded, as on tensor cores: not float32's product
    rounding = interpreted['rounding']
    assert rounding['split'] == [rounding['expected']] != rounding['float32'], rounding


def test_both_block_shapes_run(interpreted):
    assert {tuple(r['blocks']) for r in interpreted['cases']} == {(128, 64), (64, 64)}


@pytest.mark.skipif(os.environ.get('TRITON_INTERPRET') == '1',
                    reason="this process runs Triton's interpreter")
def test_cpu_tensors_need_the_interpreter():
    from mmsoft.models.attention import split_matmul
    a = torch.randn(1, 4, 4)
    with pytest.raises(ValueError, match='interpreter'):
        split_matmul.baddbmm(None, a, a)


def test_emulated_split_is_float32_not_tf32():
    """Off CUDA 'tf32x3' products are emulated (operands and remainders rounded to TF32):
    CUDA's plan with them stays as close to the float64 iterate as with float32 products
    on a clustered kernel, where all 20 steps in TF32 move it 14× further (measured:
    7.1e-5 with float32 products, 7.0e-5 split, 9.6e-4 with TF32 alone)."""
    A, Z = hard_problem('clustered', 100, 0)[:2]
    ref = newton_pinv_apply(A.double(), Z.double())

    def dev(**kwargs):
        W = newton_pinv_apply(A, Z, method='tf32', pad_to=32, **kwargs)
        return ((W.double() - ref).abs().max() / ref.abs().max()).item()
    plain = dev(tf32_float32_steps=(1, 4), thin_steps=4)
    split = dev(tf32_float32_steps=(1, 4), thin_steps=4, float32_products='tf32x3')
    tf32 = dev(tf32_float32_steps=(0, 0))
    assert split <= 1.5 * plain and tf32 > 5 * split, (plain, split, tf32)


@needs_sm90_compiler
def test_kernel_compiles_to_tensor_cores_without_spills():
    """Each block shape ``baddbmm`` launches compiles for sm_90 into TF32 tensor-core
    products (wgmma) and keeps its blocks in registers: what a GPU call would otherwise
    find out first."""
    from mmsoft.models.attention import split_matmul
    for BM, BN, warps in split_matmul.BLOCKS:
        for has_c in (False, True):
            use, ptx = sm90_resources(
                split_matmul._baddbmm, dict(HAS_C=has_c, BM=BM, BN=BN,
                                            BK=split_matmul.BLOCK_K),
                warps, pointers=('a', 'b', 'c', 'out'), floats=('alpha', 'beta'))
            assert use['STACK'] == 0 and use['REG'] <= 255, (BM, BN, has_c, use)
            mma = re.findall(r'wgmma\.mma_async\S*', ptx)
            assert mma and all('.tf32.tf32' in m for m in mma), (BM, BN, set(mma))
