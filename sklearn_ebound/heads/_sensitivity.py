"""What a causal language model loses per unit of each head's output error: a Fisher price.

A head's own relative output error (:func:`head_deficiency`) says nothing of what the model
downstream makes of it: errors in an early head pass through every later layer, a head whose
output the model barely reads costs nothing. To second order, changing the output ``o_t`` of
head ``h`` at token ``t`` by ``delta_t`` raises the next-token loss ``L`` (the cross-entropy of
a text, summed over its tokens) by

    Delta L ~ 1/2 sum_t delta_t^T F_t delta_t,     F_t = E[g_t g_t^T],  g_t = dL / d o_t,

the Fisher information of the head's output (the Gauss-Newton curvature of the loss; with the
labels drawn from the model itself, the curvature of the KL divergence of the next-token
distributions to the original's). Taking each ``F_t`` isotropic within the head (its trace
over ``d_h``) and the error spread over the tokens as the output's energy is,

    Delta L_h(r) ~ w_h err_h(r),   w_h = 1/2 E_t ||g_t||^2 E_t ||o_t||^2 / d_h,

per token, with ``err_h(r)`` the head's relative output error of :func:`head_deficiency`
(``||O_h(r) - O_h||^2 / ||O_h||^2``). :func:`head_sensitivity` measures ``E ||g_t||^2`` and
``E ||o_t||^2`` for every head with one forward and one backward pass per batch of text,
through the input of each attention output projection (the heads' outputs side by side);
``plan_ranks(..., allocation="fisher", sensitivity=...)`` spends the rank where the predicted
loss falls fastest.

The second-order price sees only how far a head moves, not where to: a truncation whose error
leans towards what the text wants lowers the loss. Every rank-``r`` form of
:func:`head_deficiency` is a map ``q -> q G_r`` on the head's query (``G_r = A_Q[:, :r]
A_K[:, :r]^T``, :meth:`HeadDeficiencyResult.bases`), so the first-order term of the loss in
the query-key kernel is, per token,

    Delta L_h^(1)(r) = E_t q_t (G_r - I) (dL / d q_t)^T = <M_h, G_r - I>,
    M_h = E_t q_t^T dL / d q_t,

with ``q_t`` the head's query before any rotation: ``(A_Q^T M_h A_K)_kk`` summed over the kept
columns ``k < r``, less ``tr M_h``. :func:`head_sensitivity` measures ``M_h`` in the same
forward and backward passes, on the even and the odd texts apart; measured on text, the term
holds the text's own noise, so :meth:`HeadSensitivityResult.first_order` shrinks it by its
reliability, ``rho = c / (c + s^2 / 2)`` with ``c`` the mean product of the two halves' terms
and ``s^2`` each half's mean square less ``c`` (the split-half reliability of the whole, by
Spearman-Brown). ``plan_ranks(..., allocation="taylor")`` plans on both terms.
"""

from numbers import Integral

import numpy as np

from .._utils.results import ResultTable
from ._head_forms import check_texts, layers_of, model_source
from ._inputs import require, token_batches

__all__ = ["HeadSensitivityResult", "head_sensitivity", "FISHER_LABELS"]

FISHER_LABELS = ("data", "model")


