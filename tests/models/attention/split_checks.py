"""Run in Triton's interpreter by test_split_matmul.py (TRITON_INTERPRET=1 is set before
Triton is imported): ``split_matmul.baddbmm`` against float64, printed as one JSON line.

The interpreter multiplies the blocks in float32 without TF32 rounding, so this checks
the kernel's indexing, masks, strides, batch and epilogue; the rounding of the split is
checked through ``newton``'s emulation of it.
"""
import json

import torch

from mmsoft.models.attention import split_matmul

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
        dev = ((out.double() - ref).abs().max() / ref.abs().max()).item()
        results.append(dict(case=[B, M, K, N, with_c, transposed, beta, alpha],
                            blocks=split_matmul._blocks(B, M, N, a.device)[:2],
                            shape=list(out.shape), deviation=dev))
    print(json.dumps(results))


if __name__ == '__main__':
    main()
