"""The attention math alone: Newton–Raphson pseudo-inverse, normalization, SimA."""
import pytest
import torch

from mmsoft.testing import (GRADIENT_TOL, HARD_KERNELS, PINV_PATHS, PLAN_PATHS, hard_landmarks,
                            hard_problem, kernel_bound, pinv_accuracy, relative_deviation)
from mmsoft.models import attention
from mmsoft.models.attention import (PLANS, TF32, VARIANTS, Inputs, gaussian_kernel,
                                     kernel_matmul, newton_alpha, newton_iterate, newton_pinv,
                                     newton_pinv_error, normalize_inverse, regularized_apply,
                                     round_tf32, select_variant, sima_attention,
                                     soft_attention)
from mmsoft.models.attention.spectral import spectral_apply
from conftest import alpha_tie, halvings

# CUDA's 'tf32', with its options
CUDA_TF32 = PLANS['cuda'].may_run('tf32')[0]


def eye_like(A):
    return torch.eye(A.shape[-1], dtype=A.dtype).expand_as(A)


def formed(method, A, iters=20):
    """The iterate of A (..., m, m) as ``method`` computes it, formed: the reference
    ``newton_pinv`` for 'iterative', else A⁺·I through 'spectral' (its α for any
    symmetric A) or a variant; with Eq. 16's gradients."""
    if method == 'iterative':
        return newton_pinv(A, iters)
    if method == 'spectral':
        return spectral_apply(A, eye_like(A), iters)
    return (VARIANTS[method] if isinstance(method, str) else method).apply(A, eye_like(A),
                                                                           iters)


def resolve(method, m, device_type):
    inputs = Inputs(device=device_type, dtype=torch.float32, m=m)
    return select_variant(method, PLANS[device_type], inputs)


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
    Y = formed(method, A)
    ref = torch.linalg.pinv(A)
    assert torch.allclose(Y, ref, rtol=1e-6, atol=1e-8 * ref.abs().max().item())


def test_spectral_equals_iterative_on_gaussian_kernels():
    A = gaussian_kernel_matrix(64, batch=(2, 3), scale=0.3)
    it = newton_pinv(A)
    sp = formed('spectral', A)
    assert (it - sp).abs().max() / it.abs().max() < 1e-7
    # also a (numerically) singular kernel: duplicated landmarks
    x = torch.randn(16, 32, dtype=torch.float64) * 0.3
    x = torch.cat([x, x[:4]])
    A = gaussian_kernel(x, x)
    it = newton_pinv(A)
    sp = formed('spectral', A)
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


@pytest.mark.parametrize('scale', [0.05, 0.3, 1.0])
def test_alpha_from_row_sums_equals_alpha_from_a_squared(scale):
    """The O(m²) α of nonnegative symmetric kernels is the α of the m×m residual."""
    A = gaussian_kernel_matrix(96, batch=(4, ), scale=scale, dtype=torch.float32)
    slow = newton_alpha(A)
    fast = newton_alpha(A, nonnegative=True)
    # the same decisions (halvings) from the same start: |A| and A summed by different
    # kernels may round the last bit differently (float32: 1e-6 is ~100 units of 6e-8)
    assert torch.equal(halvings(A, slow), halvings(A, fast))
    assert torch.allclose(slow, fast, rtol=1e-6, atol=0)
    if scale == 0.05:  # nearly all-ones kernel: α is halved several times
        assert (halvings(A, fast) >= 3).all()


@pytest.mark.parametrize('max_halvings', [3, 8, 10])
def test_alpha_capped_halvings_equal_the_loop(max_halvings):
    """An all-ones kernel needs 8 halvings: with fewer allowed, both ways stop at the cap
    (the row-sum way takes the last candidate), with more, at the same first α."""
    A = torch.ones(2, 40, 40)
    slow = newton_alpha(A, max_halvings=max_halvings)
    fast = newton_alpha(A, max_halvings=max_halvings, nonnegative=True)
    assert torch.equal(slow, fast)
    start = 2.0 / 40**2
    assert torch.equal(fast, torch.full((2, 1, 1), start / 2**min(max_halvings, 8)))


def test_alpha_at_a_tie_halves_as_float64_does():
    """α's halvings are decided on a threshold (``newton_alpha``): a float32 kernel within
    float32 rounding of it takes the float64 computation's decision (the float64
    reference's), whatever the order of the landmarks. The kernels: two float32 Gaussian
    kernels on either side of the threshold (``alpha_tie``). (Deciding in float32 took
    the other side at 8 halvings for every seed tried; the output maps of the cat photo
    at 640×640 moved 5e-5 on CUDA so.)"""
    sides = [gaussian_kernel(x, x).float() for x in alpha_tie()]
    assert (sides[0] != sides[1]).sum() <= 4  # a tie: one float32 rounding apart

    def decided_in_float64(A):
        return halvings(A.double(), newton_alpha(A.double())).item()

    assert decided_in_float64(sides[0]) != decided_in_float64(sides[1])
    for A in sides:
        for _ in range(4):
            p = torch.randperm(A.shape[-1])
            Ap = A[p][:, p]
            alpha = newton_alpha(Ap, nonnegative=True)
            assert alpha.dtype == torch.float32
            assert halvings(Ap.double(), alpha.double()).item() == decided_in_float64(A)


