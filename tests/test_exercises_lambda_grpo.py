"""The checker of the chapter "λ-GRPO" accepts the reference and a plain loop, and names the usual mix-ups."""

import math

import pytest
import torch

from rlbook.exercises import check_lambda_grpo_weights
from rlbook.objectives import lambda_grpo_weights


def loop(lengths, num_generations, lam, r):
    """The chapter's formula, one group and one completion at a time."""
    out = []
    values = [float(x) for x in lengths]
    for start in range(0, len(values), num_generations):
        group = values[start : start + num_generations]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))
        g = [max(1 + r * (x - mean) / (std + 1e-4), 1e-3) ** lam for x in group]
        top = max(g)
        e = [math.exp(v - top) for v in g]
        out += [num_generations * v / sum(e) for v in e]
    return torch.tensor(out)


def test_checker_accepts_the_reference_and_a_plain_loop(capsys):
    check_lambda_grpo_weights(lambda_grpo_weights)
    check_lambda_grpo_weights(loop)
    assert capsys.readouterr().out.split() == ["ok", "ok"]


def test_checker_names_the_softmax_weights_and_the_population_std():
    with pytest.raises(AssertionError, match="sum to 1 per group"):
        check_lambda_grpo_weights(lambda lengths, G, lam, r: lambda_grpo_weights(lengths, G, lam, r) / G)

    def population(lengths, G, lam, r):
        groups = lengths.double().view(-1, G)
        z = (groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, unbiased=False, keepdim=True) + 1e-4)
        return G * torch.softmax((1 + r * z).clamp(min=1e-3) ** lam, -1).flatten()

    with pytest.raises(AssertionError, match="population std"):
        check_lambda_grpo_weights(population)


def test_checker_rejects_none_crashes_and_in_place_changes():
    with pytest.raises(AssertionError, match="returned NoneType"):
        check_lambda_grpo_weights(lambda *args: None)
    with pytest.raises(AssertionError, match="raised ZeroDivisionError"):
        check_lambda_grpo_weights(lambda *args: 1 / 0)

    def in_place(lengths, G, lam, r):
        out = lambda_grpo_weights(lengths, G, lam, r)
        lengths += 1
        return out

    with pytest.raises(AssertionError, match="in place"):
        check_lambda_grpo_weights(in_place)
