"""Run in Triton's interpreter by test_iterate_matmul.py (TRITON_INTERPRET=1 is set before
Triton is imported): ``iterate_matmul.baddbmm`` against float64, printed as one JSON line;
the fp16 precisions made both ways (``iterate_matmul.GEMMS``: the Triton kernel, and
cuBLAS's way, whose fp16 products are float32 library products of the fp16 values here).

The kernel rounds its operands itself (TF32 parts, or fp16 after a power-of-two scale), so
the interpreter computes the products the tensor cores would: this checks the kernel's
indexing, masks, strides, batch, scales and epilogue against float64 of the operands as
``newton`` emulates their rounding, and on entries that each rounding treats apart from
float32 (a remainder TF32 cannot hold; magnitudes outside fp16's range).
"""
import json

import torch

from mmsoft.models.attention import iterate_matmul, newton

# (batch, M, K, N, with c, a given transposed (column-major), beta, alpha): sizes not
# multiples of the blocks, every block shape (``iterate_matmul._blocks``: ``BLOCKS``,
# and ``BLOCKS16`` for the kernel's fp16 products, the large ones at sizes that are
# multiples of 16), a Newton step's epilogue 2c - a·b and plain products
CASES = [(2, 70, 45, 33, True, False, 2., -1.), (1, 130, 100, 70, False, False, 1., 1.),
         (3, 65, 64, 129, True, True, 1., 1.), (2, 96, 96, 96, True, False, 2., -1.),
         (1, 40, 200, 20, False, True, 1., -0.5), (2, 256, 48, 256, True, False, 2., -1.)]
# fp16: each operand matrix's magnitude (fp16 holds 6e-8 to 65504 unscaled)
MAGNITUDES = (1e-7, 1., 3e6)
# (precision, gemm) pairs checked: 'tf32x3' has the kernel only
KINDS = [('tf32x3', 'triton')] + [(p, g) for p in ('fp16', 'fp16x3')
                                  for g in iterate_matmul.GEMMS]


