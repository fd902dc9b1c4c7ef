"""Test settings shared by the whole suite."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    # The models under test are tiny: one intra-op thread is fastest, and several threads on a
    # shared 2-core machine slow them down by an order of magnitude.
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class WordTokenizer:
    """A stand-in Hugging Face tokenizer: one id per word, right padding."""

    pad_token = "[PAD]"

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size

    def __call__(self, texts, padding=True, truncation=True, max_length=128,
                 return_tensors="pt"):
        import torch

        ids = [[1 + sum(map(ord, w)) % (self.vocab_size - 1) for w in t.split()][:max_length]
               for t in texts]
        n = max(map(len, ids))
        return {"input_ids": torch.tensor([x + [0] * (n - len(x)) for x in ids]),
                "attention_mask": torch.tensor([[1] * len(x) + [0] * (n - len(x))
                                                for x in ids])}


@pytest.fixture(scope="session")
def word_tokenizer():
    """The stand-in tokenizer class, for tests that run tiny Hugging Face models."""
    return WordTokenizer
