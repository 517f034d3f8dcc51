"""The lab's Triton kernels in Triton's interpreter, against float64: prints one JSON
object of deviations for test_soft_lab.py.

Triton decides when it is imported whether its kernels run in the interpreter, so this
runs in a process of its own, started with TRITON_INTERPRET=1 from the repository root.
Small sizes that are not multiples of the kernels' blocks (64 rows, 64 landmarks)."""
import json
import os

import torch

import projects.soft_lab  # noqa: F401  (registers the candidates)
from mmsoft.models.attention import attention_plan, soft, soft_attention
from mmsoft.testing import relative_deviation
from projects.soft_lab import fp16_products, round_fp16_scaled, triton_chunks

assert os.environ.get('TRITON_INTERPRET') == '1', 'run with TRITON_INTERPRET=1'
torch.manual_seed(0)
result = {}

# P and G from the features of random points (float64 reference: the library's)
b, N, m, d = 3, 150, 70, 32
fq64 = soft.kernel_features(torch.randn(b, N, d, dtype=torch.float64) * 0.5)
fl64 = soft.kernel_features(torch.randn(b, m, d, dtype=torch.float64) * 0.5, right=True)
left = torch.randn(b, N, 2 * d, dtype=torch.float64)
right = torch.randn(b, m, 2 * d, dtype=torch.float64)
P64 = soft._kernel(fq64, fl64)
G64 = torch.bmm(left, right.mT) * P64
P = triton_chunks.kernel(fq64.float(), fl64.float())
P2, G = triton_chunks.kernel_and_grad(fq64.float(), fl64.float(), left.float(),
                                      right.float())
none, G2 = triton_chunks.kernel_and_grad(fq64.float(), fl64.float(), left.float(),
                                         right.float(), keep_p=False)
result['chunks'] = dict(P=relative_deviation(P, P64), P_with_G=relative_deviation(P2, P64),
                        G=relative_deviation(G, G64), G_alone=relative_deviation(G2, G64),
                        p_kept=none is not None)

# A SOFT attention with P's chunks from the kernel: outputs and gradients
q = (torch.randn(2, 2, 90, 16) * 0.4).requires_grad_()
lm = (torch.randn(2, 2, 20, 16) * 0.4).requires_grad_()
v = torch.randn(2, 2, 90, 16, requires_grad=True)
grads = {}
for name, products in (('library', 'chunks'), ('triton', ('triton_chunks', 'chunks'))):
    with attention_plan(kernel_products=products, kernel_chunk=2 * 2 * 20 * 40):
        out = soft_attention(q, lm, v, pinv_method='iterative')
        with torch.no_grad():
            once = soft_attention(q, lm, v, pinv_method='iterative')
    grads[name] = (out.detach(), once, *torch.autograd.grad(out.pow(2).sum(), (q, lm, v)))
result['attention'] = [relative_deviation(t, r) for t, r in zip(grads['triton'],
                                                                   grads['library'])]

# The fp16 products (on CPU tensors the interpreter's conversion passes and float32
# library products of the fp16 values): 'fp16x3' within float32's accuracy of float64,
# 'fp16' the product of operands rounded as round_fp16_scaled rounds them
a, c = (torch.randn(3, 70, 70) / 8 for _ in range(2))
exact = torch.bmm(a.double(), c.double())
result['fp16x3'] = relative_deviation(fp16_products.product(None, a, c)[0], exact)
result['float32'] = relative_deviation(a @ c, exact)
rounded = torch.bmm(round_fp16_scaled(a).double(), round_fp16_scaled(c).double())
out, amax = fp16_products.product(None, a, c, precision='fp16')
result['fp16'] = relative_deviation(out, rounded)
result['amax'] = relative_deviation(amax, out.abs().amax((-2, -1)))
step, _ = fp16_products.product(a, a, c, beta=2, alpha=-1)
result['epilogue'] = relative_deviation(step, 2 * a.double() - exact)
print(json.dumps(result))
