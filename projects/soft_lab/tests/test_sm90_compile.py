"""Compiling the lab's Triton kernels for an H100 (sm_90) with Triton's own ptxas, no GPU
needed: their register and spill use per thread, and the PTX."""
import os
import os.path as osp
import re
import subprocess

import pytest

import projects.soft_lab  # noqa: F401
from projects.soft_lab import fp16_products, triton_chunks


def _nvidia_toolchain():
    """Whether Triton (3 or later) with its NVIDIA backend's ptxas and cuobjdump is here,
    and this process does not run Triton's interpreter."""
    if os.environ.get('TRITON_INTERPRET') == '1':
        return False
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        return False
    bin_dir = osp.join(osp.dirname(triton.__file__), 'backends', 'nvidia', 'bin')
    return all(osp.isfile(osp.join(bin_dir, t)) for t in ('ptxas', 'cuobjdump'))


needs_sm90_compiler = pytest.mark.skipif(
    not _nvidia_toolchain(),
    reason="needs Triton's NVIDIA backend with ptxas, outside its interpreter")


def sm90_resources(kernel, constants, num_warps, pointers, floats=(), half_pointers=(),
                   aligned=()):
    """Compile the Triton ``kernel`` for an H100 (sm_90) with Triton's own ptxas, no GPU
    needed, and return cuobjdump's register and stack (spill) use per thread, and the
    PTX. ``pointers`` name its float32 pointer arguments, ``half_pointers`` its fp16
    ones, ``floats`` its float32 scalars; the others not in ``constants`` are int32.
    ``aligned`` names int arguments and pointers known to be multiples of 16 (bytes for
    pointers), as Triton's launcher specializes them when they are: what lets it
    vectorize loads and copy them to shared memory asynchronously."""
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature = {name: 'constexpr' if name in constants else '*fp32' if name in pointers
                 else '*fp16' if name in half_pointers else 'fp32' if name in floats
                 else 'i32' for name in kernel.arg_names}
    source = ASTSource(kernel, signature, constexprs={
        (kernel.arg_names.index(k), ): v for k, v in constants.items()}, attrs={
        (kernel.arg_names.index(k), ): [['tt.divisibility', 16]] for k in aligned})
    compiled = triton.compile(source, target=GPUTarget('cuda', 90, 32),
                              options=dict(num_warps=num_warps))
    tool = osp.join(osp.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'cuobjdump')
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(compiled.asm['cubin'])
        f.flush()
        usage = subprocess.run([tool, '-res-usage', f.name], capture_output=True, text=True,
                               check=True).stdout
    use = {k: int(v) for k, v in re.findall(r'(REG|STACK):(\d+)', usage)}
    return use, compiled.asm['ptx']


TRITON_CHUNKS_POINTERS = ('fq', 'fl', 'left', 'right', 'p', 'g')


@needs_sm90_compiler
@pytest.mark.parametrize('has_p, has_g', [(True, False), (True, True), (False, True)])
def test_triton_chunks_kernel_compiles_without_spills(has_p, has_g):
    """The kernel that writes P (and G) compiles for sm_90 as ``triton_chunks.py``
    launches it, its blocks in registers (SOFT's head depth 32, ∇P's depth 64 as
    kernel_attention's backward gives it); float32 products on the CUDA cores."""
    options = dict(HAS_P=has_p, HAS_G=has_g, EXACT_EXP=True, BN=triton_chunks.BLOCK_ROWS,
                   BM=triton_chunks.BLOCK_COLS, DP=32, KB=triton_chunks.BLOCK_DEPTH)
    use, ptx = sm90_resources(triton_chunks._form, options, triton_chunks.WARPS,
                              pointers=TRITON_CHUNKS_POINTERS)
    # two programs of 8 warps per streaming multiprocessor (measured 80-120)
    assert use['STACK'] == 0 and use['REG'] <= 128, use
    assert 'fma.rn.f32' in ptx and 'tf32' not in ptx and not re.findall(r'\b(?:wg)?mma\.', ptx)


@needs_sm90_compiler
def test_fp16_passes_compile_without_spills():
    """The fp16 products' two passes compile for sm_90 in registers: the conversion rounds
    to fp16 (cvt.rn), the pass after cuBLAS's products raises the maxima (atomic max).
    They move memory, so they keep to 128 registers per thread (2 blocks of 8 warps per
    SM; measured 48-104)."""
    block, warps = fp16_products.PASS_BLOCK, fp16_products.PASS_WARPS
    for split in (False, True):
        for left, right in ((True, True), (True, False), (False, True)):
            use, ptx = sm90_resources(
                fp16_products._to_fp16,
                dict(SPLIT=split, LEFT=left, RIGHT=right, BM=block, BK=block), warps,
                pointers=('x', 'x_amax'), half_pointers=('left', 'right'))
            assert use['STACK'] == 0 and use['REG'] <= 128, (split, left, right, use)
            assert re.search(r'cvt\.rn\.f16\.f32', ptx), (split, left, right)
        for has_c in (False, True):
            use, ptx = sm90_resources(
                fp16_products._unscale, dict(HAS_C=has_c, SPLIT=split, BM=block, BN=block),
                warps, pointers=('acc', 'small', 'c', 'out', 'a_amax', 'b_amax', 'out_amax'),
                floats=('alpha', 'beta'))
            assert use['STACK'] == 0 and use['REG'] <= 128, (split, has_c, use)
            assert re.search(r'\b(?:atom|red)\.\S*max', ptx), (split, has_c)
