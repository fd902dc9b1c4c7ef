"""The attention solver: the least-squares query–key kernel from accumulated statistics.

The statistics are a :class:`._kernel_moments.KernelMoments`, the sums over tokens that the
normal equations of the kernel need. With ``A = Wᵀ``, ``M_i = V S_i`` (``S_i`` the moment of
the keys query ``i`` sees) and ``y_i = M_i A x_i``, they read ``G vec(A) = b`` with ``G =
sum_i T_i ⊗ P_i``, ``T_i = S_i Vᵀ V S_i``, ``P_i = x_i x_iᵀ`` and ``b = sum_i vec(S_i Vᵀ y_iᵀ
x_i)``.

One solver function per way of solving them, chosen by :func:`solve_kernel` from what the
statistics hold (``solver=`` of the statistics: ``"dense"`` accumulates ``C``, ``"cg"`` keeps
sequences or their moments), as scikit-learn's ridge chooses among its ``_solve_*``:

* :func:`_solve_cholesky`: ``G`` unpacked from the compressed ``C`` and factorised;
* :func:`_solve_compressed_cg`: conjugate gradients on products with ``C`` (``G`` too large);
* :func:`_solve_matrix_free_cg`: conjugate gradients on the products of
  :class:`NormalOperator` over the kept sequences;
* :func:`_solve_refined_cg`: the same with float32 products refined in float64, where only
  the moments of unmasked linear attention are kept.

For softmax attention the linearised solve is then refined by :func:`_gauss_newton` on the
softmax model itself. :func:`solve_kernel` returns the kernel and its noise-whitened spectrum;
the rank is cut from them by :func:`._kernel_rank.kernel_threshold_rank`, with the noise along
a singular direction that :func:`solve_kernel` also returns.
"""

from typing import NamedTuple

import numpy as np
import scipy.linalg
from sklearn.utils import Bunch

from ._attention_operators import (
    BLOCK_VALUES,
    allowed_keys,
    apply_moments,
    base_weights,
    moment_products,
    softmax_weights,
    work_array,
)
from ._conjugate_gradients import conjugate_gradients, refined_conjugate_gradients

__all__ = ["NormalOperator", "compressed_product", "normal_matrix", "solve_kernel"]


# --- the normal operator --------------------------------------------------------------------

def _compressed_index(moments):
    """``index[a, a']``: the row of ``C`` that holds the pair ``(a, a')`` (``vech`` order)."""
    d = moments.rhs.shape[0]
    index = np.empty((d, d), dtype=np.intp)
    index[moments.rows, moments.cols] = np.arange(len(moments.rows))
    index[moments.cols, moments.rows] = np.arange(len(moments.rows))
    return index


def normal_matrix(moments):
    """The dense ``d^2 x d^2`` matrix ``G`` of dense ``moments`` (rows and columns ``(a, b)``,
    row-major)."""
    index = _compressed_index(moments)
    # G[(a, b), (a', b')] = C[index[a, a'], index[b, b']]
    G = moments.C[index[:, None, :, None], index[None, :, None, :]]
    d = index.shape[0]
    return G.reshape(d * d, d * d)


def compressed_product(moments, A, index=None, block=128):
    """``G vec(A)`` from the compressed ``C`` of dense ``moments``, without forming ``G``."""
    index = _compressed_index(moments) if index is None else index
    C, rows, cols = moments.C, moments.rows, moments.cols
    out = np.zeros_like(A)
    unpack = index.ravel()
    d = A.shape[0]
    for start in range(0, len(rows), block):
        part = slice(start, start + block)
        # Each row i = (a, a') of C unpacks to the symmetric matrix C_i[b, b'] (a gather of
        # one block of rows: 16 MB at d = 128).
        Ci = np.take(C[part], unpack, axis=1).reshape(-1, d, d)
        a, a2 = rows[part], cols[part]
        # out[a, b] += sum_b' C_i[b, b'] A[a', b'] and, for a != a', out[a', b] += ... A[a, b']:
        # both products in one batched matrix product.
        both = Ci @ np.stack([A[a2], A[a]], axis=2)
        np.add.at(out, a, both[:, :, 0])
        off = a != a2
        np.add.at(out, a2[off], both[off, :, 1])
    return out


