"""The GMPO chapter's exercise checker accepts correct losses and rejects the usual mistakes with a helpful message."""

import math

import pytest
import torch

from rlbook.exercises.gmpo import check_gmpo_loss, reference_gmpo_loss


def _loop(logp, old_logp, advantages, mask, epsilon, epsilon_high, *, mistake=None):
    """GMPO's loss one completion at a time; ``mistake`` builds one of the usual wrong versions."""
    losses = []
    for i in range(logp.shape[0]):
        n, a = int(mask[i].sum()), advantages[i]
        delta = logp[i, :n] - old_logp[i, :n]
        if mistake == "ratio_space":
            clipped = torch.log(torch.exp(delta).clamp(1 - epsilon, 1 + epsilon_high))
        else:
            clipped = delta.clamp(-epsilon, epsilon_high)
        if mistake == "two_sided":
            tilde = clipped
        else:
            tilde = torch.minimum(delta, clipped) if a > 0 else torch.maximum(delta, clipped)
        if mistake == "arithmetic":
            losses.append(-a * torch.exp(tilde).mean())
            continue
        mean = tilde.sum() / (logp.shape[1] if mistake == "padded" else n)
        gm = torch.exp(mean).detach() if mistake == "detached" else torch.exp(mean)
        losses.append(-a * gm)
    return torch.stack(losses).mean()


def test_accepts_the_reference_and_a_plain_loop(capsys):
    check_gmpo_loss(reference_gmpo_loss, num_trials=45)
    check_gmpo_loss(_loop, num_trials=45)
    assert capsys.readouterr().out.strip() == "ok\nok"


def test_reference_on_the_study_note_example():
    # token ratios [1, 1, 1, 10] (errata E18, E19): for A > 0 the outlier is clipped to e^0.4, GM = e^0.1;
    # for A < 0 the clip leaves it alone and the loss is -A * GM = 10 ** (1/4)
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.0, 1.0, 1.0, 10.0]]))
    loss = reference_gmpo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 4))
    assert math.isclose(loss.item(), -math.exp(0.1), rel_tol=1e-6)
    loss = reference_gmpo_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 4))
    assert math.isclose(loss.item(), 10 ** 0.25, rel_tol=1e-5)


@pytest.mark.parametrize("mistake, message", [
    ("arithmetic", "geometric"),
    ("ratio_space", "log space|log-ratio"),
    ("two_sided", "both sides"),
    ("padded", "padded length"),
    ("detached", "what the gradient flows through|no gradient flows"),
])
def test_names_the_usual_mistakes(mistake, message):
    with pytest.raises(AssertionError, match=message):
        check_gmpo_loss(lambda *args: _loop(*args, mistake=mistake))


def test_reports_crash_none_and_in_place_changes():
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_gmpo_loss(lambda *args: 1 / 0)
    with pytest.raises(AssertionError, match="returned None"):
        check_gmpo_loss(lambda *args: None)

    def in_place(logp, old_logp, advantages, mask, epsilon, epsilon_high):
        out = reference_gmpo_loss(logp, old_logp, advantages, mask, epsilon, epsilon_high)
        advantages.zero_()
        return out

    with pytest.raises(AssertionError, match="in place"):
        check_gmpo_loss(in_place)
