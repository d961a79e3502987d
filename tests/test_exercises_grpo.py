"""The checker of the chapter "GRPO" accepts the reference and the package, and names the typical mistakes."""

import pytest
import torch

from rlbook.exercises import check_grpo_advantages
from rlbook.exercises.grpo import reference_grpo_advantages
from rlbook.objectives import group_advantages


def test_reference_on_the_study_notes_example():
    # [0.2, 0.8, 0.4, 0.6]: mean 0.5, sample std sqrt(0.2/3) = 0.2582, advantages +-1.1619 and +-0.3873 (E8)
    got = reference_grpo_advantages(torch.tensor([0.2, 0.8, 0.4, 0.6]), 4)
    expected = torch.tensor([-0.3, 0.3, -0.1, 0.1]) / (torch.tensor(0.2 / 3).sqrt() + 1e-4)
    assert torch.allclose(got, expected, atol=1e-5)


def test_reference_equals_the_package_and_an_all_equal_group_gives_zeros():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert torch.allclose(reference_grpo_advantages(rewards, 4), group_advantages(rewards, 4), atol=1e-6)
    assert torch.allclose(reference_grpo_advantages(rewards, 4)[4:], torch.zeros(4), atol=0)


def test_checker_accepts_the_reference_and_the_package(capsys):
    check_grpo_advantages(reference_grpo_advantages)
    check_grpo_advantages(lambda r, g: group_advantages(r, g, scale_rewards="group"))
    assert capsys.readouterr().out.split() == ["ok", "ok"]


def test_population_std_is_named():
    def population(rewards, G):
        groups = rewards.view(-1, G)
        return ((groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, unbiased=False, keepdim=True) + 1e-4)).flatten()

    with pytest.raises(AssertionError, match="E8"):
        check_grpo_advantages(population)


def test_missing_epsilon_is_named():
    def no_epsilon(rewards, G):
        groups = rewards.view(-1, G)
        return ((groups - groups.mean(-1, keepdim=True)) / groups.std(-1, keepdim=True)).flatten()

    with pytest.raises(AssertionError, match="E11"):
        check_grpo_advantages(no_epsilon)


def test_group_mean_only_fails_and_a_crash_is_reported():
    with pytest.raises(AssertionError, match="GRPO advantage"):
        check_grpo_advantages(lambda r, G: group_advantages(r, G, scale_rewards="none"))
    with pytest.raises(AssertionError, match="raised ZeroDivisionError"):
        check_grpo_advantages(lambda r, G: 1 / 0)
    with pytest.raises(AssertionError, match="returned None"):
        check_grpo_advantages(lambda r, G: None)


# --- GRPO's loss (the find-the-bug exercise) and the whole step ---------------------------------------------------

from rlbook.exercises.grpo import check_grpo_loss, check_grpo_step, reference_grpo_loss  # noqa: E402


def _loss(bug=None):
    """GRPO's loss from logits, with one of the common bugs planted (None: none)."""
    def loss(logits, ref_logits, tokens, old_logp, rewards, mask, G, temperature, epsilon=0.2, beta=0.04):
        t = 1.0 if bug == "temperature" else temperature
        logp = (logits / t).log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
        ref_logp = (ref_logits / t).log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
        groups = rewards.view(-1, G)
        std = rewards.std() if bug == "batch_std" else groups.std(-1, keepdim=True)
        A = ((groups - groups.mean(-1, keepdim=True)) / (std + 1e-4)).flatten()[:, None]
        ratio = torch.exp(logp - old_logp)
        surrogate = torch.minimum(ratio * A, ratio.clamp(1 - epsilon, 1 + epsilon) * A)
        k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
        per_token = (-surrogate + beta * k3) * mask
        if bug == "beta_twice":
            per_token = per_token + beta * k3 * mask
        if bug == "padding":
            return per_token.mean(-1).mean()
        return (per_token.sum(-1) / mask.sum(-1)).mean()
    return loss


def test_loss_checker_accepts_the_reference_and_a_correct_loss(capsys):
    check_grpo_loss(reference_grpo_loss)
    check_grpo_loss(_loss())
    assert capsys.readouterr().out.split() == ["ok", "ok"]


@pytest.mark.parametrize("bug, named", [("beta_twice", "beta is applied twice"), ("batch_std", "whole batch"),
                                        ("padding", "padding tokens count"), ("temperature", "temperature 1")])
def test_loss_checker_names_each_common_bug(bug, named):
    with pytest.raises(AssertionError, match=named):
        check_grpo_loss(_loss(bug))


def test_loss_checker_refuses_a_detached_loss_and_a_wrong_type():
    with pytest.raises(AssertionError, match="no gradient"):
        check_grpo_loss(lambda *args, **kw: _loss()(*args, **kw).detach())
    with pytest.raises(AssertionError, match="0-dim tensor"):
        check_grpo_loss(lambda *args, **kw: _loss()(*args, **kw).item())


def _step(bug=None):
    """A GRPO step on the package's pieces, with one mistake planted (None: none)."""
    from rlbook.exercises.grpo import reference_grpo_step

    def step(policy, reference, optimizer, ids, attention, mask, old_logp, rewards, G, epsilon=0.2, beta=0.04,
             temperature=1.0, max_grad_norm=1.0):
        if bug is None:
            return reference_grpo_step(policy, reference, optimizer, ids, attention, mask, old_logp, rewards, G,
                                   epsilon, beta, temperature, max_grad_norm)
        if bug == "no_clip":
            return reference_grpo_step(policy, reference, optimizer, ids, attention, mask, old_logp, rewards, G,
                                   epsilon, beta, temperature, 1e12)
        if bug == "no_beta":
            return reference_grpo_step(policy, reference, optimizer, ids, attention, mask, old_logp, rewards, G,
                                   epsilon, 0.0, temperature, max_grad_norm)
        if bug == "no_zero_grad":
            grads = {p: p.grad.clone() for p in policy.parameters() if p.grad is not None}
            original = optimizer.zero_grad
            optimizer.zero_grad = lambda *a, **k: None
            for p, g in grads.items():
                p.grad = g
            try:
                return reference_grpo_step(policy, reference, optimizer, ids, attention, mask, old_logp, rewards, G,
                                       epsilon, beta, temperature, max_grad_norm)
            finally:
                optimizer.zero_grad = original
        raise ValueError(bug)
    return step


def test_step_checker_accepts_the_package_step_and_the_chapters_loop(capsys):
    from minimal_loops import load_minimal_loop

    check_grpo_step(_step())
    check_grpo_step(load_minimal_loop("part4/grpo")["grpo_step"])
    assert capsys.readouterr().out.split() == ["ok", "ok"]


@pytest.mark.parametrize("bug, named", [("no_clip", "clipped at max_grad_norm"), ("no_beta", "the loss itself"),
                                        ("no_zero_grad", "zero_grad")])
def test_step_checker_fails_a_planted_mistake(bug, named):
    with pytest.raises(AssertionError, match=named):
        check_grpo_step(_step(bug))
