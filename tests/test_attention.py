"""The attention math alone: Newton–Raphson pseudo-inverse, normalization, SimA."""
import pytest
import torch

from mmsoft.models.attention import (gaussian_kernel, newton_alpha, newton_pinv,
                                     newton_pinv_error, normalize_inverse, sima_attention,
                                     soft_attention)


def gaussian_kernel_matrix(m, d=32, batch=(), scale=1.0, dtype=torch.float64):
    x = torch.randn(*batch, m, d, dtype=dtype) * scale
    return gaussian_kernel(x, x)


def spd(m, cond=10.0, batch=()):
    q, _ = torch.linalg.qr(torch.randn(*batch, m, m, dtype=torch.float64))
    eig = torch.logspace(0, -torch.log10(torch.tensor(cond)).item(), m, dtype=torch.float64)
    return (q * eig.unsqueeze(-2)) @ q.transpose(-1, -2)


@pytest.mark.parametrize('method', ['iterative', 'spectral'])
def test_newton_converges_to_pinv_on_spd(method):
    A = spd(24, cond=8.0, batch=(3, ))
    Y = newton_pinv(A, iters=20, method=method)
    ref = torch.linalg.pinv(A)
    assert torch.allclose(Y, ref, rtol=1e-6, atol=1e-8 * ref.abs().max().item())


def test_spectral_equals_iterative_on_gaussian_kernels():
    A = gaussian_kernel_matrix(64, batch=(2, 3), scale=0.3)
    it = newton_pinv(A, method='iterative')
    sp = newton_pinv(A, method='spectral')
    assert (it - sp).abs().max() / it.abs().max() < 1e-7
    # also a (numerically) singular kernel: duplicated landmarks
    x = torch.randn(16, 32, dtype=torch.float64) * 0.3
    x = torch.cat([x, x[:4]])
    A = gaussian_kernel(x, x)
    it = newton_pinv(A, method='iterative')
    sp = newton_pinv(A, method='spectral')
    assert (it - sp).abs().max() / it.abs().max() < 1e-6


def test_newton_error_decreases_monotonically():
    A = gaussian_kernel_matrix(48, scale=0.25)
    errs = [newton_pinv_error(A, newton_pinv(A, iters=k)).item() for k in range(0, 21)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 1e-3 * errs[0]


def test_alpha_is_per_matrix():
    A = torch.stack([gaussian_kernel_matrix(16, scale=0.2),
                     5 * gaussian_kernel_matrix(16, scale=0.2)])
    alpha = newton_alpha(A)
    assert alpha.shape == (2, 1, 1)
    assert alpha[0] != alpha[1]
    # each matrix's inverse is the same computed alone or in a batch
    batched = newton_pinv(A)
    for i in range(2):
        assert torch.allclose(batched[i], newton_pinv(A[i]), rtol=1e-10, atol=0)


def test_backward_matches_exact_inverse_gradient():
    """Paper Eq. 16: ∇A = -Yᵀ ∇Y Yᵀ, equal to autograd through torch.linalg.inv."""
    A0 = spd(12, cond=5.0)
    G = torch.randn(12, 12, dtype=torch.float64)
    A = A0.clone().requires_grad_(True)
    (newton_pinv(A, iters=30) * G).sum().backward()
    B = A0.clone().requires_grad_(True)
    (torch.linalg.inv(B) * G).sum().backward()
    assert torch.allclose(A.grad, B.grad, rtol=1e-6, atol=1e-9)


def test_normalization_lowers_spectral_norm():
    """Paper Fig. 5b: ||D^-1/2 A⁺ D^-1/2||₂ < ||A⁺||₂ on Gaussian-kernel matrices."""
    for m in (16, 49, 100):
        A = gaussian_kernel_matrix(m, scale=0.2)
        Y = newton_pinv(A)
        plain = torch.linalg.matrix_norm(Y, ord=2)
        normed = torch.linalg.matrix_norm(normalize_inverse(A, Y), ord=2)
        assert normed < plain


def test_inverse_is_float32_under_autocast():
    q = torch.randn(2, 64, 32) * 0.2
    lm = torch.randn(2, 8, 32) * 0.2
    v = torch.randn(2, 64, 32)
    ref = soft_attention(q, lm, v)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = soft_attention(q, lm, v)
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max() / ref.abs().max() < 0.05
    with torch.autocast('cpu', dtype=torch.bfloat16):
        Y = newton_pinv(gaussian_kernel(lm, lm))
    assert Y.dtype == torch.float32


def test_soft_attention_matches_explicit_product():
    q = torch.randn(3, 40, 8, dtype=torch.float64) * 0.3
    lm = torch.randn(3, 5, 8, dtype=torch.float64) * 0.3
    v = torch.randn(3, 40, 8, dtype=torch.float64)
    for normalize in (True, False):
        P = gaussian_kernel(q, lm)
        A = gaussian_kernel(lm, lm)
        Y = newton_pinv(A)
        if normalize:
            Y = normalize_inverse(A, Y)
        ref = (P @ Y) @ (P.transpose(-1, -2) @ v)
        out = soft_attention(q, lm, v, normalize=normalize)
        assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(soft_attention(q, lm, v, normalize=True),
                              soft_attention(q, lm, v, normalize=False))


@pytest.mark.parametrize('N,d', [(7, 16), (50, 16)])
def test_sima_orders_agree(N, d):
    q, k, v = (torch.randn(2, 3, N, d, dtype=torch.float64) for _ in range(3))
    a = sima_attention(q, k, v, order='qk_first')
    b = sima_attention(q, k, v, order='kv_first')
    c = sima_attention(q, k, v)
    assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)
    assert torch.allclose(a, c, rtol=1e-10, atol=1e-13)
    # matches the definition: L1 normalization over tokens, no softmax
    qn = q / q.abs().sum(-2, keepdim=True)
    kn = k / k.abs().sum(-2, keepdim=True)
    assert torch.allclose(a, qn @ kn.transpose(-1, -2) @ v, rtol=1e-10, atol=1e-13)


def test_sima_finite_in_half_precision_at_detection_size():
    N, d = 50 * 84, 48  # 800×1344 at patch 16
    q, k, v = (torch.randn(1, 8, N, d) for _ in range(3))
    ref = sima_attention(q, k, v)
    for dtype in (torch.float16, torch.bfloat16):
        out = sima_attention(q.to(dtype), k.to(dtype), v.to(dtype))
        assert out.dtype == torch.float32 and torch.isfinite(out).all()
        assert out.abs().max() > 0
        assert (out.float() - ref).abs().max() / ref.abs().max() < 0.02


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match='method'):
        newton_pinv(torch.eye(3), method='cholesky')
    with pytest.raises(ValueError, match='order'):
        sima_attention(*(torch.randn(1, 4, 2) for _ in range(3)), order='random')