class NormalOperator:
    """``D -> G vec(D)`` by per-sequence products over what matrix-free ``moments`` kept.

    Kept moments ``S_s`` (and ``T_s``) of unmasked linear attention give ``T_s D P_s = n T_s D
    S_s`` in a few GEMMs; kept sequences give ``sum_i S_i M S_i D x_i x_iᵀ`` (``M = Vᵀ V``)
    through :func:`._attention_operators.apply_moments`, with the softmax weights at a kernel
    ``A`` in place of the base weights for the Gauss–Newton matrix. One operator serves one
    solve: it holds the work arrays reused from product to product, the float32 views of the
    kept moments (``singles``, once :meth:`apply_single` is used) and the softmax weights of
    the last kernel.
    """

    def __init__(self, moments):
        self.moments = moments
        self.work = {}  # work arrays of the products, reused from block to block
        self.singles = None  # float32 (S, T or None) of the kept blocks
        self.weights_cache = None  # (A, [weights of each block] or None)

    def passes(self, A=None):
        """Per block: ``X``, ``Y``, the weights (``None``: uniform over all tokens, else
        ``(b, n, n)``), and the queries ``(b, n, 1)`` or ``None``. ``A``: the softmax weights
        at kernel ``A`` (logits ``x_iᵀ Aᵀ x_j``), else the base weights of the allowed keys."""
        m = self.moments
        n, d = m.n_tokens, m.rhs.shape[0]
        cache = self.weights_cache
        if A is not None and (cache is None or cache[0] is not A):
            # The softmax weights at A, kept for the conjugate-gradient passes of one
            # Gauss-Newton step when they take no more than the sequences themselves.
            small = m.n_sequences * n * n <= max(BLOCK_VALUES, m.n_sequences * n * d)
            cache = self.weights_cache = (A, [] if small else None)
        for index, (X, Y, valid) in enumerate(m.blocks):
            allowed = allowed_keys(m.allowed, valid, n)
            if A is not None:
                kept = cache[1]
                if kept is not None and index < len(kept):
                    weights = kept[index]
                else:
                    weights = softmax_weights(X, A, allowed, m.pattern.bias)
                    if kept is not None:
                        kept.append(weights)
                queries = None if allowed is None else allowed.any(axis=-1)
            elif allowed is None:
                # Without a mask, S = Xᵀ X / n (O(n d^2)), or uniform weights (O(n^2 d)).
                weights = None if n >= d else np.full((1, n, n), 1.0 / n)
                queries = None
            else:
                weights, queries = base_weights(m.pattern, allowed)
            if queries is not None:
                queries = np.broadcast_to(queries, X.shape[:2])[..., None]
            yield X, Y, weights, queries

    def apply(self, D, A=None):
        """``G vec(D)`` (the Gauss–Newton matrix at ``A`` for softmax) in float64."""
        m, work = self.moments, self.work
        out = np.zeros_like(D)
        d, n = D.shape[0], m.n_tokens
        VtV = None if m.value_is_identity else m.V.T @ m.V
        squares = m.square_blocks
        for pair_S, pair_T in zip(m.moment_blocks if squares else (), squares, strict=True):
            # T_s D P_s = n T_s (D S_s) = n [T_1 ... T_b] [D S_1; ...; D S_b] (T_s symmetric):
            # one batched product and one GEMM.
            shape = pair_S.hi.shape
            S = pair_S.float64(work_array(work, "S64", shape))
            T = pair_T.float64(work_array(work, "T64", shape))
            U = np.matmul(D, S, out=work_array(work, "U", shape))
            out += n * (T.reshape(-1, d).T @ U.reshape(-1, d))
        for pair_S in () if squares else m.moment_blocks:  # T_s D P_s = n S_s M S_s D S_s
            # The outer products as two GEMMs over the block ([S_1; ...; S_b] stacked, and its
            # transpose [S_1 ... S_b] since each S_s is symmetric), the middle one batched.
            S = pair_S.float64(work_array(work, "S64", pair_S.hi.shape))
            stacked = S.reshape(-1, d)
            U = np.matmul(stacked, D.T, out=work_array(work, "U", S.shape).reshape(-1, d))
            R = np.matmul(S, U.reshape(S.shape).transpose(0, 2, 1),
                          out=work_array(work, "R", S.shape))  # S_s D S_s
            if VtV is not None:
                R = np.matmul(VtV, R, out=work_array(work, "U", S.shape))
            out += n * (stacked.T @ R.reshape(-1, d))
        for X, _, weights, queries in self.passes(A):
            # sum_i S_i M S_i D x_i x_iᵀ over the kept sequences
            R = apply_moments(X, X @ D.T, weights, m.centred)
            if not m.value_is_identity:
                R = R @ (m.V.T @ m.V)
            R = apply_moments(X, R, weights, m.centred)
            if queries is not None:
                R = R * queries
            out += R.reshape(-1, d).T @ X.reshape(-1, d)
        return out

    def single_blocks(self):
        """The float32 ``(S, T or None)`` of every kept block (their pairs' ``hi``, no copy)."""
        m = self.moments
        squares = m.square_blocks or [None] * len(m.moment_blocks)
        return [(S.hi, None if T is None else T.hi)
                for S, T in zip(m.moment_blocks, squares, strict=True)]

    def apply_single(self, D):
        """``G vec(D)`` with float32 products over the float32 kept ``S_s`` (and ``T_s`` where
        kept), summed in float64 over the blocks: the products of :meth:`apply` at about 1e-7
        relative error, in about half its time."""
        m, work = self.moments, self.work
        if self.singles is None:
            self.singles = self.single_blocks()
        out = np.zeros_like(D)
        d, single = D.shape[0], D.astype(np.float32)
        VtV = None if m.value_is_identity else (m.V.T @ m.V).astype(np.float32)
        for S, T in self.singles:
            U = work_array(work, "U32", S.shape, np.float32)
            if T is not None:  # n T_s (D S_s)
                np.matmul(single, S, out=U)
                out += T.reshape(-1, d).T @ U.reshape(-1, d)
                continue
            stacked = S.reshape(-1, d)  # n S_s M (S_s D S_s), as in apply
            np.matmul(stacked, single.T, out=U.reshape(-1, d))
            R = np.matmul(S, U.transpose(0, 2, 1), out=work_array(work, "R32", S.shape,
                                                                   np.float32))
            if VtV is not None:
                R = np.matmul(VtV, R, out=U)
            out += stacked.T @ R.reshape(-1, d)
        return m.n_tokens * out


