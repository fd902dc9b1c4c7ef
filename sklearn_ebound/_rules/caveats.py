"""Caveats of the attention readings: where the data strain what the kernel's least squares
or the per-token operator assume, a sentence for the estimator to warn with (``None``
where they do not)."""

__all__ = [
    "short_sequence_caveat",
    "whitening_caveat",
    "identification_caveat",
    "convergence_caveat",
    "logit_caveat",
]


def short_sequence_caveat(n_tokens, tau, own_energy=None):
    """Where the per-token operator's systematic term may pass the energy cap, a caveat.

    A token's own share ``x_i x_iᵀ / n`` of its sequence's moment adds ``V (W + tr(W) I) / n``
    to the operator ``V Wᵀ`` (Gaussian tokens): a full-rank term of relative energy up to
    about ``2 / n^2`` (0.3-1.7 / n^2 measured beyond the planted directions, d = 8, n = 4-32).
    With a mask or weights the share is ``a_ii``, and ``own_energy`` is ``2 E[a_ii^2]``
    (:func:`.._attention_operators.own_share_energy`): under a causal mask the first queries
    see few keys, and the term is far larger than ``2 / n^2``.
    """
    energy = 2 / n_tokens**2 if own_energy is None else own_energy
    if energy <= 1 - tau:
        return None
    what = (f"{n_tokens} tokens per sequence" if own_energy is None else
            f"{n_tokens} tokens per sequence and this mask (queries that see few keys)")
    return (f"With an unknown value map and {what}, the per-token operator carries a "
            f"full-rank systematic term of relative energy up to about 2 E[a_ii^2] = "
            f"{energy:.3g} (a_ii: a token's own share of its attention), more than 1 - tau = "
            f"{1 - tau:.3g}: the rank may be overestimated. Pass the value map, use longer "
            "sequences, or lower tau.")


def whitening_caveat(fit):
    """Where the noise whitening of the kernel alone would have read another rank, a caveat.

    The whitening takes the least squares' normal matrix for a Kronecker product; near the cut
    :meth:`KernelMoments.solve` scales the cut by the noise variance computed from the normal
    matrix itself along each singular direction. Where that correction changes the count the
    rank rests on it, and the caveat says so."""
    kronecker = fit.get("kronecker_rank", fit.rank)
    if kronecker == fit.rank:
        return None
    ratios = ", ".join(f"{v:.2f}" for v in fit.local_noise.values())
    return (f"Near the threshold the noise of the query-key kernel is not what its Kronecker "
            f"whitening assumes (variance ratios {ratios} along the singular directions "
            f"there, as with large logits or few keys per query): corrected, the rank is "
            f"{fit.rank}; uncorrected it would be {kronecker}. Values this close to the cut "
            "make the rank uncertain.")


def identification_caveat(fit):
    """Where the data give fewer equations on the query–key kernel than it has entries, a
    caveat: the least squares is one exact fit among many, and its rank not the kernel's."""
    if fit.get("identified", True):
        return None
    return (f"The sequences give at most {fit.n_equations} equations on the query-key kernel, "
            f"fewer than its {fit.n_unknowns} entries on the span of the tokens (each query "
            "constrains only min(rank of the value map, keys it attends to) numbers): the "
            "kernel is not identified and the rank read from its minimum-norm least squares "
            "may be wrong. Add sequences, use longer ones, or pass a value map of higher rank.")


def convergence_caveat(fit):
    """Where the Gauss–Newton fit of the softmax model stopped before converging, a caveat."""
    if fit.get("converged", True):
        return None
    return (f"The least-squares fit of the softmax model stopped after "
            f"{fit.get('gauss_newton_steps', 0)} Gauss-Newton steps "
            f"({fit.get('n_products', 0)} products of the normal operator) before converging: "
            "the kernel is not the softmax's least squares and the rank may be wrong.")


def logit_caveat(logit_rms, exact=False):
    """Where the fitted softmax logits are too large for its linearisation, a caveat; none
    where the kernel is the converged least squares of the softmax model itself (``exact``)."""
    if exact or logit_rms <= 1:
        return None
    return (f"The fitted attention logits have root-mean-square {logit_rms:.2f} > 1: the "
            "linearisation of the softmax is strained and the rank may be wrong.")