def test_zero_padding_keeps_the_iterate():
    """A zero-padded to a larger size (aligned sizes for matrix products): α and the
    T-step iterate on A's block are A's own, the zero block stays zero; padded by the
    iterations themselves (``pad_to``), formed, thin and in TF32, the same iterate
    (float64: differences are rounding)."""
    A = gaussian_kernel_matrix(30, batch=(2, ), scale=0.3)
    Z = torch.randn(2, 30, 5, dtype=torch.float64)
    Ap = torch.nn.functional.pad(A, (0, 2, 0, 2))
    Zp = torch.nn.functional.pad(Z, (0, 0, 0, 2))
    # α of A and of Ap: the same halvings (a discrete decision: α differs by powers of 2
    # between any two counts) and the same start 2 / (max row sum)², up to the rounding
    # of row sums over 30 and 32 entries: ≤ 2·32 units of 1.1e-16 relative (one bit,
    # 8.9e-16, was seen on an AVX-512 machine); 1e-13 leaves 14× margin.
    alpha, alpha_p = newton_alpha(A, nonnegative=True), newton_alpha(Ap, nonnegative=True)
    assert torch.equal(halvings(A, alpha), halvings(Ap, alpha_p))
    assert torch.allclose(alpha_p, alpha, rtol=1e-13, atol=0)
    Y, Yp = newton_pinv(A), newton_pinv(Ap)
    tol = 1e-12 * Y.abs().max().item()
    assert torch.allclose(Yp[:, :30, :30], Y, rtol=0, atol=tol)
    assert (Yp[:, 30:] == 0).all() and (Yp[:, :, 30:] == 0).all()
    W = VARIANTS['iterative'].apply(Ap, Zp, 20)
    assert torch.allclose(W[:, :30], Y @ Z, rtol=0, atol=100 * tol * Z.abs().max().item())
    assert (W[:, 30:] == 0).all()
    # TF32's own padding (``pad_to``): the same iterate formed and thin (in float64 the
    # TF32 steps are float32 ones)
    for options in (dict(), dict(thin_steps=8), dict(float32_steps=(0, 20), thin_steps=20)):
        ref = TF32(**options).apply(A, Z, 20)
        out = TF32(**options, pad_to=8).apply(A, Z, 20)
        assert out.shape == ref.shape and relative_deviation(out, ref) < 1e-12, options