class HeadSensitivityResult(ResultTable):
    """Fisher weights of every head's output; see :func:`head_sensitivity`.

    One row per (layer, head) with columns ``layer``, ``head``, ``fisher`` (``E_t ||dL /
    d o_t||^2``, the mean over the texts' tokens of the squared gradient of the text's
    next-token loss in the head's output), ``energy`` (``E_t ||o_t||^2``) and ``weight``
    (``fisher * energy / (2 d_h)``: the predicted loss increase per token, in nats, per unit
    of the head's relative output error). Metadata (also attributes): ``naming``,
    ``head_dim``, ``labels``, ``n_texts``, ``n_tokens``, ``loss`` (the mean next-token
    cross-entropy on the texts, in nats per token). Not exported: ``query_gradient``,
    ``(2, n_layers, n_heads, d_h, d_h)``, ``M_h = E_t q_t^T dL / d q_t`` on the even and on
    the odd texts, and ``half_tokens``, their token counts (the first-order term).
    """

    def _positions(self, result):
        """``(layer positions, head positions)`` of ``result``'s layers and heads here."""
        if getattr(result, "naming", self.naming) != self.naming:
            raise ValueError(f"The sensitivity is of a {self.naming}-style model, the result "
                             f"of a {result.naming}-style one.")
        layers = list(dict.fromkeys(int(v) for v in self.column("layer")))
        heads = list(dict.fromkeys(int(v) for v in self.column("head")))
        missing = [(la, h) for la in result.layer_indices for h in result.heads
                   if la not in layers or h not in heads]
        if missing:
            raise ValueError(f"`sensitivity` holds no weight for head {missing[0][0]}."
                             f"{missing[0][1]} of the result: measure it on the same model.")
        return ([layers.index(v) for v in result.layer_indices],
                [heads.index(v) for v in result.heads])

    def weights(self, result):
        """``(n_layers, n_heads)`` weights aligned with the layers and heads of ``result``
        (a :class:`HeadDeficiencyResult`); an error if one of its heads was not measured."""
        layers, heads = self._positions(result)
        n_heads = len(dict.fromkeys(int(v) for v in self.column("head")))
        weight = self.column("weight").reshape(-1, n_heads)
        return weight[np.ix_(layers, heads)]

    def _half_terms(self, result, method):
        """The first-order terms ``(2, n_layers, n_heads, d_h + 1)`` of the two halves."""
        if self.labels != "data":
            raise ValueError("The first-order term needs the text's own next tokens: measure "
                             "the sensitivity with labels='data' (with labels drawn from the "
                             "model its expectation is zero).")
        if getattr(self, "query_gradient", None) is None:
            raise ValueError("The sensitivity holds no query gradients (a result read back "
                             "from a file keeps only its rows): measure it again.")
        layers, heads = self._positions(result)
        d_h = self.head_dim
        out = np.zeros((2, len(layers), len(heads), d_h + 1))
        for li, pos in enumerate(layers):
            for hi, (hpos, head) in enumerate(zip(heads, result.heads, strict=True)):
                A_Q, A_K = result.bases(li, head, method)
                M = self.query_gradient[:, pos, hpos]  # (2, d_h, d_h)
                # <M, G_r - I> = sum_{k < r} (A_Q^T M A_K)_kk - tr M
                kept = np.einsum("ik,nij,jk->nk", A_Q, M, A_K)
                cumulative = np.concatenate([np.zeros((2, 1)), np.cumsum(kept, 1)], 1)
                out[:, li, hi] = cumulative - np.trace(M, axis1=1, axis2=2)[:, None]
        return out

    def first_order_reliability(self, result, method="data"):
        """Split-half reliability ``rho`` in [0, 1] of the first-order terms on ``result``.

        ``c = mean(f_even f_odd)`` over every (layer, head, rank), ``s^2 = (mean(f_even^2) +
        mean(f_odd^2)) / 2 - c``; ``rho = c / (c + s^2 / 2)``, the share of the whole text's
        term that another text of its kind would repeat (0 when the halves disagree).
        """
        even, odd = self._half_terms(result, method).reshape(2, -1)
        c = float(np.mean(even * odd))
        noise = max(0.5 * float(np.mean(even ** 2) + np.mean(odd ** 2)) - c, 0.0)
        return 0.0 if c <= 0 else c / (c + noise / 2)

    def first_order(self, result, method="data", *, shrink=True):
        """``(n_layers, n_heads, d_h + 1)``: each head's first-order loss change at each rank.

        ``<M_h, G_r - I>`` (nats per token, see the module docstring) with ``G_r`` the rank-r
        query map of ``result``'s ``method`` forms; ``M_h`` over all the texts, shrunk by
        :meth:`first_order_reliability` unless ``shrink=False``. Zero at full rank.
        """
        halves = self._half_terms(result, method)
        n = np.asarray(self.half_tokens, dtype=float)
        whole = np.tensordot(n / n.sum(), halves, axes=1)
        return whole * (self.first_order_reliability(result, method) if shrink else 1.0)

    def predicted_loss(self, result, plan, method="data", *, first_order=False):
        """The predicted increase of the mean next-token loss (nats per token) of ``plan``.

        The sum over the plan's heads of ``weight x err(rank)`` on ``result``'s curves of
        ``method`` (``plan``: a :func:`plan_ranks` table or ``{(layer, head): rank}``), and
        with ``first_order`` each head's shrunk first-order term (:meth:`first_order`); heads
        the plan leaves out keep their full rank.
        """
        from ._planning import plan_curves

        curves = plan_curves(result, method)
        weights = self.weights(result)
        linear = self.first_order(result, method) if first_order else np.zeros_like(curves)
        ranks = ({(r["layer"], r["head"]): r["rank"] for r in plan.rows}
                 if isinstance(plan, ResultTable) else dict(plan))
        layers = {v: i for i, v in enumerate(result.layer_indices)}
        heads = {v: i for i, v in enumerate(result.heads)}
        total = 0.0
        for (layer, head), rank in ranks.items():
            li, hi = layers[layer], heads[head]
            total += (weights[li, hi] * float(np.nan_to_num(curves[li, hi, int(rank)]))
                      + linear[li, hi, int(rank)])
        return total


