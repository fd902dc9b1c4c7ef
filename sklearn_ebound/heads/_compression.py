"""The compressed model, and what it keeps of the original's behaviour.

:func:`compress_heads` writes a plan's rank-``r`` query-key pairs into a copy of the model
(every other weight bit-identical); :func:`embedding_fidelity`, :func:`perplexity` and
:func:`compression_frontier` measure it against the original on held-out text.
"""

import copy

import numpy as np

from .._results import ResultTable
from ._head_forms import METHODS, check_texts, layers_of
from ._inputs import require, token_batches
from ._planning import plan_curves, plan_ranks

__all__ = ["compress_heads", "embedding_fidelity", "perplexity", "compression_frontier"]


def _projection_names(naming, attention_module):
    if naming == "bert":
        return attention_module + ".query", attention_module + ".key"
    if naming == "gpt2":
        return attention_module + ".c_attn", attention_module + ".c_attn"
    return attention_module + ".q_proj", attention_module + ".k_proj"


def _write_head(model, naming, layer, head, kv_head, new_q, new_k):
    """Write one head's ``W~_Q'`` and ``W~_K'`` (``(d + 1) x d_h``) into the model in place."""
    torch = require("torch")
    d, d_h = new_q.shape[0] - 1, new_q.shape[1]
    q_name, k_name = _projection_names(naming, layer.attention_module)
    for name, new, index, offset in ((q_name, new_q, head, 0), (k_name, new_k, kv_head, 1)):
        module = model.get_submodule(name)
        weight, bias = module.weight, getattr(module, "bias", None)
        if bias is None and np.any(new[d] != 0):
            raise ValueError(f"`{name}` has no bias but the rank-r form needs one.")
        with torch.no_grad():
            w = torch.as_tensor(new[:d], dtype=weight.dtype)
            b = torch.as_tensor(new[d], dtype=weight.dtype)
            if naming == "gpt2":  # Conv1D (d, 3 d): y = x W + b, [query | key | value]
                cols = slice(offset * d + index * d_h, offset * d + (index + 1) * d_h)
                weight[:, cols] = w
                if bias is not None:
                    bias[cols] = b
            else:  # nn.Linear (n_heads d_h, d)
                rows = slice(index * d_h, (index + 1) * d_h)
                weight[rows] = w.T
                if bias is not None:
                    bias[rows] = b


def compress_heads(model, result, plan, *, method="trained"):
    """A copy of ``model`` whose heads have the query-key ranks of ``plan``.

    Only the query and key projections change: head ``h`` at rank ``r`` gets
    ``W~_Q' = [W_Q'; b_Q']`` and ``W~_K'`` of the same shapes, whose product on ``[x, 1]`` is
    the rank-``r`` form of ``method`` (:meth:`HeadDeficiencyResult.factors`; columns beyond
    ``r`` are zero). Every other weight is the original's, bit for bit. Save it with
    ``save_pretrained``: it is a standard Hugging Face model.

    Parameters
    ----------
    model : transformers model
        The model ``result`` was measured on (its query and key weights unchanged since), or a
        model with the same attention weights (for example the causal-LM class around it).
    result : HeadDeficiencyResult
    plan : ResultTable or mapping
        A :func:`plan_ranks` table, or ``{(layer, head): rank}``.
    method : {"trained", "data", "weight"}, default="trained"
        Whose rank-``r`` forms: ``"trained"`` uses the trained pair where one was trained at
        that rank and the data-aware one elsewhere.

    Returns
    -------
    compressed : transformers model
    """
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {list(METHODS)}. Got {method!r}.")
    ranks = ({(row["layer"], row["head"]): row["rank"] for row in plan.rows}
             if isinstance(plan, ResultTable) else dict(plan))
    naming, layers, _ = layers_of(model)
    if naming != result.naming:
        raise ValueError(f"The model is {naming}-style, the result {result.naming}-style.")
    by_index = {layer.index: layer for layer in layers}
    compressed = copy.deepcopy(model)
    positions = {v: i for i, v in enumerate(result.layer_indices)}
    for (layer_index, head), rank in ranks.items():
        if layer_index not in positions or head not in result.heads:
            raise ValueError(f"The plan's head {layer_index}.{head} is not in the result.")
        if not 0 <= rank <= result.head_dim:
            raise ValueError(f"Rank {rank} of head {layer_index}.{head} is outside [0, "
                             f"{result.head_dim}].")
        li = positions[layer_index]
        layer = by_index[layer_index]
        new_q, new_k = result.factors(li, head, int(rank), method)
        _write_head(compressed, naming, layer, head, int(layer.kv_index[head]), new_q, new_k)
    return compressed