def test_gaussian_kernel_gradient():
    a = torch.randn(2, 7, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(gaussian_kernel, (a, b))
    ref = torch.exp(-torch.cdist(a, b).pow(2) / 2)
    assert torch.allclose(gaussian_kernel(a, b), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('method', ['iterative', 'spectral'])
@pytest.mark.parametrize('chunk', [None, 2 * 3 * 12 * 7])
def test_soft_attention_gradients_equal_the_explicit_inverse(method, chunk, force_plan):
    """A⁺ applied without forming it and P recomputed in backward (in one chunk or in
    row chunks): same values and Eq. 16 gradients as forming both and keeping P. (In
    float64 'tf32' is the 'iterative' code: TF32 rounds float32 operands only.)"""
    if chunk:
        force_plan(kernel_chunk=chunk, kernel_once_up_to=None, device='cpu')
    q = (torch.randn(2, 3, 50, 8, dtype=torch.float64) * 0.5).requires_grad_()
    lm = (torch.randn(2, 3, 12, 8, dtype=torch.float64) * 0.5).requires_grad_()
    v = torch.randn(2, 3, 50, 8, dtype=torch.float64, requires_grad=True)
    G = torch.randn(2, 3, 50, 8, dtype=torch.float64)
    out = soft_attention(q, lm, v, pinv_method=method)
    grads = torch.autograd.grad((out * G).sum(), (q, lm, v))
    P, A = gaussian_kernel(q, lm), gaussian_kernel(lm, lm)
    ref = P @ (normalize_inverse(A, formed(method, A)) @ (P.mT @ v))
    ref_grads = torch.autograd.grad((ref * G).sum(), (q, lm, v))
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=1e-8, atol=1e-10 * r.abs().max().item())


@pytest.mark.parametrize('normalize, method', [(True, 'regularized'), (False, 'iterative')])
@pytest.mark.parametrize('wrt', ['q', 'lm', 'v', 'all'])
def test_one_backward_for_both_kernel_products(normalize, method, wrt, force_plan):
    """In training the backward of P's first product forms one G for both products,
    with ∇out handed over by the second's: the gradients of the plain computation that
    keeps P, for any inputs that need them, and a retained graph gives them again."""
    force_plan(kernel_chunk=2 * 3 * 12 * 7, kernel_once_up_to=None, device='cpu')
    q = torch.randn(2, 3, 50, 8, dtype=torch.float64) * 0.5
    lm = torch.randn(2, 3, 12, 8, dtype=torch.float64) * 0.5
    v = torch.randn(2, 3, 50, 8, dtype=torch.float64)
    inputs = [t.requires_grad_(wrt in (name, 'all'))
              for name, t in (('q', q), ('lm', lm), ('v', v))]
    wanted = [t for t in inputs if t.requires_grad]
    G = torch.randn(2, 3, 50, 8, dtype=torch.float64)
    out = soft_attention(q, lm, v, normalize=normalize, pinv_method=method)
    grads = torch.autograd.grad((out * G).sum(), wanted, retain_graph=True)
    again = torch.autograd.grad((out * G).sum(), wanted)
    P, A = gaussian_kernel(q, lm), gaussian_kernel(lm, lm)
    d = A.sum(-1, keepdim=True).rsqrt() if normalize else torch.ones_like(A[..., :1])
    if method == 'regularized':
        W = d * regularized_apply(A, d * (P.mT @ v))
    else:
        W = d * (newton_pinv(A) @ (d * (P.mT @ v)))
    ref_grads = torch.autograd.grad((P @ W * G).sum(), wanted)
    assert torch.allclose(out, P @ W, rtol=1e-10, atol=1e-12)
    for g, h, r in zip(grads, again, ref_grads):
        assert torch.allclose(g, r, rtol=1e-8, atol=1e-10 * r.abs().max().item())
        assert torch.allclose(h, g, rtol=1e-12, atol=0)


def test_regularized_mode_is_the_tikhonov_filter():
    """Fast mode: λ/(λ² + μ) with μ = 1/(α·2^T) on A's eigenvalues; close to the iterate."""
    A = gaussian_kernel_matrix(40, batch=(2, ), scale=0.3)
    Z = torch.randn(2, 40, 8, dtype=torch.float64)
    mu = 1 / (newton_alpha(A) * 2.0**20)
    lam, U = torch.linalg.eigh(A)
    expected = U @ ((lam / (lam**2 + mu.squeeze(-1))).unsqueeze(-1) * (U.mT @ Z))
    out = regularized_apply(A, Z)
    assert torch.allclose(out, expected, rtol=1e-6, atol=1e-9 * expected.abs().max().item())
    iterate = newton_pinv(A) @ Z
    dev = ((out - iterate).norm() / iterate.norm()).item()
    assert 0 < dev < 0.1


def test_regularized_failed_factorization_is_never_silent(monkeypatch):
    """A² + μI of the rank-1 all-ones kernel with μ ~ 2^-61·||A||² is not positive
    definite in float32: the CPU raises; where checking would synchronize a GPU (here:
    the check switched off as under torch.compile) only that matrix's output is NaN,
    also where the failed factor is left finite (here: the identity). m = 16: where the
    factorization fails is rounding, and at m = 8 torch 2.1's LAPACK gets through."""
    A = torch.stack([torch.ones(16, 16), gaussian_kernel_matrix(16, scale=0.3).float()])
    Z = torch.randn(2, 16, 3)
    with pytest.raises(torch.linalg.LinAlgError, match='1 of 2'):
        regularized_apply(A, Z, iters=60)
    # torch < 2.3 has no torch.compiler.is_compiling (mmsoft then asks torch._dynamo)
    monkeypatch.setattr(torch.compiler, 'is_compiling', lambda: True, raising=False)
    cholesky_ex = torch.linalg.cholesky_ex

    def finite_when_failed(M):
        L, info = cholesky_ex(M)
        eye = torch.eye(M.shape[-1], dtype=M.dtype)
        return torch.where(info[..., None, None] > 0, eye, L), info

    monkeypatch.setattr(torch.linalg, 'cholesky_ex', finite_when_failed)
    out = regularized_apply(A, Z, iters=60)
    assert out[0].isnan().all() and torch.isfinite(out[1]).all()


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


def _ill_conditioned_soft_inputs():
    """Landmarks pooled from nearby tokens, as SOFT makes them: cond(A) ≈ 1.4e3, where a
    bfloat16 inverse is useless."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 256, 32, generator=g) * 0.2
    lm = q.view(2, 16, 16, 32).mean(2)
    v = torch.randn(2, 256, 32, generator=g)
    return q, lm, v


def test_inverse_is_float32_under_autocast(monkeypatch):
    """Under bf16 autocast the N-sized products run in bf16 but the landmark kernel and
    its inverse stay float32 (~0.6 % from float64 here, the bf16 products' rounding).
    The inverse sees float32 operands; with the guard removed the dispatch would refuse
    the bf16 kernel."""
    from mmsoft.models.attention import newton
    from mmsoft.models.attention import soft as soft_mod
    q, lm, v = _ill_conditioned_soft_inputs()
    ref = soft_attention(q.double(), lm.double(), v.double())
    seen = []

    plain = newton.Iterative.apply

    def recording_apply(self, A, Z, *args, **kwargs):
        seen.append((A.dtype, Z.dtype))
        return plain(self, A, Z, *args, **kwargs)

    monkeypatch.setattr(newton.Iterative, 'apply', recording_apply)

    def deviation():
        seen.clear()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = soft_attention(q, lm, v)
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
        return ((out.double() - ref).abs().max() / ref.abs().max()).item()

    assert deviation() < 0.02
    assert seen == [(torch.float32, torch.float32)]
    monkeypatch.setattr(soft_mod, 'compute_dtype', lambda t: torch.bfloat16)
    with pytest.raises(attention.VariantNotSupported, match='not bfloat16'):
        deviation()  # without the guard a bf16 kernel would reach the inverse
    monkeypatch.undo()
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
    with pytest.raises(ValueError, match='iters'):
        newton_pinv(torch.eye(3), iters=-1)
    with pytest.raises(ValueError, match='order'):
        sima_attention(*(torch.randn(1, 4, 2) for _ in range(3)), order='random')


@pytest.mark.parametrize('transpose', [False, True])
def test_kernel_matmul_gradcheck(transpose, force_plan):
    """κ(q, l)·w and κ(q, l)ᵀ·w with P recomputed chunk by chunk in backward."""
    force_plan(kernel_chunk=2 * 3 * 7 * 4, kernel_once_up_to=None, device='cpu')  # 6 chunks
    q = (torch.randn(2, 3, 23, 5, dtype=torch.float64) * 0.5).requires_grad_()
    lm = (torch.randn(2, 3, 7, 5, dtype=torch.float64) * 0.5).requires_grad_()
    w = torch.randn(2, 3, 23 if transpose else 7, 4, dtype=torch.float64,
                    requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: kernel_matmul(a, b, c, transpose=transpose), (q, lm, w))
    P = torch.exp(-torch.cdist(q, lm).pow(2) / 2)
    ref = P.mT @ w if transpose else P @ w
    assert torch.allclose(kernel_matmul(q, lm, w, transpose), ref, rtol=1e-12, atol=1e-13)


def test_training_does_not_keep_the_kernel():
    """No N×m tensor is saved for backward: P is recomputed (memory-lean training)."""
    N, m, d = 400, 25, 8
    q = (torch.randn(2, 2, N, d) * 0.5).requires_grad_()
    lm = (torch.randn(2, 2, m, d) * 0.5).requires_grad_()
    v = torch.randn(2, 2, N, d, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = soft_attention(q, lm, v)
    assert saved and max(saved) <= 2 * 2 * N * d < 2 * 2 * N * m, saved
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, lm, v))


def test_each_chunk_costs_only_its_kernels_and_products(monkeypatch, force_plan):
    """A training step over k row chunks of P: every further chunk adds its four kernel
    evaluations (one product of the kernel features, clamp, exp), seven further products
    and one G = ∇P ⊙ P for both products of P, and no copies or norms (V in the layout a
    SOFT block makes it, batch 2: before the features, its chunks were copied in every
    product)."""
    from mmsoft.testing import LaunchCounter
    B, h, N, m, d = 2, 3, 48, 12, 8
    counts = {}
    for k in (2, 4):
        force_plan(kernel_chunk=B * h * m * N // k, kernel_once_up_to=None, device='cpu')
        q = (torch.randn(B, N, h, d).transpose(1, 2) * 0.5).requires_grad_()
        lm = (torch.randn(B, h, m, d) * 0.5).requires_grad_()
        v = torch.randn(B, N, h, d).transpose(1, 2).requires_grad_()
        with LaunchCounter() as count:
            soft_attention(q, lm, v, pinv_method='iterative').sum().backward()
        counts[k] = count.counts
    per_chunk = {op: (counts[4][op] - counts[2][op]) / 2 for op in counts[4]}
    # 20 with torch 2.14.1; how matmul reaches the backend (bmm, mm, expand copies)
    # differs between torch versions, so this is a budget, not an exact count
    assert sum(per_chunk.values()) <= 4 * 3 + 7 + 1, per_chunk
    assert per_chunk['exp_'] == 4 and per_chunk['mul_'] == 1 and not any(
        per_chunk.get(op) for op in ('copy_', 'clone', 'pow', 'sum', 'cat')), per_chunk


@pytest.mark.parametrize('once_up_to', [None, 2 * 3 * 50 * 12 - 1])
def test_inference_forms_a_large_kernel_only_in_chunks(once_up_to, force_plan):
    """Without gradients P is made whole up to the device's ``once_up_to`` elements and
    in row chunks above it (computed twice, never whole); the output is the same."""
    q = torch.randn(2, 3, 50, 8, dtype=torch.float64) * 0.5
    lm = torch.randn(2, 3, 12, 8, dtype=torch.float64) * 0.5
    v = torch.randn(2, 3, 50, 8, dtype=torch.float64)
    ref = soft_attention(q, lm, v)
    from mmsoft.testing import LaunchCounter
    force_plan(kernel_chunk=2 * 3 * 12 * 20, kernel_once_up_to=once_up_to, device='cpu')
    # every P (or chunk of it) and the m×m kernel end in one in-place exp
    with torch.no_grad(), LaunchCounter(shapes_of=['exp_']) as ops:
        out = soft_attention(q, lm, v)
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-13)
    P_rows = [shape[-2] for shape in ops.shapes['exp_'] if shape[-1:] == (12, )
              and shape[-2] != 12]  # the m×m landmark kernel aside
    if once_up_to is None:
        assert P_rows == [50]
    else:  # two passes over 3 chunks of at most 20 rows, near-equal: 17, 17 and 16
        assert P_rows == [17, 17, 16] * 2


def test_round_tf32_keeps_ten_mantissa_bits():
    x = torch.randn(10000) * 100
    r = round_tf32(x)
    assert torch.equal(round_tf32(r), r)  # already TF32: unchanged
    assert (r.view(torch.int32) & 0x1FFF == 0).all()  # low 13 mantissa bits cleared
    rel = ((r - x).abs() / x.abs())
    assert rel.max() <= 2**-11 and rel.max() > 2**-12  # round to nearest, not truncation
    one = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11])  # ties go to the even neighbour
    assert round_tf32(one).tolist() == [1.0, 1 + 2**-9]
    with pytest.raises(TypeError):
        round_tf32(x.double())


# ------------------------------------------------------------------------------------
# Hard kernels: a sanity bound, not the fidelity floor (which is judged on the network's
# outputs, tests/models/backbones/test_fidelity.py). Every path a plan can pick stays
# finite and within 1e-3 of the float64 iterate of the same float32 kernel, or within 2×
# the official float32 iteration's deviation where that itself misses 1e-3.
# ------------------------------------------------------------------------------------
@pytest.mark.parametrize('m', [64, 196])
@pytest.mark.parametrize('kind', HARD_KERNELS)
def test_every_path_a_plan_may_take_stays_near_the_float64_iterate(kind, m):
    """Inference and training, every path a plan may take (``PLAN_PATHS``: the variants,
    'tf32' also with CUDA's options). Largest deviations measured over seeds 0-3 (``python
    tools/analysis_tools/pinv_accuracy.py --seeds 0 1 2 3``; docs/en/notes/numerics.md),
    the 'boundary' kernels aside: 2.0e-4 ('iterative', near-rank-1), at most half the
    bound; on 'boundary' kernels, where the official float32 iteration itself deviates up
    to 8.5e-2, every path stays within 1.27× of it."""
    assert resolve('auto', m, 'cpu') in PINV_PATHS.values()
    assert resolve('auto', m, 'cuda') in PINV_PATHS.values()
    out = pinv_accuracy(kind, m)
    # inference and training per path; training where the variant computes gradients
    assert len(out) == 2 + sum(2 if PINV_PATHS[p].gradients else 1 for p in PLAN_PATHS)
    for name, dev in out.items():
        if name not in ('floor', 'bound'):
            assert dev <= out['bound'], (kind, m, name, dev, out['floor'])


@pytest.mark.parametrize('m', [196, 400])
@pytest.mark.parametrize('kind', HARD_KERNELS)
def test_a_training_step_keeps_the_iterate_within_the_gradient_floor(kind, m):
    """In a training step the iterate's error reaches parameter gradients undiluted
    (∇A = -Yᵀ·∇Y·Yᵀ feeds the landmarks' and queries' weights), so every path that
    computes gradients keeps A⁺·Z within the gradient floor of the float64 iterate:
    ``GRADIENT_TOL``, or twice the float32 reference's deviation where that is larger.
    'spectral' decomposes float32 kernels in float64 there: with the inference's float32
    decomposition (admitted up to the forward's estimate limit) clustered landmarks at
    m = 400 deviated 1.3e-4, 50× the float32 reference (2.5e-6)."""
    paths = [p for p in PLAN_PATHS if PINV_PATHS[p].gradients]
    for seed in (0, 1):
        out = pinv_accuracy(kind, m, seed, paths=paths)
        bound = max(GRADIENT_TOL, 2 * out['floor'])
        for name in paths:
            dev = out[f'{name} training']
            assert dev <= bound, (kind, m, seed, name, dev, out['floor'])


def test_every_step_thin_misses_the_bound_near_the_boundary():
    """Why 'tf32' applies at most its last float32 steps thin, after a formed step: with
    every step thin (from V₀ = αA) the first factor 2I - αA² is near 0 for eigenvalues
    near the step size's boundary and its rounding is never corrected. Finite."""
    from mmsoft.models.attention.newton import _NewtonPinvThin
    A, Z, ref, floor = hard_problem('boundary', 196)
    every = ((0, 'float32'), (0, 'tf32'), (20, 'float32'))
    W = _NewtonPinvThin.apply(A, Z, every, 1, 20, False, True)
    assert kernel_bound(floor) < relative_deviation(W, ref) < float('inf')


def _float32_eigh_apply(A, Z, iters=20):
    """A⁺·Z through one float32 eigendecomposition alone (what 'spectral' does not do)."""
    from mmsoft.models.attention.spectral import _spectral_filter
    lam, U = torch.linalg.eigh(A)
    v = _spectral_filter(lam, newton_alpha(A, nonnegative=True), iters)
    return U @ (v.unsqueeze(-1) * (U.mT @ Z))


def test_mixed_eigh_keeps_the_bound_where_float32_eigh_misses_it():
    """'spectral' splits off the Perron pair in float64 where it has converged (near-rank-1
    landmarks: float32 eigh alone 1.6e-3-3.4e-3, over the bound) and decomposes in
    float64 what its error estimate flags (the step size's boundary: float32 eigh 10× the
    bound on this kernel); elsewhere it runs float32 eigh, whose rounding shows against
    the float64 decomposition (clustered landmarks: 4.7e-5 against 9.4e-8)."""
    for kind, m, seed in (('near_rank1', 64, 0), ('boundary', 64, 1)):
        A, Z, ref, floor = hard_problem(kind, m, seed)
        assert relative_deviation(_float32_eigh_apply(A, Z), ref) > kernel_bound(floor)
        out = pinv_accuracy(kind, m, seed, paths=('spectral', ))
        assert out['spectral inference'] <= out['bound'] / 1.5, (kind, out)
        assert out['spectral training'] <= out['bound'] / 1.5, (kind, out)
    A, Z, ref, _ = hard_problem('clustered', 196)
    W64 = spectral_apply(A.double(), Z.double(), nonnegative=True)
    out = pinv_accuracy('clustered', 196, paths=('spectral', ))
    assert out['spectral inference'] > 10 * relative_deviation(W64, ref), out


def test_mixed_eigh_treats_each_kernel_of_a_batch_on_its_own():
    """'mixed' decides per kernel: in one (2, 2, m, m) batch of near-rank-1 kernels (the
    Perron pair split off), boundary kernels (float64) and clustered ones (float32) every
    slot keeps the bound against its own float64 iterate, with and without gradients."""
    kinds = (('near_rank1', 0), ('boundary', 1), ('clustered', 0), ('near_rank1', 2))
    problems = [hard_problem(kind, 64, seed) for kind, seed in kinds]
    A = torch.stack([p[0] for p in problems]).reshape(2, 2, 64, 64)
    Z = torch.stack([p[1] for p in problems]).reshape(2, 2, 64, 32)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            W = spectral_apply(A.clone().requires_grad_(grad), Z, nonnegative=True).detach()
        assert W.shape == Z.shape
        for (kind, seed), (_, _, ref, floor), w in zip(kinds, problems, W.reshape(4, 64, 32)):
            assert relative_deviation(w, ref) <= kernel_bound(floor), (kind, seed, grad)


def test_filter_slope_is_the_derivative_of_the_filter():
    """The slope 'mixed''s error estimate reads, against central differences of the
    filter, across its regimes: linear (λ → 0, slope α·2^T), turning over, 1/λ, and near
    the step size's boundary αλ² = 2."""
    from mmsoft.models.attention.spectral import _filter_slope, _spectral_filter
    alpha = torch.tensor([[0.5]], dtype=torch.float64)
    lam = torch.tensor([[1e-9, 1e-4, 1.4e-3, 1e-2, 0.5, 1.0, 1.9, 1.99999]],
                       dtype=torch.float64)
    h = lam * 1e-6
    h[0, -1] = 1e-11  # within 2e-5 of the boundary the filter's exponent moves by ~2^20·h
    numeric = (_spectral_filter(lam + h, alpha, 20) - _spectral_filter(lam - h, alpha, 20)) / (
        2 * h)
    slope = _filter_slope(lam, alpha, 20)
    assert torch.allclose(slope, numeric, rtol=1e-4, atol=0), (slope, numeric)
    assert slope[0, 0] == 0.5 * 2**20


def test_tf32_needs_a_first_float32_step_near_the_boundary():
    """On a kernel whose top eigenvalues sit on the step size's boundary (αλ² ≈ 2), where
    the iterate is ill-conditioned, TF32 rounding of V₀ = αA moves αλ²: rounded to
    nearest (as tensor cores do, and the emulation) it crosses 2 and the iterate
    diverges (cut toward zero it ended 15× the bound away). One float32 step first maps
    those eigenvalues to |1 - λv| < 1, where TF32 rounding stays harmless; more float32
    steps at the end do not repair it."""
    A, Z, ref, floor = hard_problem('boundary', 64, seed=1)
    W = TF32(float32_steps=(0, 8)).apply(A, Z, 20)
    assert not torch.isfinite(W).all() or relative_deviation(W, ref) > 5 * kernel_bound(floor)
    W = TF32(float32_steps=(1, 8)).apply(A, Z, 20)
    assert relative_deviation(W, ref) <= kernel_bound(floor)


def test_tf32_needs_its_last_float32_steps():
    """The float32 steps that end 'tf32' remove the TF32 rounding in the converged
    directions (Newton's step squares the error there): without them a clustered kernel
    ends beyond the bound."""
    A, Z, ref, floor = hard_problem('clustered', 64)
    W = TF32(float32_steps=(1, 0)).apply(A, Z, 20)
    assert relative_deviation(W, ref) > kernel_bound(floor)
    W = TF32(float32_steps=(1, 2)).apply(A, Z, 20)
    assert relative_deviation(W, ref) <= kernel_bound(floor) / 2


def _mm_products(fn):
    """(m×m products, thin products) of the matrix products ``fn`` runs, counted below
    autograd: a product whose second operand is square or not."""
    from torch.utils._python_dispatch import TorchDispatchMode
    aten = torch.ops.aten
    counts = [0, 0]

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (aten.bmm.default, aten.mm.default, aten.baddbmm.default):
                b = args[-1] if func is not aten.baddbmm.default else args[2]
                counts[b.shape[-1] != b.shape[-2]] += 1
            return func(*args, **(kwargs or {}))

    with Counting():
        fn()
    return tuple(counts)


@pytest.mark.parametrize('kwargs, steps, shape', [
    (dict(float32_steps=(0, 20)), 19, (3, 40)),  # every step thin after the first
    (dict(float32_steps=(0, 20)), 4, (3, 40)),
    (dict(float32_steps=(1, 4), pad_to=32), 4, (3, 40)),  # CUDA's
    (dict(float32_steps=(1, 8)), 3, (3, 40)),
    # large enough for thin steps to pay in training (``_thin_pays_in_training``):
    # CUDA's 4 steps there as X_0, its next step X_1 and Horner's rule for the last 3
    (dict(float32_steps=(1, 4), pad_to=32), 4, (8, 500)),
])
def test_thin_steps_are_the_formed_steps(kwargs, steps, shape):
    """The last L steps applied to the thin matrix compute the formed iterate times Z,
    and its Eq. 16 gradients, exactly so in float64 (where 'tf32' runs every step in
    float64). Without gradients with L m×m products for those steps instead of 2L, one
    by one at every size. With gradients where that costs less than forming them (large
    kernels; else formed, backward applying the saved iterate): then with fewer m×m
    products still where Horner's rule on the steps' sum costs less, recomputed in
    backward, the iterate never formed."""
    b, m = shape
    A = gaussian_kernel_matrix(m, batch=(b, ), scale=0.3)
    Z = torch.randn(b, m, 8, dtype=torch.float64)
    grad = torch.randn(b, m, 8, dtype=torch.float64)
    A_ref, Z_ref = A.clone().requires_grad_(), Z.clone().requires_grad_()
    ref = newton_pinv(A_ref) @ Z_ref  # float64: the TF32 steps are float64 ones
    ref.backward(grad)
    plain, thinned = TF32(**kwargs), TF32(**kwargs, thin_steps=min(steps, 8))
    if steps > 8:
        thinned = TF32(float32_steps=(0, 20), thin_steps=steps)
    with torch.no_grad():
        thin = thinned.apply(A, Z, 20)
        formed = _mm_products(lambda: plain.apply(A, Z, 20))
        counted = _mm_products(lambda: thinned.apply(A, Z, 20))
    assert relative_deviation(thin, ref) < 1e-12
    assert formed[0] - counted[0] == steps  # one m×m product fewer per thin step
    assert counted[1] - formed[1] == steps  # (2I - X)·W each, V·W instead of Y·Z
    A_thin, Z_thin = A.clone().requires_grad_(), Z.clone().requires_grad_()
    W = []
    training = _mm_products(lambda: W.append(thinned.apply(A_thin, Z_thin, 20)))
    W = W[0]
    assert relative_deviation(W.detach(), ref.detach()) < 1e-12
    backward = _mm_products(lambda: W.backward(grad))
    if m == 500:  # X_0 and X_1 for the 4 steps, 1 + 7 thin products, both again backward
        assert (formed[0] - training[0], training[1] - formed[1]) == (2 * steps - 2, 1 + 7)
        assert backward[0] == 2
    else:  # formed, as the iterate saved for backward
        assert training == formed and backward[0] == 0
    assert relative_deviation(A_thin.grad, A_ref.grad) < 1e-12
    assert relative_deviation(Z_thin.grad, Z_ref.grad) < 1e-12


def test_thin_steps_take_the_fewest_flops_or_launches():
    """In training, CUDA's 4 thin steps at SOFT-S's m = 1056 (padded) and d = 32, 2 heads
    of stage 1: one sum by Horner's rule (15 thin products, the flops of half an m×m
    product, against 3 m×m and 4 thin ones step by step), and thin rather than formed.
    At 512×512 (m = 256) every product is below a launch's worth of flops: the steps
    one by one take the fewest (7, not 15), and forming them fewer still. For a Z as wide
    as A (n = m) one by one too."""
    from mmsoft.models.attention.newton import _horner_steps, _thin_pays_in_training
    assert _thin_pays_in_training(4, 1056, 32, b=2)
    assert not _thin_pays_in_training(4, 256, 32, b=2)
    assert _horner_steps(4, 1056, 32, b=2) == 4
    assert _horner_steps(4, 256, 32, b=2) == 0
    assert _horner_steps(4, 1056, 1056, b=2) == 0
    assert _horner_steps(0, 1056, 32, b=2) == 0


def test_thin_steps_keep_cudas_schedule_accurate():
    """On the hard kernels where 'tf32''s last float32 steps matter (clustered: without
    them beyond the bound), CUDA's schedule with those steps thin stays within 1.5× of
    the formed schedule's deviation (TF32 emulated): the thin steps correct the formed
    TF32 steps' rounding as formed steps would. Every step thin would not (below)."""
    cuda, thin = "tf32, CUDA's plan", "tf32, CUDA's plan, last steps thin"
    for kind, m in (('clustered', 64), ('pooled', 196), ('near_rank1', 64)):
        out = pinv_accuracy(kind, m, paths=(cuda, thin))
        assert out[f'{thin} inference'] <= 1.5 * out[f'{cuda} inference'], (kind, out)


@pytest.mark.parametrize('m', [64, 1024])
def test_thin_steps_apply_the_iterate_before_their_factors(m):
    """The thin steps apply V to Z first, then their factors in X'_0 = V·A (A⁺ =
    V·poly(A·V) = poly(V·A)·V by associativity): the factors' rounding is not amplified
    by V afterwards. On a singular kernel (duplicated landmarks) with Z 99 % in its null
    space, CUDA's schedule with the last 4 steps thin (by Horner's rule where that costs
    less, as training applies them: ``newton._NewtonPinvThin``), stays within 2× of
    the formed schedule's deviation from the float64 iterate (TF32 emulated; measured
    with torch 2.14 / 2.1: 0.93× / 1.17× at m = 64 one by one, 1.08× / 1.58× at
    m = 1024 with the last 3 by Horner's rule). V applied last, the same steps deviated
    16× / 16× at m = 64, and 3.3× / 4.6× at m = 1024 (one by one 1.7× / 1.9×)."""
    x = hard_landmarks('duplicated', m)
    A64 = gaussian_kernel(x, x)
    null = torch.linalg.eigh(A64)[1][:, :m // 4]  # the duplicates' differences
    g = torch.Generator().manual_seed(1)
    Z = torch.randn(m, 32, generator=g, dtype=torch.float64)
    Z_null = null @ torch.randn(m // 4, 32, generator=g, dtype=torch.float64)
    Z = (0.01 * Z / Z.norm() + 0.99 * Z_null / Z_null.norm()).float()
    A = A64.float()
    ref = newton_iterate(A.double()) @ Z.double()
    from mmsoft.models.attention.newton import _NewtonPinvThin
    formed = relative_deviation(TF32(float32_steps=(1, 4), pad_to=32).apply(A, Z, 20), ref)
    with torch.no_grad():
        cuda = ((1, 'float32'), (15, 'tf32'), (4, 'float32'))  # CUDA's 'tf32' at T = 20
        thin = _NewtonPinvThin.apply(A, Z, cuda, 32, 4, True, True)
    thin = relative_deviation(thin, ref)
    assert thin <= 2 * formed, (thin, formed)


def test_newton_of_the_identity_is_zero():
    """The official α sits on the convergence boundary for A = I (paper Alg. 2):
    α = 2 / 1², ||I - α·I||₁ = 1 passes the 1.01 test, so αλ² = 2 and every iterate
    v_{k+1} = 2v - v² starting from 2 is 0. Pinned, not fixed: parity needs it."""
    eye = torch.eye(3, dtype=torch.float64)
    assert newton_alpha(eye).flatten().tolist() == [2.0]
    for method in ('iterative', 'spectral'):
        assert formed(method, eye).abs().max() < 1e-12, method
    # landmarks far apart (A ≈ I): the iterate is far from A⁻¹ although A is well
    # conditioned (41 % and 99 % at norms² 30 and 40 in d = 32, found in a review)
    x = torch.randn(48, 32, generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64) * (40 / 32)**0.5
    A = gaussian_kernel(x, x)
    rel = (newton_pinv(A) - torch.linalg.inv(A)).norm() / torch.linalg.inv(A).norm()
    assert rel > 0.1


# The tridiagonal application (the variant 'tridiagonal': 'spectral' without gradients)
# ------------------------------------------------------------------------------------
def test_the_resolvent_sum_is_the_filter_on_every_eigenvalue():
    """2·Re Σ w_k / (z_k + x) against φ(x) = (1 - e^(-x)) / x from 0 to where φ is 1/x to
    rounding: within 1e-8 relative at 18 nodes (5.7e-9 measured), and fewer nodes are
    worse (the sum converges, it is not exact by construction)."""
    from mmsoft.models.attention.spectral import resolvent_quadrature
    x = torch.cat([torch.zeros(1, dtype=torch.float64),
                   torch.logspace(-12, 12, 4001, dtype=torch.float64)])
    phi = torch.where(x == 0, torch.ones_like(x),
                      -torch.expm1(-x) / torch.where(x == 0, torch.ones_like(x), x))

    def error(nodes):
        z, w = resolvent_quadrature(nodes)
        return ((2 * (w / (z + x[:, None])).sum(-1).real - phi).abs() / phi).max().item()

    assert error(18) < 1e-8
    assert error(12) > 100 * error(18)


@pytest.mark.parametrize('iters', [20, 24])
def test_tridiagonal_application_is_the_iterate_in_float64_terms(iters):
    """On a well-conditioned float32 kernel (m = 100) it is the float64 iterate to within
    the float32 tridiagonalization's rounding (the filter's own approximation is 2.6e-7
    at T = 20: 0.27·2^-T): measured 5.6e-7 (T = 20) and 1.1e-6 (T = 24), eigh 1.0e-6 and
    2.5e-6; the eigh path on the same kernel is checked alongside so that the tolerance
    is not the method's own, and the two differ, so the tridiagonal path ran (this kernel
    is not one it leaves to eigh)."""
    pytest.importorskip('scipy')
    torch.manual_seed(0)
    landmarks = torch.randn(100, 16, dtype=torch.float64) * 0.35
    A = gaussian_kernel(landmarks, landmarks)
    Z = torch.randn(100, 8, dtype=torch.float64)
    ref = newton_iterate(A.float().double(), iters) @ Z
    from mmsoft.models.attention.spectral import tridiagonal_apply
    with torch.no_grad():
        tri = tridiagonal_apply(A.float(), Z.float(), iters, True)
        eigh = spectral_apply(A.float(), Z.float(), iters, True)
    assert not torch.equal(tri, eigh)
    assert relative_deviation(tri, ref) < 3e-5
    assert relative_deviation(tri, eigh) < 1e-4


def test_tridiagonal_application_runs_in_inference_only():
    """The variant declares it: with gradients the CPU's list runs 'spectral' above 448
    landmarks, without them 'tridiagonal'; forced with gradients it raises."""
    pytest.importorskip('scipy')
    cpu = PLANS['cpu']
    assert select_variant('auto', cpu, Inputs('cpu', torch.float32, 1050)).name == 'tridiagonal'
    assert select_variant('auto', cpu, Inputs('cpu', torch.float32, 1050, grad=True)).name == (
        'spectral')
    assert select_variant('auto', cpu, Inputs('cpu', torch.float32, 448)).name == 'spectral'
    q = (torch.randn(1, 1, 40, 8) * 0.3).requires_grad_()
    with pytest.raises(attention.VariantNotSupported, match="'tridiagonal': computes no "
                       'gradients'):
        soft_attention(q, q[..., :10, :].detach(), q.detach(), pinv_method='tridiagonal')


def test_tridiagonal_application_runs_lapack_on_the_calling_thread(monkeypatch):
    """OpenBLAS runs SciPy's ``ssytrd`` with one thread (its workers would spin beside
    torch's threads after each call) and has its own thread count back afterwards.
    Every OpenBLAS whose threads can be set is limited (old copies bundled with other
    wheels, such as opencv's, report a fixed count)."""
    pytest.importorskip('scipy')
    threadpoolctl = pytest.importorskip('threadpoolctl')
    from scipy.linalg import lapack

    from mmsoft.models.attention.spectral import tridiagonal_apply

    def openblas_threads():
        return {lib['filepath']: lib['num_threads'] for lib in threadpoolctl.threadpool_info()
                if lib['internal_api'] == 'openblas'}

    if not openblas_threads():
        pytest.skip("SciPy's LAPACK is not OpenBLAS here")
    seen, ssytrd = [], lapack.ssytrd

    def spy(*args, **kwargs):
        seen.append(openblas_threads())
        return ssytrd(*args, **kwargs)

    monkeypatch.setattr(lapack, 'ssytrd', spy)
    torch.manual_seed(0)
    A = gaussian_kernel(*[torch.randn(64, 16) * 0.35] * 2)
    with threadpoolctl.threadpool_limits(2, user_api='blas'), torch.no_grad():
        before = openblas_threads()
        tridiagonal_apply(A, torch.randn(64, 8), 20, True)
        after = openblas_threads()
    two = [path for path, threads in before.items() if threads == 2]
    assert two and after == before
    assert seen and all(threads[path] == 1 for threads in seen for path in two)
