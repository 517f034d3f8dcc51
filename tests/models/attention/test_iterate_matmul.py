"""The iterate's products on tensor cores (``iterate_matmul.py``): float32 products as
three TF32 or fp16 products of split operands (``float32_products='tf32x3'`` or
``'fp16x3'``) and TF32 products from fp16 tensor cores (``tf32_products='fp16'``); the
fp16 ones made both ways, in one Triton kernel or as cuBLAS's fp16 products between
Triton passes that convert the operands and undo the scales.

Without a GPU the Triton programs run in Triton's interpreter (``iterate_checks.py``, a
process of its own), and cuBLAS's fp16 products are float32 library products of the fp16
values (exact products, float32 sums). The operands are rounded by the programs
themselves, so the interpreter computes the products tensor cores would: checked there
against float64 and against ``newton``'s emulation of each rounding, which the hard
kernels (test_attention.py) and the network's floor (test_fidelity.py) run. Compiled for
an H100 below: tensor-core instructions, registers. On CUDA, tests/models/test_cuda.py.
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
                                reason='the iterate kernel needs Triton 3 or later')

# float32 sums of up to 200 terms against float64, and against the emulation (another
# order of sums): measured ≤ 4.1e-7 and ≤ 4.7e-7 of the largest entry, every precision
# and way; bound over 3× that (a dropped cross term moves them by ~2^-11)
PRODUCT_TOL = 1.5e-6


@pytest.fixture(scope='module')
def interpreted():
    """``iterate_checks.py``'s deviations, run in Triton's interpreter."""
    return run_interpreted(osp.join(osp.dirname(__file__), 'iterate_checks.py'))


KINDS = ['tf32x3 triton', 'fp16 triton', 'fp16 cublas', 'fp16x3 triton', 'fp16x3 cublas']


@pytest.mark.parametrize('kind', KINDS)
def test_products_match_float64(interpreted, kind):
    """Sizes not multiples of the blocks, transposed operands, the epilogue: float32's
    accuracy from three tensor-core products ('tf32x3', 'fp16x3'), against float64 and
    the emulation; 'fp16': float32's sums away from float64 of the operands rounded as
    ``round_fp16_scaled`` rounds them (measured ≤ 4.1e-7). The fp16 products see each
    matrix of a batch at its own magnitude (1e-7, 1, 3e6: outside fp16's range
    unscaled) and pass each result's max |entry| on to the next product: the max of the
    stored values (a max, no rounding: equal). cuBLAS's way converts the operands once
    and undoes the scales in a pass of its own: the same values multiplied."""
    precision = kind.split()[0]
    for result in interpreted['cases'][kind]:
        B, M, _, N = result['case'][:4]
        assert result['shape'] == [B, M, N]
        assert len(result['deviations']) == B
        assert max(result['deviations']) <= PRODUCT_TOL, result
        if precision != 'fp16':
            assert result['from_emulation'] <= PRODUCT_TOL, result
        if precision != 'tf32x3':
            assert result['amax_equal'], result


@pytest.mark.parametrize('gemm', ['triton', 'cublas'])
def test_fp16_product_of_a_zero_matrix_is_zero(interpreted, gemm):
    assert interpreted['zero'][gemm] == dict(zero_product=0., zero_amax=0.)


@pytest.mark.parametrize('gemm', ['triton', 'cublas'])
def test_the_split_rounds_to_tf32(interpreted, gemm):
    # a remainder TF32 cannot hold is rounded, as on tensor cores: not float32's product
    rounding = interpreted['rounding'][gemm]
    assert rounding['split'] == [rounding['expected']] != rounding['float32'], rounding
    assert rounding['split16'] == rounding['split'], rounding  # the same split in fp16


@pytest.mark.parametrize('gemm', ['triton', 'cublas'])
def test_fp16_rounds_as_tf32(interpreted, gemm):
    # 10 mantissa bits, to nearest, also 2^-20 below the matrix's largest entry
    rounding = interpreted['rounding'][gemm]
    assert rounding['fp16'] == [rounding['fp16_expected']], rounding
    assert rounding['fp16_expected'] != rounding['float32'][0] * 2.**-20


@pytest.mark.parametrize('gemm', ['triton', 'cublas'])
@pytest.mark.parametrize('precision', ['fp16', 'fp16x3'])
def test_fp16_newton_steps_match_the_emulation(interpreted, precision, gemm):
    """Five steps, A converted once for every step and V once for both of its products,
    the maxima passed from product to product (``_newton_steps_fp16``), against the
    emulated steps (measured in the kernel: 'fp16' 2.7e-7 apart, both 3.5e-6 from
    float64, TF32's rounding; 'fp16x3' 1.1e-7 apart, both 1.8e-7 from float64; cuBLAS's
    way, whose stand-in here sums as the emulation does, 0 apart); each way's steps as
    far from float64 as the emulation's, within a quarter or float32's rounding
    (another order of sums)."""
    steps = interpreted['steps'][gemm][precision]
    assert steps['from_emulation'] <= 4 * PRODUCT_TOL, steps
    assert steps['from_float64'] <= max(1.25 * steps['emulated_from_float64'],
                                        PRODUCT_TOL), steps


def test_the_benchmark_measures_every_way(interpreted):
    """The matmul section's GPU-only columns, run in the interpreter: each way's Newton
    steps, and each product within float32's accuracy of float64 (of the operands, or
    as 'fp16' rounds them)."""
    from mmsoft.models.attention.iterate_matmul import fp16_gemm
    bench = interpreted['benchmark']
    ways = ['fp16 kernel', 'fp16x3 kernel']
    if fp16_gemm() == 'cublas':
        ways += ['fp16 cuBLAS', 'fp16x3 cuBLAS']
    assert bench['steps'] == ['float32', 'tf32'] + ways, bench
    assert set(bench['deviations']) == {'tf32x3 kernel', *ways}, bench
    assert max(bench['deviations'].values()) <= PRODUCT_TOL, bench


def test_both_block_shapes_run(interpreted):
    for kind, shapes in (('tf32x3 triton', {(128, 64), (64, 64)}),
                         ('fp16 triton', {(128, 128), (64, 64)}),
                         ('fp16x3 triton', {(128, 128), (64, 64)})):
        assert {tuple(r['blocks']) for r in interpreted['cases'][kind]} == shapes, kind


@pytest.mark.skipif(os.environ.get('TRITON_INTERPRET') == '1',
                    reason="this process runs Triton's interpreter")
def test_cpu_tensors_need_the_interpreter():
    from mmsoft.models.attention import iterate_matmul
    a = torch.randn(1, 4, 4)
    for precision in iterate_matmul.PRECISIONS:
        for gemm in iterate_matmul.GEMMS:
            with pytest.raises(ValueError, match='interpreter'):
                iterate_matmul.baddbmm(None, a, a, precision=precision, gemm=gemm)
    with pytest.raises(ValueError, match='interpreter'):
        iterate_matmul.fp16_operand(a, a.abs().amax((-2, -1)), 'fp16')


def test_wrong_fp16_operands_are_refused():
    from mmsoft.models.attention import iterate_matmul
    a = torch.randn(1, 4, 4)
    with pytest.raises(ValueError, match="gemm must be one of .*'cublas'"):
        iterate_matmul.baddbmm(None, a, a, precision='fp16', gemm='cutlass')
    with pytest.raises(ValueError, match="made for 'fp16' or 'fp16x3'"):
        iterate_matmul.fp16_operand(a, a.abs().amax((-2, -1)), 'tf32x3')
    left = iterate_matmul.Fp16Operand(torch.ones(1), a.half(), None)
    with pytest.raises(ValueError, match='a left and a right one'):
        iterate_matmul.fp16_product(None, left, left)


def test_unknown_precision_is_refused():
    from mmsoft.models.attention import iterate_matmul
    a = torch.randn(1, 4, 4)
    with pytest.raises(ValueError, match="precision must be one of .*'fp16'"):
        iterate_matmul.baddbmm(None, a, a, precision='bf16')


@pytest.mark.parametrize('products', ['tf32x3', 'fp16x3'])
def test_emulated_split_is_float32_not_tf32(products):
    """Off CUDA split products are emulated (operands and remainders rounded to TF32, or
    to fp16 after their matrix's scale): CUDA's plan with them stays as close to the
    float64 iterate as with float32 products on a clustered kernel, where all 20 steps
    in TF32 move it 14× further (measured: 7.1e-5 with float32 products, 7.0e-5 split
    either way, 9.6e-4 with TF32 alone)."""
    A, Z = hard_problem('clustered', 100, 0)[:2]
    ref = newton_pinv_apply(A.double(), Z.double())

    def dev(**kwargs):
        W = newton_pinv_apply(A, Z, method='tf32', pad_to=32, **kwargs)
        return ((W.double() - ref).abs().max() / ref.abs().max()).item()
    plain = dev(tf32_float32_steps=(1, 4), thin_steps=4)
    split = dev(tf32_float32_steps=(1, 4), thin_steps=4, float32_products=products)
    tf32 = dev(tf32_float32_steps=(0, 0))
    assert split <= 1.5 * plain and tf32 > 5 * split, (plain, split, tf32)


@pytest.mark.parametrize('kind', ['clustered', 'near_rank1', 'boundary'])
def test_emulated_fp16_products_round_as_tf32(kind):
    """Off CUDA 'fp16' TF32 products are emulated (``round_fp16_scaled``): CUDA's plan
    with them lands where it lands with TF32 products on the hard kernels, to within
    rounding of entries below 2^-28 of their matrix's largest (measured: the same
    deviation from float64 to 4 digits at m = 100: 7.071e-5, 1.152e-4, 1.715e-4)."""
    A, Z = hard_problem(kind, 100, 0)[:2]
    ref = newton_pinv_apply(A.double(), Z.double())

    def dev(products):
        W = newton_pinv_apply(A, Z, method='tf32', pad_to=32, tf32_float32_steps=(1, 4),
                              thin_steps=4, tf32_products=products)
        return ((W.double() - ref).abs().max() / ref.abs().max()).item()
    tf32, fp16 = dev('tf32'), dev('fp16')
    assert abs(fp16 - tf32) <= 0.05 * tf32, (tf32, fp16)


@needs_sm90_compiler
@pytest.mark.parametrize('precision', ['tf32x3', 'fp16', 'fp16x3'])
def test_kernel_compiles_to_tensor_cores_without_spills(precision):
    """Each block shape the kernel launches with compiles for sm_90 into tensor-core
    products (wgmma: TF32 of float32 operands, or fp16 of converted operands with
    float32 accumulators and the atomic max of the result) and keeps its blocks in
    registers: what a GPU call would otherwise find out first. Specialized as Triton's
    launcher specializes a launch on SOFT-S's padded kernels (m a multiple of 32:
    unit column strides, the other sizes, strides and pointers multiples of 16), where
    the operand tiles go to shared memory by asynchronous copies."""
    from mmsoft.models.attention import iterate_matmul as im
    fp16 = precision != 'tf32x3'
    blocks, bk = (im.BLOCKS16, im.BLOCK_K16) if fp16 else (im.BLOCKS, im.BLOCK_K)
    operands = ('a', 'b')
    aligned = operands + ('c', 'out', 's_ab', 's_am', 's_bb', 's_bk', 's_cb', 's_cm',
                          's_ob', 's_om', 'M', 'N', 'K')
    for BM, BN, warps in blocks:
        for has_c in (False, True):
            use, ptx = sm90_resources(
                im._baddbmm,
                dict(HAS_C=has_c, FP16=fp16, SPLIT=precision == 'fp16x3', BM=BM, BN=BN,
                     BK=bk, s_ak=1, s_bn=1, s_cn=1, s_on=1),
                warps, pointers=('c', 'out', 'a_amax', 'b_amax', 'out_amax')
                + (() if fp16 else operands), half_pointers=operands if fp16 else (),
                floats=('alpha', 'beta'), aligned=aligned)
            assert 'cp.async' in ptx, (BM, BN, has_c)
            assert use['STACK'] == 0 and use['REG'] <= 255, (BM, BN, has_c, use)
            mma = re.findall(r'wgmma\.mma_async\S*', ptx)
            kind = '.f32.f16.f16' if fp16 else '.tf32.tf32'
            assert mma and all(kind in m for m in mma), (BM, BN, set(mma))
            assert fp16 == bool(re.search(r'\b(?:atom|red)\.\S*max', ptx)), (BM, BN)


@needs_sm90_compiler
def test_fp16_passes_compile_without_spills():
    """cuBLAS's way's two passes compile for sm_90 in registers: the conversion rounds
    to fp16 (cvt.rn), the pass after the products raises the maxima (atomic max). They
    move memory, so they keep to 128 registers per thread (2 blocks of 8 warps per SM;
    measured 48-104)."""
    from mmsoft.models.attention import iterate_matmul
    block, warps = iterate_matmul.PASS_BLOCK, iterate_matmul.PASS_WARPS
    for split in (False, True):
        for left, right in ((True, True), (True, False), (False, True)):
            use, ptx = sm90_resources(
                iterate_matmul._to_fp16,
                dict(SPLIT=split, LEFT=left, RIGHT=right, BM=block, BK=block), warps,
                pointers=('x', 'x_amax'), half_pointers=('left', 'right'))
            assert use['STACK'] == 0 and use['REG'] <= 128, (split, left, right, use)
            assert re.search(r'cvt\.rn\.f16\.f32', ptx), (split, left, right)
        for has_c in (False, True):
            use, ptx = sm90_resources(
                iterate_matmul._unscale, dict(HAS_C=has_c, SPLIT=split, BM=block, BN=block),
                warps, pointers=('acc', 'small', 'c', 'out', 'a_amax', 'b_amax', 'out_amax'),
                floats=('alpha', 'beta'))
            assert use['STACK'] == 0 and use['REG'] <= 128, (split, has_c, use)
            assert re.search(r'\b(?:atom|red)\.\S*max', ptx), (split, has_c)