def _check_positive(value, name):
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Got {value!r}.")


def _next_token_loss(logits, batch, labels, generator):
    """Summed next-token cross-entropy of a batch (position ``t`` predicts token ``t + 1``).

    ``labels="data"``: the text's own next tokens; ``"model"``: tokens drawn from the model's
    own next-token distribution (the gradient's second moment is then the Fisher of the
    model's predictions). Returns the loss and the number of predicted positions.
    """
    torch = require("torch")
    mask = batch["attention_mask"].bool()
    keep = mask[:, :-1] & mask[:, 1:]
    pred = logits[:, :-1][keep]
    if labels == "data":
        target = batch["input_ids"][:, 1:][keep]
    else:
        with torch.no_grad():
            probs = torch.softmax(pred.detach().double(), -1)
            target = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return torch.nn.functional.cross_entropy(pred, target, reduction="sum"), int(keep.sum())


class _HeadTaps:
    """Within ``with``: each layer's head outputs ``o`` (the input of its attention output
    projection) and queries ``q`` (where the rank-``r`` forms act: after any normalisation,
    before the rotation) tapped on the forward pass, the model's parameters frozen and the
    model in eval mode; all restored on exit.

    Each tap adds a zero ``z`` that requires grad, ``o + z``: after ``backward`` the gradient
    of ``z`` is ``dL / do``, whatever requires grad upstream.
    """

    def __init__(self, model, family, layers):
        self.model, self.family, self.layers = model, family, layers
        self.d_h, n_heads = layers[0].head_dim, layers[0].n_heads
        self.zeros, self.outputs, self.query_zeros, self.queries = {}, {}, {}, {}
        # each head's query entries in its layer's query projection's output
        self.query_slots = [[family.slots(layer, h, int(layer.kv_index[h]))[0]
                             for h in range(n_heads)] for layer in layers]
        self.sites = [family.query_site(layer) for layer in layers]

    def _output_hook(self, li):
        torch = require("torch")

        def hook(module, args):
            # o + z with z = 0: dL/dz is dL/do, whatever requires grad upstream
            z = torch.zeros_like(args[0], requires_grad=True)
            self.zeros[li], self.outputs[li] = z, args[0].detach()
            return (args[0] + z, *args[1:])
        return hook

    def _query_hook(self, li):
        torch = require("torch")

        def hook(module, args, output):
            z = torch.zeros_like(output, requires_grad=True)
            self.query_zeros[li], self.queries[li] = z, output.detach()
            return output + z
        return hook

    def __enter__(self):
        model = self.model
        self.params = list(model.parameters())
        self.flags = [p.requires_grad for p in self.params]
        self.mode = model.training
        self.handles = [model.get_submodule(self.family.output_module(layer))
                        .register_forward_pre_hook(self._output_hook(li))
                        for li, layer in enumerate(self.layers)]
        self.handles += [model.get_submodule(self.sites[li][0]).register_forward_hook(
            self._query_hook(li)) for li in range(len(self.layers))]
        try:
            for p in self.params:
                p.requires_grad_(False)
            model.eval()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        for p, flag in zip(self.params, self.flags, strict=True):
            p.requires_grad_(flag)
        self.model.train(self.mode)
        return False

    def clear(self):
        """Forget the last batch's head outputs."""
        self.zeros.clear()
        self.outputs.clear()

    def head_columns(self, t, li, valid):
        """``(T, n_heads, d_h)``: each head's entries of the query output at the real tokens."""
        torch = require("torch")
        layout = self.sites[li][1]
        if layout == "heads_first":  # (b, n_heads, n, d_h)
            return t.transpose(1, 2)[valid].double()
        if layout == "heads_last":  # (b, n, n_heads, d_h)
            return t[valid].double()
        return torch.stack([t[..., slot.start:slot.start + self.d_h]
                            for slot in self.query_slots[li]], -2)[valid].double()


