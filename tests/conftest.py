"""Fixtures shared by the test files of the language-model substrate."""

import pytest
import torch

from rlbook.lm import build_tokenizer


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run the tiny models on one intra-op thread (restored afterwards). On a busy 2-core machine a second
    thread makes them slower, not faster (the rollout tests took twice as long with two threads), and one
    thread fixes the order of float reductions, so a run repeats exactly on one machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()
