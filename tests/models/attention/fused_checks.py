"""The fused kernel products (mmsoft/models/attention/fused.py) and the kernel that writes
P and G (triton_chunks.py) run in Triton's interpreter, against float64: prints one JSON object
of deviations for test_fused.py.

Triton decides when it is imported whether its kernels run in the interpreter, so this
runs in a process of its own, started with TRITON_INTERPRET=1. Small sizes that are not
multiples of the kernels' blocks (64 rows, 64 landmarks)."""
import json
import os

import torch

from mmsoft.models import SOFT
from mmsoft.models.attention import attention_plan, soft, soft_attention
from mmsoft.models.attention import fused, triton_chunks
from mmsoft.models.attention.fused import _row_splits
from mmsoft.testing import relative_deviation
from mmsoft.testing.fidelity import (gradient_deviations, output_deviations,
                                     reference_gradients, reference_outputs)

assert os.environ.get('TRITON_INTERPRET') == '1', 'run with TRITON_INTERPRET=1'
torch.manual_seed(0)
result = {}


def dev(got, ref):
    return None if got is None else relative_deviation(got, ref)


# The products and the backward passes, on the features of random points (float64
# reference: the library products over 2 row chunks)
b, N, m, d = 3, 150, 70, 32
q = torch.randn(b, N, d, dtype=torch.float64) * 0.5
lm = torch.randn(b, m, d, dtype=torch.float64) * 0.5
fq64, fl64 = soft.kernel_features(q), soft.kernel_features(lm, right=True)
fq, fl = fq64.float(), fl64.float()
thin = {False: torch.randn(b, m, d, dtype=torch.float64),  # W of P·W
        True: torch.randn(b, N, d, dtype=torch.float64)}  # V of Pᵀ·V