def _embeddings(model, texts, tokenizer, max_length, batch_size):
    torch = require("torch")
    out = []
    model.eval()
    with torch.no_grad():
        for batch in token_batches(tokenizer, texts, max_length, batch_size):
            hidden = model(**batch)[0]  # the last hidden state
            mask = batch["attention_mask"][..., None].to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
            out.append(torch.nn.functional.normalize(pooled.double(), dim=-1).numpy())
    return np.concatenate(out)


def embedding_fidelity(original, compressed, texts, tokenizer, *, max_length=128,
                       batch_size=32):
    """Cosine of the mean-pooled, normalised embeddings of two models, text by text.

    Returns
    -------
    table : ResultTable
        Rows ``text`` (index) and ``cosine``; metadata ``mean_cosine``, ``min_cosine``.
    """
    texts = check_texts(texts, "texts")
    a = _embeddings(original, texts, tokenizer, max_length, batch_size)
    b = _embeddings(compressed, texts, tokenizer, max_length, batch_size)
    cos = np.sum(a * b, axis=1)
    return ResultTable([{"text": i, "cosine": float(c)} for i, c in enumerate(cos)],
                       mean_cosine=float(cos.mean()), min_cosine=float(cos.min()),
                       n_texts=len(texts))


def perplexity(model, texts, tokenizer, *, max_length=128, batch_size=8):
    """Perplexity of a causal language model on ``texts`` (token-weighted, padding excluded)."""
    torch = require("torch")
    texts = check_texts(texts, "texts")
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in token_batches(tokenizer, texts, max_length, batch_size):
            labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            n = int((labels[:, 1:] != -100).sum())
            if n == 0:
                continue
            loss = model(**batch, labels=labels).loss
            total += float(loss) * n
            count += n
    if count == 0:
        raise ValueError("`texts` hold no token to predict (each needs at least two tokens).")
    return float(np.exp(total / count))


def _is_language_model(model):
    getter = getattr(model, "get_output_embeddings", None)
    return getter is not None and getter() is not None


STRATEGIES = {"uniform": ("data", "uniform"), "weight": ("weight", "tolerance"),
              "data": ("data", "tolerance"), "plan": ("trained", "greedy")}


def compression_frontier(model, result, texts, tokenizer, *, budgets=(0.2, 0.3, 0.4, 0.5),
                         strategies=tuple(STRATEGIES), max_length=128, batch_size=32):
    """End-to-end fidelity of compressed models against the budget, for several strategies.

    ``"uniform"``: the same rank for every head (data-aware forms); ``"weight"``: one
    tolerance on the weight-space curves, weight-space forms; ``"data"``: one tolerance on the
    data-aware curves, data-aware forms; ``"plan"``: the package's plan, greedy by marginal
    error on the achievable curves, with the trained pairs where there are any.

    For a sentence-embedding model (no language-model head) the measure is the cosine of
    the mean-pooled normalised embeddings to the original's (mean and min over ``texts``);
    for a causal language model, the perplexity on ``texts``.

    Returns
    -------
    frontier : ResultTable
        Rows ``strategy``, ``budget``, ``budget_used`` and ``mean_cosine``, ``min_cosine`` or
        ``perplexity``; metadata ``measure`` and, for a language model,
        ``perplexity_original``.
    """
    texts = check_texts(texts, "texts")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"`strategies` must be among {list(STRATEGIES)}. Got {unknown}.")
    lm = _is_language_model(model)
    meta = {"measure": "perplexity" if lm else "cosine"}
    reference = None
    if lm:
        meta["perplexity_original"] = perplexity(model, texts, tokenizer, max_length=max_length)
    else:
        reference = _embeddings(model, texts, tokenizer, max_length, batch_size)
    rows = []
    for strategy in strategies:
        method, allocation = STRATEGIES[strategy]
        if np.isnan(plan_curves(result, "data" if method == "trained" else method)).all():
            continue
        for budget in budgets:
            plan = plan_ranks(result, budget=budget, method=method, allocation=allocation)
            compressed = compress_heads(model, result, plan, method=method)
            row = {"strategy": strategy, "budget": float(budget),
                   "budget_used": plan.budget_used}
            if lm:
                row["perplexity"] = perplexity(compressed, texts, tokenizer,
                                               max_length=max_length)
            else:
                cos = np.sum(reference * _embeddings(compressed, texts, tokenizer, max_length,
                                                     batch_size), axis=1)
                row.update(mean_cosine=float(cos.mean()), min_cosine=float(cos.min()))
            rows.append(row)
            del compressed
    return ResultTable(rows, **meta)