def _preconditioner(moments, T_sum):
    """``(T ⊗ P / n_queries)^{-1}``: the Kronecker product of the means, inverted."""
    Tinv = np.linalg.pinv(T_sum, hermitian=True)
    Pinv = np.linalg.pinv(moments.P_sum, hermitian=True)
    N = moments.n_queries
    return lambda R: N * (Tinv @ R @ Pinv)


# --- the solvers of the linear(ised) least squares -----------------------------------------

class _Solution(NamedTuple):
    """A solve of ``G vec(A) = b``: the kernel ``A``, the solver's name as reported, the
    products of ``G`` in float64 and in float32, and ``G``'s Cholesky factor (dense only)."""

    A: object
    solver: str
    n_products: int = 0
    n_single_products: int = 0
    factor: object = None


def _solve_cholesky(moments, operator, tol):
    """``G`` unpacked from ``C`` and factorised (``G`` is positive definite whenever the data
    determine the kernel); the minimum-norm least squares where it is not."""
    d = moments.rhs.shape[0]
    G = normal_matrix(moments)
    try:
        factor = scipy.linalg.cho_factor(G, lower=True, check_finite=False)
        A = scipy.linalg.cho_solve(factor, moments.rhs.ravel(), check_finite=False)
        if np.all(np.isfinite(A)):
            # the factor is reused for the noise along directions near the cut
            return _Solution(A.reshape(d, d), "dense", factor=factor)
    except np.linalg.LinAlgError:
        pass
    A = np.linalg.lstsq(G, moments.rhs.ravel(), rcond=None)[0].reshape(d, d)
    return _Solution(A, "dense")