class _SensitivitySums:
    """The sums over the texts' real tokens of ``||dL / d o_t||^2`` and ``||o_t||^2`` per
    head, and of ``q_t^T dL / d q_t`` per head on the even and the odd texts apart."""

    def __init__(self, n_layers, n_heads, d_h):
        self.n_heads, self.d_h = n_heads, d_h
        self.fisher = np.zeros((n_layers, n_heads))
        self.energy = np.zeros((n_layers, n_heads))
        self.query_gradient = np.zeros((2, n_layers, n_heads, d_h, d_h))  # even, odd texts
        self.half_tokens = np.zeros(2, dtype=int)
        self.n_tokens = 0

    def add(self, taps, valid, first):
        """Add a batch after its backward pass (``valid``: its real tokens; ``first``: the
        position of its first text among all)."""
        torch = require("torch")
        n_heads, d_h = self.n_heads, self.d_h
        # which half each real token's text is in (by the text's position)
        odd = ((first + torch.arange(valid.shape[0])) % 2)[:, None].expand_as(valid)
        odd = odd[valid]
        for li in range(len(self.fisher)):
            g = taps.zeros[li].grad.double().reshape(*valid.shape, n_heads, d_h)[valid]
            o = taps.outputs[li].double().reshape(*valid.shape, n_heads, d_h)[valid]
            self.fisher[li] += (g ** 2).sum((0, 2)).numpy()
            self.energy[li] += (o ** 2).sum((0, 2)).numpy()
            q = taps.head_columns(taps.queries[li], li, valid)
            gq = taps.head_columns(taps.query_zeros[li].grad, li, valid)
            for half in (0, 1):
                keep = odd == half
                self.query_gradient[half, li] += torch.einsum(
                    "thi,thj->hij", q[keep], gq[keep]).numpy()
        for half in (0, 1):
            self.half_tokens[half] += int((odd == half).sum())
        self.n_tokens += int(valid.sum())

    def result(self, family, layers, labels, n_texts, loss):
        """The means per token: ``w_h = 1/2 E ||g||^2 E ||o||^2 / d_h`` and ``M_h`` per half."""
        d_h, n_tokens = self.d_h, self.n_tokens
        fisher, energy = self.fisher / n_tokens, self.energy / n_tokens
        rows = [{"layer": layer.index, "head": h, "fisher": float(fisher[li, h]),
                 "energy": float(energy[li, h]),
                 "weight": float(0.5 * fisher[li, h] * energy[li, h] / d_h)}
                for li, layer in enumerate(layers) for h in range(self.n_heads)]
        result = HeadSensitivityResult(rows, naming=family.name, head_dim=d_h,
                                       labels=labels, n_texts=n_texts, n_tokens=n_tokens,
                                       loss=loss)
        result.query_gradient = self.query_gradient / np.maximum(
            self.half_tokens, 1)[:, None, None, None, None]
        result.half_tokens = self.half_tokens
        return result


