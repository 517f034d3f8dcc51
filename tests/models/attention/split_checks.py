"""Run in Triton's interpreter by test_split_matmul.py (TRITON_INTERPRET=1 is set before
Triton is imported): ``split_matmul.baddbmm`` against float64, printed as one JSON line.

The kernel rounds its operands' parts to TF32 itself, so the interpreter computes the
products the tensor cores would: this checks the kernel's indexing, masks, strides,
batch and epilogue against float64 and against ``newton``'s emulation of the split, and
on one entry that the split rounds (a value whose remainder TF32 cannot hold).
"""
import json

import torch

from mmsoft.models.attention import newton, split_matmul

# (batch, M, K, N, with c, a given transposed (column-major), beta, alpha): sizes not
# multiples of the blocks, both block shapes (``split_matmul._blocks``), a Newton step's
# epilogue 2c - a·b and plain products
CASES = [(2, 70, 45, 33, True, False, 2., -1.), (1, 130, 100, 70, False, False, 1., 1.),
         (3, 65, 64, 129, True, True, 1., 1.), (2, 96, 96, 96, True, False, 2., -1.),
         (1, 40, 200, 20, False, True, 1., -0.5)]


def main():
    torch.manual_seed(0)
    results = []
    for B, M, K, N, with_c, transposed, beta, alpha in CASES:
        a = torch.randn(B, K, M).transpose(1, 2) if transposed else torch.randn(B, M, K)
        b = torch.randn(B, K, N)
        c = torch.randn(B, M, N) if with_c else None
        out = split_matmul.baddbmm(c, a, b, beta=beta, alpha=alpha)
        ref = alpha * (a.double() @ b.double())
        if with_c:
            ref += beta * c.double()
        emulated = newton._matmul(c, a, b, beta=beta, alpha=alpha, precision='tf32x3')
        scale = ref.abs().max()
        results.append(dict(case=[B, M, K, N, with_c, transposed, beta, alpha],
                            blocks=split_matmul._blocks(B, M, N, a.device)[:2],
                            shape=list(out.shape),
                            deviation=((out.double() - ref).abs().max() / scale).item(),
                            from_emulation=((out - emulated).abs().max() / scale).item()))
    # x = 1 + 2^-11 + 2^-23: hi = 1 + 2^-10, and the remainder -2^-11 + 2^-23 rounds to
    # -2^-11 in TF32, so the split gives x·1 = 1 + 2^-11 where float32 gives x exactly
    x = 1 + 2.**-11 + 2.**-23
    a = torch.zeros(1, 64, 32)
    a[..., 0] = x
    b = torch.zeros(1, 32, 64)
    b[:, 0] = 1
    out = split_matmul.baddbmm(None, a, b)
    rounding = dict(split=out.unique().tolist(), float32=(a @ b).unique().tolist(),
                    expected=1 + 2.**-11)
    print(json.dumps(dict(cases=results, rounding=rounding)))


if __name__ == '__main__':
    main()
