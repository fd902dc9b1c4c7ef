"""The additive moment accumulator of the query–key kernel least squares.

:class:`KernelMoments` adds sequences ``X (b, n, d) -> Y (b, n, d_out)`` of attention with a
known value map ``V`` into the sums the kernel's normal equations need, chunk by chunk
(``update``), and adds the sums of other sequences (``merge``): ``fit``, ``partial_fit`` and
the dask reduction all go through it, and any split of the sequences gives the same sums (to
rounding). What is kept depends on the solver it is made for (``solver=``): the compressed
normal matrix ``C`` for the dense solve, or the sequences (or, for unmasked linear attention,
their moments ``S_s`` and ``T_s``) for the matrix-free one. Solving them is
:mod:`._attention_solver`'s work and reading the rank :mod:`._kernel_rank`'s;
:meth:`KernelMoments.solve` calls both.
"""

import numpy as np
from scipy.linalg import blas

from ._attention_operators import (
    BLOCK_VALUES,
    allowed_keys,
    apply_moments,
    base_weights,
    check_attention_pattern,
    check_lengths,
    moment_products,
    valid_tokens,
    work_array,
)
from ._attention_solver import solve_kernel
from ._kernel_rank import kernel_threshold_rank

__all__ = ["KernelMoments", "qk_kernel_least_squares"]

# Sequences per chunk when accumulating the kernel statistics: the per-sequence moments of a
# chunk take 3 * _CHUNK * d^2 floats (25 MB at d = 128).
_CHUNK = 64


