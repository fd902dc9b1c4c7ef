"""Preconditioned conjugate gradients on matrix unknowns, for symmetric positive (semi)definite
operators given only as products ``D -> G vec(D)``.

:func:`conjugate_gradients` is the textbook preconditioned iteration with an optional extra
stop (``enough``) tested on the iterate; :func:`refined_conjugate_gradients` runs the products
in float32 and the residuals in float64 (iterative refinement), so that its solution is the
float64 one at about half the cost of each product. The attention solver
(:mod:`._attention_solver`) uses both on the normal equations of the query–key kernel.
"""

import numpy as np

__all__ = ["conjugate_gradients", "refined_conjugate_gradients"]


def conjugate_gradients(apply, b, precondition, tol, max_iter, enough=None, zero_start=False):
    """Preconditioned conjugate gradients on ``apply(A) = b`` (matrices); the solution, whether
    the relative residual reached ``tol`` and the number of products ``apply`` taken.
    ``enough(A, rz)``, if given, also stops the iterations (``rz = rᵀ P^{-1} r``, about the
    error's squared ``G``-norm). The iterations start from ``P b`` (one product for its
    residual), or from zero if ``zero_start``."""
    if zero_start:
        A, R, products = np.zeros_like(b), b.copy(), 0
    else:
        A = precondition(b)
        R = b - apply(A)
        products = 1
    Z = precondition(R)
    D = Z.copy()
    rz = np.sum(R * Z)
    b_norm = np.linalg.norm(b)
    for _ in range(max_iter):
        if np.linalg.norm(R) <= tol * b_norm or rz <= 0:
            return A, True, products
        if enough is not None and enough(A, rz):
            return A, True, products
        GD = apply(D)
        products += 1
        curvature = np.sum(D * GD)
        if curvature <= 0:
            break
        step = rz / curvature
        A = A + step * D
        R = R - step * GD
        Z = precondition(R)
        rz_new = np.sum(R * Z)
        D = Z + (rz_new / rz) * D
        rz = rz_new
    return A, bool(np.linalg.norm(R) <= tol * b_norm), products


def refined_conjugate_gradients(apply, apply_single, b, precondition, tol, max_iter,
                                enough=None):
    """Conjugate gradients with products in float32 and residuals in float64 (iterative
    refinement): each round solves ``G C = R`` for the float64 residual ``R = b - G A`` by
    :func:`conjugate_gradients` through ``apply_single`` (float32 products, about 1e-7
    relative error, half the time of float64 ones) to the float32 resolution, ``A += C``, and
    computes the next residual in float64 (one ``apply``). The stops (``tol`` on the relative
    residual, ``enough``) are tested on that float64 residual, so they mean what they mean for
    :func:`conjugate_gradients`; a round that does not reduce the residual tenfold (float32
    too coarse for the operator) hands over to float64 iterations. Returns the solution,
    whether ``tol`` was reached, and the products in float64 and in float32."""
    A, R = np.zeros_like(b), b.copy()
    b_norm = np.linalg.norm(b)
    doubles = singles = 0
    previous = np.inf  # the residual's norm before the last round
    while singles < max_iter:
        r_norm = np.linalg.norm(R)
        rz = np.sum(R * precondition(R))
        if r_norm <= tol * b_norm or rz <= 0 or (enough is not None and enough(A, rz)):
            return A, True, doubles, singles
        if r_norm > 0.1 * previous:
            break  # float32 does not resolve this operator: finish in float64
        previous = r_norm

        def inner_enough(C, rz, A=A):
            return enough is not None and enough(A + C, rz)

        C, _, used = conjugate_gradients(
            apply_single, R, precondition, max(tol * b_norm / r_norm, 1e-5), max_iter - singles,
            enough=inner_enough, zero_start=True)
        singles += used
        A = A + C
        R = b - apply(A)
        doubles += 1

    def rest_enough(C, rz):
        return enough is not None and enough(A + C, rz)

    r_norm = max(np.linalg.norm(R), np.finfo(float).tiny)
    C, reached, used = conjugate_gradients(apply, R, precondition, tol * b_norm / r_norm,
                                           max_iter, enough=rest_enough)
    return A + C, reached, doubles + used, singles