def head_sensitivity(model, texts, *, tokenizer=None, labels="data", max_length=64,
                     batch_size=8, random_state=0):
    """Fisher weight of every head's output in a causal language model's next-token loss.

    For each text the model runs forward and back on its next-token cross-entropy (summed
    over the text's tokens); the gradient in each head's output ``o_t`` (the input of the
    attention output projection, split by head) gives ``E_t ||dL / d o_t||^2``, the trace of
    the head's Fisher information per token, and the output itself ``E_t ||o_t||^2``. Their
    product over ``2 d_h`` prices one unit of the head's relative output error in nats per
    token (see the module docstring); :func:`plan_ranks` with ``allocation="fisher"`` plans
    on it. The same passes measure the gradient in each head's query, ``E_t q_t^T dL /
    d q_t``, whose product with a rank-``r`` form's change of the query is the loss's
    first-order change (:meth:`HeadSensitivityResult.first_order`, ``allocation="taylor"``).
    The model's weights are not changed and no gradient is left on them.

    Parameters
    ----------
    model : transformers causal language model or path
        A model with a language-model head (:func:`is_language_model`), or the directory of
        a saved one. An encoder has no next-token loss: plan it with the default
        ``allocation="greedy"``.
    texts : list of str
        Calibration text (not the text the compressed model is evaluated on).
    tokenizer : transformers tokenizer, default=None
        Needed unless ``model`` is a directory holding one.
    labels : {"data", "model"}, default="data"
        The next tokens of the loss: the text's own (the empirical Fisher), or drawn from
        the model's own next-token distributions at each position (the Fisher of its
        predictions, whose quadratic form is the second-order KL divergence to the original).
    max_length : int, default=64
        Tokens per text at most.
    batch_size : int, default=8
        Texts per forward and backward pass.
    random_state : int, default=0
        Seed of the drawn labels (``labels="model"``).

    Returns
    -------
    sensitivity : HeadSensitivityResult

    Examples
    --------
    >>> from sklearn_ebound.heads import head_sensitivity, make_tiny_transformer
    >>> model, tokenizer = make_tiny_transformer("gpt2", n_layers=2)
    >>> sens = head_sensitivity(model, ["one two three four", "five six seven eight"],
    ...                         tokenizer=tokenizer)
    >>> len(sens.rows), bool((sens.column("weight") > 0).all())
    (4, True)
    """
    from ._compression import is_language_model

    torch = require("torch")
    model, tokenizer = model_source(model, tokenizer)
    texts = check_texts(texts, "texts")
    if labels not in FISHER_LABELS:
        raise ValueError(f"`labels` must be one of {list(FISHER_LABELS)}. Got {labels!r}.")
    _check_positive(max_length, "max_length")
    _check_positive(batch_size, "batch_size")
    if not is_language_model(model):
        raise ValueError("head_sensitivity needs a causal language model (a model with a "
                         f"language-model head); got {type(model).__name__}. Plan an encoder "
                         "or a bare decoder with allocation='greedy'.")
    family, layers, _ = layers_of(model)
    sums = _SensitivitySums(len(layers), layers[0].n_heads, layers[0].head_dim)
    generator = torch.Generator().manual_seed(int(random_state))
    total_loss, n_pred, n_seen = 0.0, 0, 0
    # One forward and one backward pass per batch: the taps hold each head's output and query
    # and, after the backward pass, the loss's gradients in them.
    with _HeadTaps(model, family, layers) as taps, torch.enable_grad():
        for batch in token_batches(tokenizer, texts, max_length, batch_size):
            taps.clear()
            loss, n = _next_token_loss(model(**batch).logits, batch, labels, generator)
            valid = batch["attention_mask"].bool()
            first = n_seen
            n_seen += valid.shape[0]
            if n == 0:
                continue
            loss.backward()
            sums.add(taps, valid, first)
            total_loss += float(loss.detach())
            n_pred += n
    if n_pred == 0:
        raise ValueError("`texts` hold no token to predict (each needs at least two tokens).")
    return sums.result(family, layers, labels, len(texts), total_loss / n_pred)
