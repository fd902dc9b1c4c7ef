"""A tiny randomly initialised transformer and a stand-in tokenizer, for the examples.

The docstring examples of :mod:`sklearn_ebound.heads` run each function on the model of
:func:`make_tiny_transformer`: seconds on a CPU, no download, no tokenizer files.
"""

from numbers import Integral

from ._inputs import require

__all__ = ["make_tiny_transformer"]

_ARCHITECTURES = ("bert", "gpt2")
_VOCABULARY_SIZE = 30


class WordLengthTokenizer:
    """A stand-in Hugging Face tokenizer: one id per word, ``1 + len(word) % (vocab_size -
    1)``, right padding with id 0.

    Called as a Hugging Face tokenizer is (``tokenizer(texts, padding=True, truncation=True,
    max_length=..., return_tensors="pt")``), it returns ``input_ids`` and
    ``attention_mask`` as torch tensors. Its ids say nothing of a word but its length: it
    stands in for a real tokenizer where only the shapes matter.
    """

    pad_token = "[PAD]"

    def __init__(self, vocab_size=_VOCABULARY_SIZE):
        self.vocab_size = vocab_size

    def __call__(self, texts, padding=True, truncation=True, max_length=None,
                 return_tensors="pt"):
        torch = require("torch")
        ids = [[1 + len(w) % (self.vocab_size - 1) for w in text.split()] for text in texts]
        if truncation and max_length is not None:
            ids = [row[:max_length] for row in ids]
        n = max(map(len, ids), default=0)
        return {"input_ids": torch.tensor([row + [0] * (n - len(row)) for row in ids]),
                "attention_mask": torch.tensor([[1] * len(row) + [0] * (n - len(row))
                                                for row in ids])}


def make_tiny_transformer(architecture="bert", *, n_layers=1, random_state=0):
    """A tiny randomly initialised Hugging Face model and a stand-in tokenizer.

    The model has a vocabulary of 30 tokens, width 16 and 2 attention heads of 8 dimensions
    per layer: the functions of :mod:`sklearn_ebound.heads` run on it in seconds, without a
    download. Its weights are random, so what they measure on it says nothing of a
    pretrained model; the docstring examples use it to show the calls and the shapes.

    Parameters
    ----------
    architecture : {"bert", "gpt2"}, default="bert"
        An encoder (``transformers.BertModel``, feed-forward width 16) or a causal language
        model with its head (``transformers.GPT2LMHeadModel``).
    n_layers : int, default=1
        Number of transformer layers.
    random_state : int, default=0
        Seed of the weights. Torch's global random state is left as it was.

    Returns
    -------
    model : transformers.PreTrainedModel
        The model, in evaluation mode.
    tokenizer : callable
        One id per word (``1 + len(word) % 29``, padding id 0), called as a Hugging Face
        tokenizer is; it has a ``pad_token``.

    Examples
    --------
    >>> from sklearn_ebound.heads import head_ranks, make_tiny_transformer
    >>> model, tokenizer = make_tiny_transformer("gpt2", n_layers=2)
    >>> result = head_ranks(model, inputs=["one two three four"], tokenizer=tokenizer)
    >>> result.n_layers, result.n_heads, result.head_dim
    (2, 2, 8)
    """
    if architecture not in _ARCHITECTURES:
        raise ValueError(f"`architecture` must be one of {list(_ARCHITECTURES)}. Got "
                         f"{architecture!r}.")
    if isinstance(n_layers, bool) or not isinstance(n_layers, Integral) or n_layers < 1:
        raise ValueError(f"`n_layers` must be a positive integer. Got {n_layers!r}.")
    if (isinstance(random_state, bool) or not isinstance(random_state, Integral)
            or random_state < 0):
        raise ValueError(f"`random_state` must be an integer >= 0. Got {random_state!r}.")
    torch, transformers = require("torch"), require("transformers")
    if architecture == "bert":
        config = transformers.BertConfig(
            vocab_size=_VOCABULARY_SIZE, hidden_size=16, num_hidden_layers=n_layers,
            num_attention_heads=2, intermediate_size=16)
        model_class = transformers.BertModel
    else:
        # GPT-2's begin and end of text ids (50256) must lie within the small vocabulary
        config = transformers.GPT2Config(vocab_size=_VOCABULARY_SIZE, n_embd=16,
                                         n_layer=n_layers, n_head=2,
                                         bos_token_id=_VOCABULARY_SIZE - 1,
                                         eos_token_id=_VOCABULARY_SIZE - 1)
        model_class = transformers.GPT2LMHeadModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(random_state))
        model = model_class(config)
    return model.eval(), WordLengthTokenizer(_VOCABULARY_SIZE)
