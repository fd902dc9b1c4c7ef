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