def _solve_compressed_cg(moments, operator, tol, max_iter=500):
    """Conjugate gradients on products with the compressed ``C`` (to ``tol``, ``1e-10`` by
    default)."""
    index = _compressed_index(moments)
    A, _, products = conjugate_gradients(
        lambda A: compressed_product(moments, A, index), moments.rhs,
        _preconditioner(moments, moments.T_sum), 1e-10 if tol is None else tol, max_iter)
    return _Solution(A, "cg", products)


def _noise_reached(moments, A, rz, fraction=1e-2):
    """Whether the error of the conjugate-gradient iterate ``A`` is below ``fraction`` of
    the noise: its squared ``G``-norm (about ``rz``) under ``fraction^2`` times the noise
    energy ``sigma^2 d^2`` of the least squares, with ``sigma^2`` from the residual of
    ``A`` (``||y||^2 - bᵀ vec(A)``, exact at the solution)."""
    d = A.shape[0]
    dof = max(moments.n_queries * moments.n_targets - d * d, 1)
    noise = max(moments.y_energy - float(np.sum(moments.rhs * A)), 0.0) / dof
    return rz <= fraction**2 * noise * d * d


def _matrix_free_stop(moments, tol):
    """The relative residual and extra stop of the matrix-free solves: ``tol`` alone when
    given, else ``1e-9`` or the error below 1% of the noise (:func:`_noise_reached`)."""
    if tol is not None:
        return tol, None
    return 1e-9, lambda A, rz: _noise_reached(moments, A, rz)


def _solve_matrix_free_cg(moments, operator, tol, max_iter=1000):
    """Conjugate gradients on the float64 products of the kept sequences or moments."""
    moments.consolidate()
    tol_cg, enough = _matrix_free_stop(moments, tol)
    A, _, products = conjugate_gradients(operator.apply, moments.rhs,
                                         _preconditioner(moments, moments.T_sum), tol_cg,
                                         max_iter, enough=enough)
    return _Solution(A, "cg", products)


def _solve_refined_cg(moments, operator, tol, max_iter=1000):
    """Conjugate gradients on float32 products over the kept moments' float32 parts, their
    residuals and stops in float64 (iterative refinement): the float64 solution."""
    moments.consolidate()
    tol_cg, enough = _matrix_free_stop(moments, tol)
    operator.singles = operator.single_blocks()
    A, _, products, singles = refined_conjugate_gradients(
        operator.apply, operator.apply_single, moments.rhs,
        _preconditioner(moments, moments.T_sum), tol_cg, max_iter, enough=enough)
    return _Solution(A, "cg", products, singles)


_SOLVERS = {"cholesky": _solve_cholesky, "compressed_cg": _solve_compressed_cg,
            "matrix_free_cg": _solve_matrix_free_cg, "refined_cg": _solve_refined_cg}


def _choose_solver(moments, dense_limit):
    """The solver of :data:`_SOLVERS` for what ``moments`` hold."""
    d = moments.rhs.shape[0]
    if moments.C is not None:
        return "cholesky" if d * d <= dense_limit else "compressed_cg"
    # float32 products over the kept moments alone; not with kept sequences beside them
    # (padded chunks among unpadded ones), which they would miss
    return "refined_cg" if moments.moment_blocks and not moments.blocks else "matrix_free_cg"


# --- the softmax model -----------------------------------------------------------------------