def _deviation(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def _operands(B, M, K, N, with_c, transposed, vary):
    """a (B, M, K) (column-major where ``transposed``), b (B, K, N), c (B, M, N) or None;
    each matrix of a batch at its own magnitude where ``vary`` (``MAGNITUDES`` in turn)."""
    scale_a, scale_b = 1., 1.
    if vary:
        scale_a = torch.tensor(MAGNITUDES)[torch.arange(B) % 3].view(B, 1, 1)
        scale_b = torch.tensor(MAGNITUDES)[(torch.arange(B) + 1) % 3].view(B, 1, 1)
    a = torch.randn(B, K, M).transpose(1, 2) if transposed else torch.randn(B, M, K)
    c = torch.randn(B, M, N) * scale_a * scale_b if with_c else None
    return a * scale_a, torch.randn(B, K, N) * scale_b, c


def cases(precision, gemm):
    """Each case's deviation per matrix from float64: of the operands ('tf32x3',
    'fp16x3': float32's accuracy; also from the emulation, ``newton._matmul``), or of the
    operands rounded as ``round_fp16_scaled`` rounds them ('fp16': only float32's sums
    between them). The fp16 products see each matrix of a batch at its own magnitude
    and pass on each result's max |entry|; made the ``gemm`` way."""
    fp16 = precision != 'tf32x3'
    results = []
    for B, M, K, N, with_c, transposed, beta, alpha in CASES:
        a, b, c = _operands(B, M, K, N, with_c, transposed, vary=fp16)
        out = iterate_matmul.baddbmm(c, a, b, beta=beta, alpha=alpha, precision=precision,
                                     gemm=gemm)
        if fp16:
            out, amax = out
        x, y = ((newton.round_fp16_scaled(t) for t in (a, b)) if precision == 'fp16'
                else (a, b))
        ref = alpha * (x.double() @ y.double())
        if with_c:
            ref += beta * c.double()
        result = dict(case=[B, M, K, N, with_c, transposed, beta, alpha],
                      blocks=(iterate_matmul._fp16_blocks(B, M, N, K, a.device) if fp16
                              else iterate_matmul._blocks(B, M, N, a.device))[:2],
                      shape=list(out.shape),
                      deviations=[_deviation(out[i], ref[i]) for i in range(B)])
        if precision != 'fp16':
            emulated = newton._matmul(c, a, b, beta=beta, alpha=alpha, precision=precision)
            result['from_emulation'] = max(_deviation(out[i], emulated[i].double())
                                           for i in range(B))
        if fp16:
            result['amax_equal'] = torch.equal(amax, out.abs().amax((-2, -1)))
        results.append(result)
    return results


def zero_product(gemm):
    """An fp16 product with a zero matrix: its result and maximum."""
    zero = torch.zeros(1, 40, 40)
    out, amax = iterate_matmul.baddbmm(None, zero, torch.randn(1, 40, 40), precision='fp16',
                                       gemm=gemm)
    return dict(zero_product=out.abs().max().item(), zero_amax=amax.item())


def rounding(gemm):
    # x = 1 + 2^-11 + 2^-23: hi = 1 + 2^-10, and the remainder -2^-11 + 2^-23 rounds to
    # -2^-11 in TF32, so the split gives x·1 = 1 + 2^-11 where float32 gives x exactly
    x = 1 + 2.**-11 + 2.**-23
    a = torch.zeros(1, 64, 32)
    a[..., 0] = x
    b = torch.zeros(1, 32, 64)
    b[:, 0] = 1
    split = iterate_matmul.baddbmm(None, a, b)
    split16, _ = iterate_matmul.baddbmm(None, a, b, precision='fp16x3', gemm=gemm)
    # fp16: x rounds to 1 + 2^-10 (to nearest, 10 bits), as in TF32, also at 2^-20 of
    # the matrix's largest entry (1, scaled to 2^14), an fp16 subnormal unscaled
    a[..., 1] = 1.
    a[..., 0] = x * 2.**-20
    fp16, _ = iterate_matmul.baddbmm(None, a, b, precision='fp16', gemm=gemm)
    return dict(split=split.unique().tolist(), split16=split16.unique().tolist(),
                float32=[x], expected=1 + 2.**-11,
                fp16=fp16.unique().tolist(), fp16_expected=(1 + 2.**-10) * 2.**-20)


def newton_steps(gemm):
    """Five Newton steps with every product made the ``gemm`` way ('fp16' and 'fp16x3':
    the maxima passed from product to product) against the emulation and float64."""
    x = torch.randn(2, 90, 8) * 0.3
    sq = (x * x).sum(-1)
    A = torch.exp(-(sq[:, :, None] + sq[:, None, :] - 2 * x @ x.transpose(1, 2)) / 2)
    V = newton.newton_alpha(A).reshape(-1, 1, 1) * A
    exact = newton._newton_steps(A.double(), V.double(), 5)
    results = {}
    for precision in ('fp16', 'fp16x3'):
        kernel = newton._newton_steps_fp16(A, V, 5, precision, gemm=gemm)
        emulated = newton._newton_steps(A, V, 5, precision)
        results[precision] = dict(from_emulation=_deviation(kernel, emulated.double()),
                                  from_float64=_deviation(kernel, exact),
                                  emulated_from_float64=_deviation(emulated, exact))
    return results


def benchmark_columns():
    """What the benchmark's matmul section measures on a GPU (``mmsoft.benchmark.plan``),
    run here at m = 40 (one step, one timed call): its Newton-step columns and its
    products' deviations from float64."""
    from types import SimpleNamespace

    from mmsoft.benchmark import plan
    steps = plan._step_times(SimpleNamespace(device='cpu'), 40, steps=1, runs=1)
    return dict(steps=list(steps), deviations=plan._kernel_deviations(40, 'cpu'))


def main():
    torch.manual_seed(0)
    gemms = iterate_matmul.GEMMS
    print(json.dumps(dict(cases={f'{p} {g}': cases(p, g) for p, g in KINDS},
                          zero={g: zero_product(g) for g in gemms},
                          rounding={g: rounding(g) for g in gemms},
                          steps={g: newton_steps(g) for g in gemms},
                          benchmark=benchmark_columns())))


if __name__ == '__main__':
    main()
