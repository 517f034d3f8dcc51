"""The step size α of the Newton–Raphson iterate (paper Alg. 2), chosen per kernel, and a
bound on where it puts the kernel's eigenvalues. Both ``newton.py``'s iteration and
``spectral.py``'s filter start from it. Shapes: ... leading batch dimensions."""
import torch

from .dtypes import widest_dtype

__all__ = ['ALPHA_BOUND', 'alpha_candidates', 'first_step_bound', 'newton_alpha']

# newton_alpha halves α while ||I - α·A·A||₁ exceeds this
ALPHA_BOUND = 1.01


def newton_alpha(A, max_halvings=10, nonnegative=False):
    """Initial step α of the Newton–Raphson inverse, chosen per matrix (paper Alg. 2).

    α = 2 / (max row sum of |A|)², halved while ||I - α·A·A||₁ > 1.01 (at most
    ``max_halvings`` times). ||·||₁ is the max column sum of absolute values.

    Args:
        A (Tensor): (..., m, m)
        max_halvings (int): at most this many halvings.
        nonnegative (bool): A is symmetric with nonnegative entries (a Gaussian kernel
            matrix is). Then column j of I - α·A² has the diagonal entry 1 - α·a_j with
            a_j = Σ_k A_jk² and off-diagonal entries of total size α·(s_j - a_j) with
            s_j = (A·(A·1))_j, so ||I - α·A²||₁ = max_j |1 - α·a_j| + α·(s_j - a_j) costs
            O(m²) per α instead of forming A·A (O(m³)), and all candidate α are tested
            at once (a few launches instead of a loop of small ones).
    Returns:
        Tensor: (..., 1, 1) α for every matrix of the batch (not one α for the whole batch,
        which would make one image's output depend on the others in its batch).
    """
    if nonnegative:
        # Decided in float64 (A's values, exact products and sums): which candidate meets
        # the bound is a threshold, and a kernel can sit within float32 rounding of it
        # (one of the cat photo's at 640×640: 1.3e-7 from 1.01), where another order of
        # float32 sums (CUDA's) took one halving more or fewer. α then differs by 2, and
        # so does the iterate on A's small eigenvalues (v_T(λ) ≈ α·λ·2^T there): the
        # output maps moved 5e-5 from the float64 computation whatever computed the
        # iterate. In float64 the decision is the reference's, and the same on every
        # device, up to ties within float64 rounding (MPS has no float64: A's dtype).
        cand, norms = alpha_candidates(A.to(widest_dtype(A)), max_halvings)
        # The bound holds for every α below one that meets it (the norm is convex in α
        # and 1 at α = 0), so the halvings of the sequential loop below are the
        # candidates that miss it, at most max_halvings.
        halvings = (norms > ALPHA_BOUND).sum(-1, keepdim=True)  # (..., 1, 1)
        return cand.gather(-1, halvings[..., None]).squeeze(-1).to(A.dtype)
    alpha = 2 * A.abs().sum(-1, keepdim=True).amax(-2, keepdim=True).pow(-2)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    AA = A @ A
    # A fixed number of steps with torch.where (no data-dependent break): the result is
    # the same (α stops halving once the bound holds) and the graph stays traceable.
    for _ in range(max_halvings):
        norm = (eye - alpha * AA).abs().sum(-2).amax(-1)[..., None, None]
        alpha = torch.where(norm > ALPHA_BOUND, alpha / 2, alpha)
    return alpha


def alpha_candidates(A, max_halvings=10):
    """``newton_alpha``'s candidates for a nonnegative symmetric A (..., m, m) and the
    norms they are tested by, computed in A's dtype.

    Returns:
        (Tensor, Tensor): α/2^j, j = 0 … ``max_halvings``, (..., 1, 1, J + 1), and
        ||I - α/2^j·A²||₁ for j < J, (..., 1, J).
    """
    row_sums = A.sum(-1, keepdim=True)  # |A| = A: no m×m temporary
    alpha = 2 * row_sums.amax(-2, keepdim=True).pow(-2)  # (..., 1, 1); pow(-2) is 1/x²
    # a_j = ||A_j||², without an m×m temporary (it only decides the halvings)
    diag = torch.linalg.vector_norm(A, dim=-1).pow(2)[..., None, :]  # (..., 1, m)
    off = (A @ row_sums).transpose(-1, -2) - diag  # s_j - a_j
    # Candidates along a new last dim: powers of two (exact) made on A's device (a tensor
    # from a Python list would be a host-to-device copy, which synchronizes with a GPU
    # in every call).
    scales = 0.5**torch.arange(max_halvings + 1, dtype=A.dtype, device=A.device)
    cand = alpha[..., None] * scales  # (..., 1, 1, J + 1)
    c = cand[..., :-1]
    norms = ((1 - c * diag[..., None]).abs() + c * off[..., None]).amax(-2)
    return cand, norms


def first_step_bound(A, alpha, nonnegative=False):
    """A bound on αλ² over the eigenvalues λ of each matrix of A (..., m, m), symmetric,
    with step α (``newton_alpha``, (..., 1, 1)): α·max_j (|A|·(|A|·1))_j, (...,).

    λ_max(A)² = λ_max(A²) is at most A²'s largest absolute row sum, at most
    max_j (|A|·(|A|·1))_j (O(m²): two matrix–vector products). Below 2 the official step
    size keeps every eigenvalue inside the iterate's region of convergence with a margin
    (tools/analysis_tools/newton_convergence.py reports it)."""
    a = A if nonnegative else A.abs()
    s = (a @ a.sum(-1, keepdim=True)).amax((-2, -1))
    return alpha.reshape(s.shape) * s