def _softmax_residuals(moments, operator, A):
    """Residual energy of the softmax model at ``A``, its gradient side ``b`` (the
    ``J_Aᵀ r``) and ``sum_i T_i`` at ``A``."""
    d = A.shape[0]
    loss, rhs, T_sum = 0.0, np.zeros_like(A), np.zeros_like(A)
    VtV = moments.V.T @ moments.V
    for X, Y, weights, queries in operator.passes(A):
        # r_i = y_i - V sum_j a_ij x_j
        residual = Y - (weights @ X) @ moments.V.T
        if queries is not None:
            residual = residual * queries
        loss += float(np.sum(residual**2))
        R = apply_moments(X, residual @ moments.V, weights, True)
        rhs += R.reshape(-1, d).T @ X.reshape(-1, d)
        T_sum += moment_products(X, weights, VtV, True)
    return loss, rhs, T_sum


def _gauss_newton(moments, operator, A, span=None, max_steps=30, max_products=100,
                  fraction=1e-2):
    """Least squares of the softmax model from the linearised ``A``: Levenberg–Marquardt
    steps, each solved by preconditioned conjugate gradients.

    The Gauss–Newton matrix ``Jᵀ J`` is singular along kernels the tokens and the value
    map do not determine (few keys per query, ``rank V < d``), and ill-conditioned near
    them, so plain Gauss–Newton steps neither converge in a bounded number of products
    nor stay bounded. Each step solves ``(Jᵀ J + lambda D) step = Jᵀ r`` with ``D`` the
    Kronecker metric ``T ⊗ P / N`` of the preconditioner: the preconditioned operator's
    eigenvalues lie above ``lambda``, and ``lambda`` follows the gain ratio of the steps
    (Nielsen's rule, Madsen, Nielsen & Tingleff 2004, sect. 3.2).

    Stops (converged) when the decrease the Gauss–Newton model still offers, ``gᵀ M g``
    (``g = Jᵀ r``, ``M`` the preconditioner; about the squared ``G``-norm of the kernel's
    error), is below ``fraction^2`` times the noise energy of the least squares, ``sigma^2
    k^2`` (``k^2`` entries on the tokens' span, ``sigma^2`` from the residual), as for the
    linearised solve; or at float64 resolution, where a noise-free fit ends (its residual
    is rounding, and a relative test on it would never pass). Otherwise after
    ``max_steps`` steps of at most ``max_products`` products each (not converged).

    Returns the kernel, its residual energy, ``sum_i T_i`` at it, whether the steps
    converged, the steps taken and the products of the normal operator.
    """
    loss, rhs, T_sum = _softmax_residuals(moments, operator, A)
    # The decrease left below which the kernel's error is rounding: its relative size
    # 1e3 eps (the residual, which sets the noise level, is floored far above, at 64 eps).
    floor = (1e3 * np.finfo(float).eps) ** 2 * moments.y_energy
    N, P_sum = moments.n_queries, moments.P_sum
    k2 = moments.rhs.size if span is None else round(np.trace(span)) ** 2
    tol = fraction**2 * k2 / max(N * moments.n_targets - k2, 1)
    damping, growth = 1e-3, 2.0
    converged, steps, products = False, 0, 0
    while steps < max_steps:
        precondition = _preconditioner(moments, T_sum)
        if float(np.sum(rhs * precondition(rhs))) <= max(tol * loss, floor):
            converged = True
            break
        steps += 1

        def metric(D, T_sum=T_sum):
            return T_sum @ D @ P_sum / N

        def apply(D, A=A, damping=damping, metric=metric):
            return operator.apply(D, A) + damping * metric(D)

        step, _, used = conjugate_gradients(apply, rhs, precondition, 1e-4, max_products)
        products += used
        if span is not None:
            step = span @ step @ span
        # The decrease the damped linear model predicts: gᵀ step + lambda stepᵀ D step.
        predicted = float(np.sum(rhs * step) + damping * np.sum(step * metric(step)))
        with np.errstate(over="ignore", invalid="ignore"):
            new = _softmax_residuals(moments, operator, A + step)
        gain = (loss - new[0]) / predicted if predicted > 0 else -1.0
        if np.isfinite(new[0]) and gain > 0:
            A = A + step
            loss, rhs, T_sum = new
            damping *= max(1 / 3, 1 - (2 * gain - 1) ** 3)
            growth = 2.0
        else:
            damping *= growth
            growth *= 2
    operator.weights_cache = None
    return A, loss, T_sum, converged, steps, products