result['splits'] = _row_splits(N, -(-m // 64) * b, fq.device)
result['products'] = {}
for transpose, w in thin.items():
    ref = soft._kernel_product(fq64, fl64, w, 2, transpose)
    result['products'][str(transpose)] = [
        dev(fused.product(fq, fl, w.float(), transpose), ref),
        dev(soft._kernel_product(fq, fl, w.float(), 2, transpose), ref),
        dev(fused.product(fq, fl, w.float(), transpose, split=True), ref)]
left = torch.randn(b, N, 2 * d, dtype=torch.float64)  # ∇P = left·rightᵀ, depth 2d
right = torch.randn(b, m, 2 * d, dtype=torch.float64)
result['backward'] = {}
for transpose in (False, True):
    grad = thin[not transpose]  # ∇out: (b, N, d) for P·W, (b, m, d) for Pᵀ·W
    for needs in ((True, True, True), (True, False, False), (False, True, False),
                  (False, False, True)):
        ref = soft._kernel_backward(fq64, fl64, 2, grad, transpose, left, right, needs)
        args = (grad.float(), transpose, left.float(), right.float(), needs)
        got = fused.backward(fq, fl, *args)
        lib = soft._kernel_backward(fq, fl, 2, *args)
        split = fused.backward(fq, fl, *args, split=True)
        result['backward'][f'{transpose} {needs}'] = [
            [dev(g, r) for g, r in zip(got, ref)], [dev(g, r) for g, r in zip(lib, ref)],
            [dev(g, r) for g, r in zip(split, ref)]]


# The kernel of triton_chunks.py: P and G themselves, then the library's products over 2 row
# chunks it writes (products and backward passes as above), float32 and split
TRITON_CHUNKS = {'float32': soft._TritonChunks(2, False), 'split': soft._TritonChunks(2, True)}
P64 = soft._kernel(fq64, fl64)
G64 = (left @ right.transpose(-1, -2)) * P64
result['triton_chunks'] = dict(kernel={}, grad={}, products={}, backward={}, expanded={})
for kind, chunks in TRITON_CHUNKS.items():
    P = triton_chunks.kernel(fq, fl, split=chunks.split)
    result['triton_chunks']['kernel'][kind] = dev(P, P64)
    for keep in (True, False):
        P, G = triton_chunks.kernel_and_grad(fq, fl, left.float(), right.float(), keep_p=keep,
                                      split=chunks.split)
        result['triton_chunks']['grad'][f'{kind} {keep}'] = [dev(P, P64), dev(G, G64)]
    for transpose, w in thin.items():
        ref = soft._kernel_product(fq64, fl64, w, 2, transpose)
        got = soft._kernel_product(fq, fl, w.float(), chunks, transpose)
        result['triton_chunks']['products'][f'{kind} {transpose}'] = dev(got, ref)
    for transpose in (False, True):
        grad = thin[not transpose]
        for needs in ((True, True, True), (True, False, False), (False, True, False),
                      (False, False, True)):
            ref = soft._kernel_backward(fq64, fl64, 2, grad, transpose, left, right, needs)
            got = soft._kernel_backward(fq, fl, chunks, grad.float(), transpose,
                                        left.float(), right.float(), needs)
            result['triton_chunks']['backward'][f'{kind} {transpose} {needs}'] = [
                dev(g, r) for g, r in zip(got, ref)]


# a gradient autograd expands from a sum (no unit stride anywhere), for both products
result['expanded'] = {}
for transpose in (False, True):
    ones = torch.ones((), dtype=torch.float64).expand(b, *thin[not transpose].shape[1:])
    ref = soft._kernel_backward(fq64, fl64, 2, ones, transpose, left, right, (True,) * 3)
    ones32 = torch.ones(()).expand(ones.shape)  # as autograd hands it over: strides 0
    assert ones32.stride() == (0, 0, 0)
    got = fused.backward(fq, fl, ones32, transpose, left.float(), right.float(), (True,) * 3)
    result['expanded'][str(transpose)] = [dev(g, r) for g, r in zip(got, ref)]
    # the same gradient through triton_chunks.py's kernel, also as a factor of ∇P (∇out·Wᵀ for
    # P·W, W·∇outᵀ for Pᵀ·W), as one product's backward hands it over
    w = thin[transpose]
    lr64 = (w, ones) if transpose else (ones, w)
    lr = (w.float(), ones32) if transpose else (ones32, w.float())
    ref = soft._kernel_backward(fq64, fl64, 2, ones, transpose, *lr64, (True,) * 3)
    got = soft._kernel_backward(fq, fl, TRITON_CHUNKS['float32'], ones32, transpose, *lr,
                                (True,) * 3)
    result['triton_chunks']['expanded'][str(transpose)] = [dev(g, r) for g, r in zip(got, ref)]


# soft_attention, with and without gradients (the hand-over of kernel_attention's
# backward passes: ∇P of both products)
# the plans compared: the library's products over row chunks, the fused kernels, and the
# fused kernels with their products with P and the iterate's float32 products split; the
# chunks written by triton_chunks.py's kernel, its products as they are and split
PLANS = {'chunks': dict(kernel_products='chunks'), 'fused': dict(kernel_products='fused'),
         'fused split': dict(kernel_products='fused', float32_products='tf32x3'),
         'triton_chunks': dict(kernel_products='triton_chunks'),
         'triton_chunks split': dict(kernel_products='triton_chunks',
                                     float32_products='tf32x3')}


def layer(kind, dtype):
    torch.manual_seed(1)
    shape = (2, 3)
    q = (torch.randn(*shape, 130, d, dtype=torch.float64) * 0.4).to(dtype).requires_grad_()
    lm = (torch.randn(*shape, 40, d, dtype=torch.float64) * 0.4).to(dtype).requires_grad_()
    v = torch.randn(*shape, 130, d, dtype=torch.float64).to(dtype).requires_grad_()
    with attention_plan(**PLANS[kind], device='cpu'):
        out = soft_attention(q, lm, v, pinv_method='iterative')
        with torch.no_grad():
            inference = soft_attention(q, lm, v, pinv_method='iterative')
    (out * torch.linspace(-1, 1, d, dtype=dtype)).sum().backward()
    return [out.detach(), inference, q.grad, lm.grad, v.grad]


ref = layer('chunks', torch.float64)
result['layer'] = {kind: [dev(g, r) for g, r in zip(layer(kind, torch.float32), ref)]
                   for kind in PLANS}

# SOFT-T's output maps and one training step's gradients (BatchNorm in eval mode) against
# the float64 official order, as tools/analysis_tools/fidelity.py measures the floor
model = SOFT(arch='tiny', drop_path_rate=0.).eval()
x = torch.rand(1, 3, 96, 160)
refs = reference_outputs(model, x)
grad_refs = reference_gradients(model, x)
result['backbone'] = {}
for kind in PLANS:
    with attention_plan(**PLANS[kind], device='cpu'):
        maps = output_deviations(model, x, refs)
        grads = gradient_deviations(model, x, grad_refs)
    result['backbone'][kind] = dict(maps=maps, gradient=max(grads.deviations.values()))
print(json.dumps(result))