class _Float32Pair:
    """A float64 array ``a`` kept as two float32 arrays, ``hi = float32(a)`` and ``lo =
    float32(a - hi)``: the memory of ``a``, which ``hi + lo`` gives back to ``2^-48`` relative
    (``a - hi`` is exact, and its rounding to float32 errs by ``2^-24`` of it), while ``hi``
    alone is the float32 copy the single-precision products read. Kept moments take this
    form so that a solve needs no float32 copy of them: on a machine (a virtual one above all)
    where first touching fresh memory is slow, making that copy took longer than the products
    it served."""

    __slots__ = ("hi", "lo")

    def __init__(self, hi, lo):
        self.hi, self.lo = hi, lo

    @classmethod
    def split(cls, a, work):
        """The pair of the float64 array ``a`` (``work``: a float64 scratch of its shape),
        a slice of about 1 MB at a time so that ``a`` is read from the cache, not memory."""
        hi, lo = np.empty(a.shape, np.float32), np.empty(a.shape, np.float32)
        step = max(1, (1 << 17) // max(1, a[0].size))
        for start in range(0, len(a), step):
            part = slice(start, start + step)
            hi[part] = a[part]
            lo[part] = np.subtract(a[part], hi[part], out=work[part])
        return cls(hi, lo)

    def __len__(self):
        return len(self.hi)

    def float64(self, out):
        """``hi + lo`` in float64, written into ``out`` (an array of the same shape)."""
        return np.add(self.hi, self.lo, out=out, dtype=np.float64)

    @classmethod
    def concatenate(cls, pairs):
        return cls(np.concatenate([q.hi for q in pairs]), np.concatenate([q.lo for q in pairs]))



class KernelMoments:
    """Sufficient statistics of the query–key kernel least squares, added sequence by sequence.

    With ``A = Wᵀ`` and ``M_i = V S_i`` (``S_i`` the second moment of the keys token ``i``
    may attend to, centred for ``attention="softmax"``), every token obeys ``y_i = M_i A x_i``.
    The normal equations of ``vec(A)`` are ``G vec(A) = b`` with ``G = sum_i T_i ⊗ P_i``,
    ``T_i = S_i Vᵀ V S_i``, ``P_i = x_i x_iᵀ`` and ``b = sum_i vec(S_i Vᵀ y_iᵀ x_i)``.

    What is kept depends on the solver the statistics are made for, chosen by size
    (``solver="auto"``); :mod:`._attention_solver` solves them:

    * ``"dense"``: ``T_i`` and ``P_i`` are symmetric, so ``G[(a, b), (a', b')] =
      C[ab(a, a'), ab(b, b')]`` with ``C = sum_i vech(T_i) vech(P_i)ᵀ``, a ``d(d+1)/2``-square
      matrix accumulated by one GEMM per chunk of sequences (without a mask all the tokens of
      a sequence share ``T_s``: one row per sequence). Memory ``d^4 / 4`` floats, independent of
      the number of sequences; used up to ``d = 48`` without a mask.
    * ``"cg"``: matrix-free conjugate gradients. ``G vec(A)`` is applied through per-sequence
      products (``z_i = A x_i``, then ``S_i z_i``, ``Vᵀ V``, ``S_i`` again and ``sum_i
      (.) x_iᵀ``), ``O(n^2 d + n d^2)`` per sequence with a mask, ``O(n d^2)`` without, and
      preconditioned by the Kronecker product of the means. It keeps the sequences (the data's
      own ``N n d`` floats) and ``O(d^2)`` besides, so any width runs. Without a mask, linear
      attention keeps each sequence's moment ``S_s`` instead when ``d <= n`` (a product: three
      GEMMs of ``N d^3``), and ``T_s`` beside it when ``2 d <= n`` (two GEMMs, still no more
      memory than the sequences). On kept moments the conjugate gradients run their products
      in float32 on the float32 part ``hi`` of each kept pair (:class:`_Float32Pair`: no copy,
      about half the time) and test their stops on float64 residuals (iterative refinement), so
      the solution is that of float64 iterations (see
      :func:`._conjugate_gradients.refined_conjugate_gradients`).

    For softmax the sequences are kept in either case, and the linearised solve is refined by
    Gauss–Newton steps on the softmax model (the same matrix-free products with the fitted
    weights in place of uniform ones).

    A weighted mask (linear, ``mask_normalization``) or a logit bias (softmax,
    ``logit_bias``), see :func:`check_attention_pattern`, replaces the uniform weights over
    the allowed keys by the base weights of :func:`base_weights` (``S_i = sum_j a_ij x_j
    x_jᵀ``, centred under ``softmax(b_i)`` for a bias); both solvers take them as they take
    a 0/1 mask's (``"auto"`` chooses ``"cg"``).

    The sums are additive: :meth:`update` adds sequences and :meth:`merge` the statistics of
    other sequences, in any split. :meth:`solve` solves them and reads the rank.
    """

    def __init__(self, V, attention, scale=1.0, mask=None, solver="auto", refine=True,
                 mask_normalization=None, logit_bias=None):
        self.V = np.asarray(V, dtype=np.float64)
        self.attention = attention
        # X and Y enter divided by this power of two (exact), so that the statistics, cubic and
        # quartic in X, stay finite for extreme data; they are those of the scaled data.
        self.scale = scale
        # None, "causal", an (n, n) array of 0/1 or (linear) of weights, and a logit bias
        # (softmax); checked at the first update (check_attention_pattern). The bias is in
        # the units of the logits, which the power-of-two scaling leaves unchanged.
        self.mask = mask
        self.mask_normalization = mask_normalization
        self.logit_bias = logit_bias
        self.solver = solver
        self.refine = refine
        d = self.V.shape[1]
        self.rows, self.cols = np.triu_indices(d)
        self.C = None
        self.rhs = np.zeros((d, d))
        self.P_sum = np.zeros((d, d))
        self.T_sum = np.zeros((d, d))  # sum over tokens of T_i
        self.y_energy = 0.0
        self.n_sequences = 0
        self.n_queries = 0  # tokens that attend to at least one key
        # Equations the data give on the kernel: query i constrains only ``V S_i A x_i``, at
        # most min(rank V, rank S_i) numbers (rank S_i <= |K_i|, less one when centred).
        self.n_equations = 0
        self.n_tokens = None
        self.n_targets = self.V.shape[0]
        self.blocks = []  # kept sequences: (X, Y or None, valid or None), scaled
        # Without a mask, linear attention's normal operator needs only each sequence's
        # moment S_s (T_s = S_s M S_s, P_s = n S_s): kept instead of X_s when d <= n. When
        # 2 d <= n, T_s is kept beside it (``square_blocks``, block by block), so that a product
        # takes two GEMMs of N d^3 instead of three, in no more memory than the sequences.
        self.moment_blocks = []
        self.square_blocks = []
        self.value_is_identity = (self.V.shape[0] == d and np.array_equal(self.V, np.eye(d)))
        self.value_rank = d if self.value_is_identity else int(np.linalg.matrix_rank(self.V))

    @property
    def centred(self):
        return self.attention == "softmax"

    @property
    def keeps_data(self):
        return self.C is None or (self.centred and self.refine)

    @property
    def _keeps_moments(self):
        return self.C is None and not self.centred and self.V.shape[1] <= self.n_tokens

    @property
    def _keeps_squares(self):
        # S_s and T_s together take 2 d^2 floats a sequence: no more than its n d when 2 d <= n.
        return self._keeps_moments and 2 * self.V.shape[1] <= self.n_tokens

    def _start(self, n_tokens):
        self.n_tokens = n_tokens
        self.pattern = check_attention_pattern(self.mask, n_tokens, self.attention,
                                               self.mask_normalization, self.logit_bias)
        # The allowed keys; all-true where only weights or a bias shape the attention, so
        # that every path below takes the per-token moments of the base weights.
        self.allowed = self.pattern.keys(None, n_tokens)
        self.allowed = None if self.allowed is None else self.allowed[0]
        d = self.V.shape[1]
        solver = self.solver
        if solver == "auto":
            # The dense route's one-off factorisation (d^6 / 3 flops) stays below a few CG
            # passes over the sequences up to d = 48.
            solver = "dense" if (d <= 48 and self.allowed is None) else "cg"
        if solver == "dense":
            m = len(self.rows)
            self.C = np.zeros((m, m))

    def update(self, X, Y, lengths=None):
        """Add sequences ``X (b, n, d)``, ``Y (b, n, d_out)`` (``lengths`` of the padded ones,
        or ``None``); returns ``self``."""
        if self.n_tokens is None:
            self._start(X.shape[1])
        elif X.shape[1] != self.n_tokens:
            raise ValueError(f"All sequences must have {self.n_tokens} tokens. Got {X.shape[1]}.")
        lengths = check_lengths(lengths, X.shape[0], X.shape[1])
        VtV = self.V.T @ self.V
        work = {}  # work arrays of the chunks' statistics, reused from chunk to chunk
        for start in range(0, X.shape[0], _CHUNK):
            Xb, Yb = X[start:start + _CHUNK], Y[start:start + _CHUNK]
            valid = None if lengths is None else valid_tokens(lengths[start:start + _CHUNK],
                                                              X.shape[1])
            allowed = allowed_keys(self.allowed, valid, X.shape[1])
            n, d = X.shape[1], X.shape[2]
            if (allowed is None and not self.centred and (self.C is not None or n >= d)
                    and 2.0**-60 <= self.scale <= 2.0**60):
                # Linear attention's moments of a chunk that is not kept: the statistics of the
                # raw chunk, divided by scale^2 (a power of two, exact), equal those of the
                # scaled one, without its copy; at this scale none can overflow.
                self._add_unmasked(Xb, Yb, VtV, 1.0 / self.scale**2, work)
                self.n_sequences += len(Xb)
                continue
            Xb, Yb = Xb / self.scale, Yb / self.scale  # also a copy that the caller cannot alter
            if allowed is None and self.C is None and n < d:
                # Wide tokens: the products through the n x n token Gram (O(n^2 d)) are
                # cheaper than through the d x d moments (O(d^3)).
                self._add_masked(Xb, Yb, np.ones((1, n, n), dtype=bool), VtV)
            elif allowed is None:
                self._add_unmasked(Xb, Yb, VtV, work=work)
            else:
                self._add_masked(Xb, Yb, allowed, VtV)
            self.n_sequences += len(Xb)
            if self.keeps_data and not (allowed is None and self._keeps_moments):
                self.blocks.append((Xb, Yb if self.centred else None, valid))
        return self

    def _add_unmasked(self, Xb, Yb, VtV, factor=1.0, work=None):
        """``factor``: the statistics' second-order scaling (``1 / scale^2`` for a raw chunk of
        linear attention, whose statistics are all quadratic in the data). ``work``: a dict of
        work arrays reused from chunk to chunk (fresh temporaries of megabytes each cost the
        kernel's page faults, as much as the products themselves)."""
        work = {} if work is None else work
        b, n, d = Xb.shape
        kept = self._keeps_moments  # then S_s is kept, as a float32 pair
        P = np.matmul(Xb.transpose(0, 2, 1), Xb,  # sum_i x_i x_iᵀ
                      out=work_array(work, "P", (b, d, d)))
        if factor != 1.0:
            P *= factor
        self.P_sum += P.sum(axis=0)
        if self.centred:
            # Around uniform weights the output is V x̄ plus a term linear in the centred
            # moment: y_i - V x̄ = V C A x_i.
            means = Xb.mean(axis=1, keepdims=True)
            Yb = Yb - means @ self.V.T
            Xcb = Xb - means
            S = Xcb.transpose(0, 2, 1) @ Xcb / n  # mixing moment of each sequence
        elif kept:
            S = P
            S /= n
        else:
            S = np.divide(P, n, out=work_array(work, "S", (b, d, d)))
        stacked = S.reshape(-1, d)  # [S_1; ...; S_b], and its transpose [S_1 ... S_b]
        if kept:
            self.moment_blocks.append(_Float32Pair.split(S, work_array(work, "S", S.shape)))
        if self.C is None and self.value_is_identity and not self._keeps_squares:
            # sum_s S_s S_s = [S_1; ...; S_b]ᵀ [S_1; ...; S_b]: one GEMM, no T_s kept.
            self.T_sum += n * (stacked.T @ stacked)
        else:
            T = work_array(work, "T", (b, d, d))
            if self.value_is_identity:
                T = np.matmul(S, S, out=T)
            else:
                T = np.matmul(np.matmul(S, VtV, out=work_array(work, "SM", (b, d, d))), S,
                              out=T)
            self.T_sum += n * T.sum(axis=0)
            if self._keeps_squares:
                self.square_blocks.append(_Float32Pair.split(T, work_array(work, "S",
                                                                            T.shape)))
            if self.C is not None:
                _accumulate_outer(self.C, T[:, self.rows, self.cols], P[:, self.rows, self.cols])
        # sum_s b_s = sum_s S_s Vᵀ Y_sᵀ X_s = [S_1 ... S_b] [Vᵀ Y_1ᵀ X_1; ...]: one GEMM.
        YtX = np.matmul(Yb.transpose(0, 2, 1), Xb,
                        out=work_array(work, "YtX", (b, Yb.shape[2], d)))
        if factor != 1.0:
            YtX *= factor
        if not self.value_is_identity:
            YtX = np.matmul(self.V.T, YtX, out=work_array(work, "VtYtX", (b, d, d)))
        self.rhs += stacked.T @ YtX.reshape(-1, d)
        self.y_energy += factor * float(np.vdot(Yb, Yb))
        self.n_queries += b * n
        self.n_equations += b * n * min(self.value_rank, n - self.centred)

    def _add_masked(self, Xb, Yb, allowed, VtV):
        weights, queries = base_weights(self.pattern, allowed)
        queries = np.broadcast_to(queries, Xb.shape[:2])
        Xq = Xb * queries[..., None]  # the queries' x_i; padding rows zero
        if self.centred:
            Yb = Yb - (weights @ Xb) @ self.V.T
        Yb = Yb * queries[..., None]
        R = apply_moments(Xb, Yb @ self.V, weights, self.centred)
        self.rhs += R.reshape(-1, R.shape[2]).T @ Xq.reshape(-1, Xq.shape[2])
        self.P_sum += Xq.reshape(-1, Xq.shape[2]).T @ Xq.reshape(-1, Xq.shape[2])
        self.T_sum += moment_products(Xb, weights, VtV, self.centred)
        self.y_energy += float(np.sum(Yb**2))
        self.n_queries += int(queries.sum())
        counts = np.broadcast_to(allowed.sum(axis=-1), queries.shape)
        self.n_equations += int(np.clip(np.minimum(self.value_rank, counts - self.centred), 0,
                                        None).sum())
        if self.C is not None:
            self._add_dense_per_token(Xb, Xq, weights, VtV)

    def _add_dense_per_token(self, Xb, Xq, weights, VtV):
        """Rows ``vech(T_i)``, ``vech(P_i)`` of every token into ``C`` (a mask: ``T_i`` differs
        from token to token)."""
        n, d = Xb.shape[1], Xb.shape[2]
        weights = np.broadcast_to(weights, (Xb.shape[0], n, n))
        step = max(1, BLOCK_VALUES // (n * d * d))
        for s in range(0, Xb.shape[0], step):
            X, Wt = Xb[s:s + step], weights[s:s + step]
            S = np.einsum("bij,bjk,bjl->bikl", Wt, X, X, optimize=True)
            if self.centred:
                means = Wt @ X
                S -= means[..., :, None] * means[..., None, :]
            T = (S @ VtV @ S).reshape(-1, d, d)
            P = (Xq[s:s + step, :, :, None] * Xq[s:s + step, :, None, :]).reshape(-1, d, d)
            _accumulate_outer(self.C, T[:, self.rows, self.cols], P[:, self.rows, self.cols])

    def merge(self, other):
        """Add the statistics of other sequences, in place; returns ``self``."""
        if other.n_sequences == 0:
            return self
        if other.scale != self.scale:
            raise ValueError("Cannot merge kernel statistics of data scaled differently.")
        if self.n_tokens is not None and other.n_tokens != self.n_tokens:
            raise ValueError(f"All sequences must have {self.n_tokens} tokens. Got "
                             f"{other.n_tokens}.")
        if self.n_tokens is None:
            self._start(other.n_tokens)
        if not _same_pattern(self.pattern, other.pattern):
            raise ValueError("Cannot merge kernel statistics of different attention patterns "
                             "(mask, mask_normalization, logit_bias).")
        if (self.C is None) != (other.C is None):
            raise ValueError("Cannot merge kernel statistics of different solvers.")
        if self.C is not None:
            self.C += other.C
        self.rhs += other.rhs
        self.P_sum += other.P_sum
        self.T_sum += other.T_sum
        self.y_energy += other.y_energy
        self.n_sequences += other.n_sequences
        self.n_queries += other.n_queries
        self.n_equations += other.n_equations
        self.blocks += other.blocks
        self.moment_blocks += other.moment_blocks
        self.square_blocks += other.square_blocks
        return self

    def consolidate(self):
        """Merge the kept chunks (``partial_fit`` may send tiny ones) into blocks of about
        ``BLOCK_VALUES`` floats of per-block temporaries; done once per solve, a group at a
        time, so that at most one block is held twice."""
        n, d = self.n_tokens, self.rhs.shape[0]
        # Sequences per block of moments: blocks of half an update chunk already run the
        # products at full speed, and are left in place (a copy of the kept moments costs
        # about a product, its fresh memory's page faults included).
        step = max(1, min(BLOCK_VALUES // (d * d), _CHUNK // 2))
        if len(self.moment_blocks) > 1 and min(len(S) for S in self.moment_blocks) < step:
            self.moment_blocks = _regroup(self.moment_blocks, step, _Float32Pair.concatenate)
            if self.square_blocks:  # the same sequences per block as the moments
                self.square_blocks = _regroup(self.square_blocks, step,
                                              _Float32Pair.concatenate)
        size = max(1, BLOCK_VALUES // (n * max(n, d, self.n_targets)))
        if len(self.blocks) > 1 and min(len(X) for X, _, _ in self.blocks) < size:
            self.blocks = _regroup(self.blocks, size, _concatenate_blocks)

    def solve(self, dense_limit=4096, tol=None):
        """Least-squares kernel, its noise-whitened spectrum and the threshold rank.

        The kernel and its spectrum are those of
        :func:`._attention_solver.solve_kernel` (the dense normal matrix factorised up to
        ``dense_limit`` unknowns, else conjugate gradients, to the relative residual ``tol``
        when given; Gauss–Newton steps on the softmax model for softmax), the rank that of
        :func:`._kernel_rank.kernel_threshold_rank`: the Gavish–Donoho threshold of the
        noise-whitened kernel, each singular direction near it checked against its own noise.

        Returns a Bunch with ``kernel`` (``W``, for softmax times the factor ``beta /
        sqrt(d)``), ``whitened`` (the noise-whitened kernel), ``singular_values`` (of
        ``whitened``), ``threshold``, ``rank``, ``noise_variance``, ``logit_rms``
        (root-mean-square of the fitted logits ``x_iᵀ W x_j`` over independent tokens, times
        the softmax factor), ``linearised_logit_rms`` (the same for the linearised solve),
        ``kronecker_rank`` (the count above the uncorrected cut), ``local_noise`` (``{k:
        ratio}``: the noise variance along the singular directions near the cut relative to
        the whitening's assumption; the cut of direction ``k`` is scaled by its square
        root),
        ``converged`` (``False`` where the softmax fit did not converge), ``solver``,
        ``identified`` (whether the data give at least as many equations, ``n_equations``,
        as the kernel on the tokens' span has entries, ``n_unknowns``; without, the softmax
        fit is not refined and the rank is not read from the normal matrix), ``refined``
        (whether Gauss–Newton steps fitted the softmax model), ``gauss_newton_steps``,
        ``n_products`` (float64 products of the normal operator by a ``d x d`` matrix in the
        conjugate-gradient solves, dense solves aside), ``n_single_products`` (float32 ones,
        of the refined solve on kept moments) and ``exact``.
        """
        fit, direction_noise = solve_kernel(self, dense_limit=dense_limit, tol=tol)
        fit.update(kernel_threshold_rank(fit, direction_noise))
        return fit


def _same_pattern(a, b):
    """Whether two checked :class:`AttentionPattern` are the same."""
    return a.normalization == b.normalization and all(
        (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
        for x, y in ((a.allowed, b.allowed), (a.weights, b.weights), (a.bias, b.bias)))



def _regroup(blocks, size, concatenate):
    """Consecutive ``blocks`` joined into groups of at least ``size`` sequences, consuming the
    list as it goes (each original is released once its group is joined)."""
    merged, group, count = [], [], 0
    blocks.reverse()
    while blocks:
        block = blocks.pop()
        group.append(block)
        count += len(block[0]) if isinstance(block, tuple) else len(block)
        if count >= size:
            merged.append(group[0] if len(group) == 1 else concatenate(group))
            group, count = [], 0
    if group:
        merged.append(group[0] if len(group) == 1 else concatenate(group))
    return merged


def _concatenate_blocks(group):
    """One kept block ``(X, Y, valid)`` from several."""
    if len(group) == 1:
        return group[0]
    X = np.concatenate([g[0] for g in group])
    Y = None if group[0][1] is None else np.concatenate([g[1] for g in group])
    if all(g[2] is None for g in group):
        return X, Y, None
    valid = np.concatenate([np.ones(g[0].shape[:2], dtype=bool) if g[2] is None else g[2]
                            for g in group])
    return X, Y, valid


def qk_kernel_least_squares(X, Y, V, attention, mask=None, lengths=None,
                            mask_normalization=None, logit_bias=None):
    """Least-squares query–key kernel of attention with a known value map ``V``.

    One pass of :class:`KernelMoments` over all sequences; see :meth:`KernelMoments.solve`.
    """
    return KernelMoments(V, attention, mask=mask, mask_normalization=mask_normalization,
                         logit_bias=logit_bias).update(X, Y, lengths).solve()


def _accumulate_outer(C, A, B):
    """``C += Aᵀ B`` in place, without the ``m x m`` temporary of ``C + A.T @ B``.

    BLAS sees the C-ordered ``C`` as ``Cᵀ`` in Fortran order: ``Cᵀ += Bᵀ A`` is one GEMM with
    ``beta = 1`` on ``C``'s own memory (545 MB at ``d = 128`` that need not be allocated twice).
    """
    if not (C.flags.c_contiguous and C.dtype == np.float64):
        C += A.T @ B
        return
    result = blas.dgemm(1.0, np.ascontiguousarray(B).T, np.ascontiguousarray(A).T, beta=1.0,
                        c=C.T, trans_b=1, overwrite_c=1)
    if not np.shares_memory(result, C):  # BLAS could not work in place: copy back
        C[...] = result.T