# --- the noise along a direction of the whitened kernel --------------------------------------

def _direction_noise(moments, operator, factor, whitened_direction, T_root, P_root, A,
                     tol=1e-4):
    """The noise variance along a direction of the whitened kernel, relative to the
    ``sigma^2`` the Kronecker whitening assumes: ``vec(B)ᵀ G^{-1} vec(B) / N`` with
    ``B = T^{1/2} Z P^{1/2}`` (``Z`` of unit norm; ``A``: the Gauss–Newton point, or
    ``None``; ``factor``: the Cholesky factor of ``G``, or ``None``). One conjugate-gradient
    solve where ``G`` is not factorised."""
    B = T_root @ whitened_direction @ P_root
    if A is None and factor is not None:
        solution = scipy.linalg.cho_solve(factor, B.ravel(), check_finite=False)
        return float(B.ravel() @ solution) / moments.n_queries
    if A is None and moments.C is not None:
        index = _compressed_index(moments)
        apply = lambda Z: compressed_product(moments, Z, index)  # noqa: E731
        T_sum = moments.T_sum
    else:
        apply = lambda Z: operator.apply(Z, A)  # noqa: E731
        T_sum = T_root @ T_root
    if A is None and operator.singles:
        # float32 products (1e-7 relative) are far below the stop's 1e-4 relative error
        apply = operator.apply_single
    # The CG iterate Z underestimates Bᵀ G^{-1} B by the error's squared G-norm rᵀ G^{-1} r,
    # which exceeds rz = rᵀ M r by at most the largest noise ratio: about 1 for linear
    # attention (0.98-1.17 measured: Gaussian, causal, vocabulary tokens), 1.2-3.4 for the
    # softmax fit on clean tokens and up to 2e4 saturated (A given). Stopped
    # when rz is below 1e-3 of the estimate over that ratio (a cut off by < 0.1%), or at the
    # residual tol.
    fraction = 1e-4 if A is None else 1e-7
    solution, _, _ = conjugate_gradients(
        apply, B, _preconditioner(moments, T_sum), tol, 300,
        enough=lambda Z, rz: rz <= fraction * float(np.sum(B * Z)))
    return float(np.sum(B * solution)) / moments.n_queries


# --- the dispatcher --------------------------------------------------------------------------

