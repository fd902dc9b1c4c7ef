"""Second moments of (X, Y), accumulated chunk by chunk.

Every static estimator reads the data only through ``n``, the means and the centred
cross-products ``Cxx = X_c^T X_c``, ``Cxy = X_c^T Y_c``, ``Cyy = Y_c^T Y_c``. They add up over
chunks (Chan, Golub & LeVeque's pairwise update), so one accumulator serves ``fit``, chunked
files and distributed reductions alike, with memory independent of the number of samples.
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["Moments", "power_of_two_scale"]

# Rows per chunk are chosen so that one centred chunk stays near this many float64 values.
_CHUNK_VALUES = 1 << 22


def power_of_two_scale(A):
    """The power of two nearest below ``max |A|`` (1 for an empty or zero array).

    Dividing by it is exact, and brings the largest entry into ``[1, 2)``: products of the
    scaled data stay finite even where those of the raw data (``1e200 ** 2``) would not.
    """
    # max(max A, -min A): the largest magnitude without an |A| copy of the data.
    top = float(max(np.max(A), -np.min(A))) if np.size(A) else 0.0
    if not (top > 0 and np.isfinite(top)):
        return 1.0
    # top = m 2^e with m in [0.5, 1): the scale 2^(e-1) is representable at both ends.
    return float(np.ldexp(1.0, int(np.frexp(top)[1]) - 1))


def _scale_into(A, scale, out):
    """``out = A / scale`` for a power of two ``scale``, exactly.

    The product by ``1 / scale`` is the same correctly rounded value as the quotient (both
    round the exact ``A 2^-e`` once) and costs less; the inverse of a subnormal scale
    overflows, so that one is divided by.
    """
    inverse = 1.0 / scale
    if np.isfinite(inverse):
        np.multiply(A, inverse, out=out)
    else:
        np.divide(A, scale, out=out)


@dataclass
class Moments:
    """Count, means and centred cross-products of inputs ``X`` and targets ``Y``.

    With ``center=False`` the means stay zero and the products are raw (no intercept).
    The data enter divided by ``scale_x`` and ``scale_y`` (powers of two: exact), so that
    values near the ends of the float64 range keep finite products; every statistic is then
    that of the scaled data.
    """

    n: int
    mean_x: np.ndarray
    mean_y: np.ndarray
    xx: np.ndarray
    xy: np.ndarray
    yy: np.ndarray
    center: bool = True
    scale_x: float = 1.0
    scale_y: float = 1.0

    @classmethod
    def empty(cls, n_features, n_targets, center=True, scale_x=1.0, scale_y=1.0):
        return cls(
            0,
            np.zeros(n_features),
            np.zeros(n_targets),
            np.zeros((n_features, n_features)),
            np.zeros((n_features, n_targets)),
            np.zeros((n_targets, n_targets)),
            center,
            scale_x,
            scale_y,
        )

    @classmethod
    def from_arrays(cls, X, Y, center=True, scale=False):
        """Moments of 2-D arrays ``X`` (N, p) and ``Y`` (N, q), read in chunks.

        With ``scale=True`` the arrays are scaled by :func:`power_of_two_scale` first.
        """
        scales = (power_of_two_scale(X), power_of_two_scale(Y)) if scale else (1.0, 1.0)
        return cls.empty(X.shape[1], Y.shape[1], center, *scales).update(X, Y)

    def update(self, X, Y):
        """Add the rows of ``X`` and ``Y``, about 4 million values (32 MB) at a time, so that
        the memory needed does not grow with their number; returns ``self``."""
        X, Y = np.asarray(X), np.asarray(Y)
        n_rows, width = X.shape[0], X.shape[1] + Y.shape[1]
        step = max(1, _CHUNK_VALUES // max(width, 1))
        # One scratch buffer for every chunk: a fresh one per chunk costs its page faults.
        buffer = np.empty((min(step, n_rows), width))
        for start in range(0, n_rows, step):
            self._add_chunk(X[start : start + step], Y[start : start + step], buffer)
        return self

    def _add_chunk(self, X, Y, buffer):
        n_b, p = X.shape
        # One symmetric product of the stacked, centred chunk Z = [X_c, Y_c] gives all three
        # blocks at once: Z^T Z = [[Cxx, Cxy], [Cyx, Cyy]] (a rank-k update, the cheapest GEMM).
        Z = buffer[:n_b]
        if self.scale_x == self.scale_y == 1.0:
            np.concatenate([X, Y], axis=1, out=Z)  # also converts the chunk to float64
        else:
            _scale_into(X, self.scale_x, Z[:, :p])
            _scale_into(Y, self.scale_y, Z[:, p:])
        mean = Z.mean(axis=0) if self.center else np.zeros(Z.shape[1])
        if self.center:
            Z -= mean
        G = Z.T @ Z
        other = Moments(n_b, mean[:p], mean[p:], G[:p, :p], G[:p, p:], G[p:, p:], self.center,
                        self.scale_x, self.scale_y)
        self.merge(other)

    def merge(self, other):
        """Combine with the moments of disjoint data, in place; returns ``self``."""
        n_a, n_b = self.n, other.n
        n = n_a + n_b
        if n_b == 0:
            return self
        if (other.scale_x, other.scale_y) != (self.scale_x, self.scale_y):
            raise ValueError("Cannot merge moments of data scaled differently.")
        if self.center and n_a > 0:
            # Centred products of the union add a between-group term n_a n_b / n * d d^T.
            dx = other.mean_x - self.mean_x
            dy = other.mean_y - self.mean_y
            w = n_a * n_b / n
            self.xx += other.xx + w * np.outer(dx, dx)
            self.xy += other.xy + w * np.outer(dx, dy)
            self.yy += other.yy + w * np.outer(dy, dy)
            self.mean_x = self.mean_x + dx * (n_b / n)
            self.mean_y = self.mean_y + dy * (n_b / n)
        else:
            self.xx += other.xx
            self.xy += other.xy
            self.yy += other.yy
            self.mean_x, self.mean_y = other.mean_x.copy(), other.mean_y.copy()
        self.n = n
        return self

    @property
    def dof(self):
        """Degrees of freedom left after the means: ``n - 1`` when centred, else ``n``."""
        return self.n - 1 if self.center else self.n
