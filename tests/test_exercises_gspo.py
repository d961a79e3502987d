"""The GSPO chapter's exercise checker accepts correct losses and rejects the usual mistakes with a helpful message."""

import pytest
import torch

from rlbook.exercises.gspo import check_gspo_loss, reference_gspo_loss


def _loop(logp, old_logp, advantages, mask, epsilon, epsilon_high, *, mistake=None):
    """GSPO's loss one completion at a time; ``mistake`` builds one of the usual wrong versions."""
    losses = []
    for i in range(logp.shape[0]):
        n = int(mask[i].sum())
        log_ratio = logp[i, :n] - old_logp[i, :n]
        if mistake == "token":
            ratio = torch.exp(log_ratio)
            clipped = ratio.clamp(1 - epsilon, 1 + epsilon_high)
            losses.append(-torch.minimum(ratio * advantages[i], clipped * advantages[i]).mean())
            continue
        if mistake == "product":
            s = torch.exp(log_ratio.sum())
        elif mistake == "padded":
            s = torch.exp(log_ratio.sum() / logp.shape[1])
        elif mistake == "detached":
            s = torch.exp(log_ratio.mean()).detach()
        else:
            s = torch.exp(log_ratio.mean())
        losses.append(-torch.minimum(s * advantages[i], s.clamp(1 - epsilon, 1 + epsilon_high) * advantages[i]))
    return torch.stack(losses).mean()


def test_accepts_the_reference_and_a_plain_loop(capsys):
    check_gspo_loss(reference_gspo_loss, num_trials=45)
    check_gspo_loss(_loop, num_trials=45)
    assert capsys.readouterr().out.strip() == "ok\nok"


def test_reference_on_the_study_note_example():
    # token ratios [1, 1, 1, 10]: s = 10 ** (1/4) = 1.778, clipped to 1.0004 for A > 0 (erratum E24)
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.0, 1.0, 1.0, 10.0]]))
    loss = reference_gspo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 4))
    assert loss.item() == pytest.approx(-1.0004, rel=1e-6)
    loss = reference_gspo_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 4))
    assert loss.item() == pytest.approx(10 ** 0.25, rel=1e-5)


@pytest.mark.parametrize("mistake, message", [
    ("token", "one ratio per token"),
    ("product", "geometric mean"),
    ("padded", "padded length"),
    ("detached", "what the gradient flows through|no gradient flows"),
])
def test_names_the_usual_mistakes(mistake, message):
    with pytest.raises(AssertionError, match=message):
        check_gspo_loss(lambda *args: _loop(*args, mistake=mistake))


def test_reports_crash_none_and_in_place_changes():
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_gspo_loss(lambda *args: 1 / 0)
    with pytest.raises(AssertionError, match="returned None"):
        check_gspo_loss(lambda *args: None)

    def in_place(logp, old_logp, advantages, mask, epsilon, epsilon_high):
        out = reference_gspo_loss(logp, old_logp, advantages, mask, epsilon, epsilon_high)
        advantages.zero_()
        return out

    with pytest.raises(AssertionError, match="in place"):
        check_gspo_loss(in_place)