def solve_kernel(moments, dense_limit=4096, tol=None):
    """Least-squares kernel of ``moments`` and its noise-whitened spectrum.

    With the dense statistics and up to ``dense_limit`` unknowns the normal matrix is
    factorised directly; beyond, conjugate gradients run on the compressed statistics, or,
    for the matrix-free statistics, on the kept sequences: to the relative residual ``tol``
    when given (``1e-13`` agrees with the dense solve to about ``1e-10``), by default until
    the error is below 1% of the noise of the least squares (in the ``G``-norm), which no
    rank reading can tell apart from the exact solve. For softmax with the sequences kept,
    Gauss–Newton steps then fit the softmax model itself.

    The noise of ``Â`` has covariance ``sigma^2 G^{-1}``. Approximating ``G`` by the
    Kronecker product of the means, ``N T̄ ⊗ P̄`` over the ``N`` queries, the kernel
    ``T̄^{1/2} Â P̄^{1/2} sqrt(N)`` carries i.i.d. noise of variance ``sigma^2``.

    Returns the fit, a Bunch of the keys listed in :meth:`._kernel_moments.KernelMoments.solve`
    but the rank's (``threshold``, ``rank``, ``kronecker_rank``, ``local_noise``), with
    ``refined`` besides (whether Gauss–Newton steps fitted the softmax model); and
    ``direction_noise(k)``, the noise variance along the ``k``-th singular direction of the
    whitened kernel relative to ``sigma^2`` (one more solve with the same normal operator).
    """
    if moments.n_sequences == 0:
        raise ValueError("No sequences were added.")
    d, N = moments.rhs.shape[0], moments.n_queries
    operator = NormalOperator(moments)
    solution = _SOLVERS[_choose_solver(moments, dense_limit)](moments, operator, tol)
    A, span, k = _on_token_span(solution.A, moments.P_sum)
    # The data give at most n_equations numbers on the k^2 entries of that block: fewer,
    # and the least squares is one of many exact fits (the minimum-norm one), whose rank
    # says nothing of the kernel's; the softmax fit would only fit more of the same.
    identified = moments.n_equations >= k * k
    # Residual sum of squares ||Y||^2 - bᵀ vec(Â) (least squares), floored at float64
    # resolution.
    floor = 64 * np.finfo(float).eps * moments.y_energy
    rss = max(moments.y_energy - moments.rhs.ravel() @ A.ravel(), floor)
    root = _sqrtm_psd(moments.P_sum / N)
    linearised_rms = float(np.linalg.norm(root @ A.T @ root))
    T_sum, converged, weights_at, steps = moments.T_sum, True, None, 0
    products = solution.n_products
    refined = moments.centred and moments.refine and bool(moments.blocks) and identified
    if refined:
        moments.consolidate()
        A, loss, T_sum, converged, steps, used = _gauss_newton(moments, operator, A, span)
        products += used
        rss = max(loss, floor)
        weights_at = A
    # N d_out observations, d^2 parameters (at most n_equations of them determined).
    noise_variance = rss / max(N * moments.n_targets - min(d * d, moments.n_equations), 1)
    T_root, P_root = _sqrtm_psd(T_sum), _sqrtm_psd(moments.P_sum)
    whitened = T_root @ A @ P_root / np.sqrt(N)
    U, s, Vt = np.linalg.svd(whitened)

    def direction_noise(j):
        return _direction_noise(moments, operator, solution.factor, np.outer(U[:, j], Vt[j]),
                                T_root, P_root, weights_at)

    kernel = A.T
    # E[(x_iᵀ W x_j)^2] = ||Σ^{1/2} W Σ^{1/2}||_F^2 for independent tokens of moment Σ.
    return Bunch(kernel=kernel, whitened=whitened, singular_values=s,
                 noise_variance=noise_variance,
                 logit_rms=float(np.linalg.norm(root @ kernel @ root)),
                 linearised_logit_rms=linearised_rms, converged=converged,
                 solver=solution.solver, identified=identified,
                 n_equations=int(moments.n_equations), n_unknowns=k * k,
                 gauss_newton_steps=steps, n_products=int(products),
                 n_single_products=int(solution.n_single_products), refined=refined,
                 exact=identified and (not moments.centred or (refined and converged))
                 ), direction_noise


def _on_token_span(A, P):
    """``A`` restricted to the span of the tokens (second moment ``P``), the projector on
    that span (``None``: every direction) and its dimension ``k``.

    Only the kernel on the span acts (``x_iᵀ A x_j``, ``S_i A x_i``): tokens of a vocabulary
    may span fewer than ``d`` directions, and the rest of ``A`` is not identifiable."""
    span = _token_span(P)
    if span is None:
        return A, None, A.shape[0]
    return span @ A @ span, span, int(round(np.trace(span)))


def _token_span(P, rtol=1e-10):
    """The orthogonal projector on the span of the tokens (second moment ``P``), or ``None``
    when they span every direction."""
    values, vectors = np.linalg.eigh((P + P.T) / 2)
    keep = values > rtol * max(values[-1], 0.0)
    if keep.all() or not keep.any():
        return None
    return vectors[:, keep] @ vectors[:, keep].T


def _sqrtm_psd(M):
    """The symmetric square root of a positive semi-definite ``M`` (negative rounding
    eigenvalues clipped to zero)."""
    evals, evecs = np.linalg.eigh((M + M.T) / 2)
    return (evecs * np.sqrt(np.clip(evals, 0, None))) @ evecs.T
