"""Tests for rlbook.reward_model: the Bradley–Terry loss, scalar-head scores, training, and the reward_fn adapter."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlbook.lm import build_model
from rlbook.lm.value import build_value_model, token_values
from rlbook.reward_model import (
    RewardModelConfig,
    RewardModelScorer,
    bradley_terry_loss,
    build_reward_model,
    pair_accuracy,
    sequence_scores,
    train_reward_model,
)
from rlbook.rollout import encode_completions
from rlbook.tasks.preferences import PreferencePair

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_bradley_terry_loss_equals_its_formula():
    g = torch.Generator().manual_seed(0)
    chosen, rejected = torch.randn(32, generator=g), torch.randn(32, generator=g)
    expected = -torch.log(torch.sigmoid(chosen - rejected)).mean()
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected.item(), rel=1e-6)
    margin = torch.rand(32, generator=g)
    expected = -F.logsigmoid(chosen - rejected - margin).mean()
    assert bradley_terry_loss(chosen, rejected, margin).item() == pytest.approx(expected.item(), rel=1e-6)
    # the pair's order matters: swapping sides can only be the same at a zero difference
    assert bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.0])) < bradley_terry_loss(torch.tensor([0.0]),
                                                                                             torch.tensor([2.0]))


@pytest.mark.parametrize(
    "chosen, rejected, match",
    [(torch.zeros(3), torch.zeros(4), "must both be"), (torch.zeros(0), torch.zeros(0), "at least one pair"),
     (torch.tensor([float("nan")]), torch.zeros(1), "finite"), (torch.zeros(2, 2), torch.zeros(2, 2), "must both be")],
)
def test_bradley_terry_loss_bad_input(chosen, rejected, match):
    with pytest.raises(ValueError, match=match):
        bradley_terry_loss(chosen, rejected)


def test_score_is_read_at_the_last_real_token_whatever_the_padding(tokenizer):
    model = build_reward_model(build_model("tiny", seed=1), init="random")
    ids, mask, _ = encode_completions(tokenizer, ["1+2=", "33+44="], ["3", "77"])
    scores = sequence_scores(model, ids, mask)
    for row in range(2):  # each row alone, unpadded
        real = mask[row].bool()
        alone = sequence_scores(model, ids[row, real][None], mask[row, real][None])
        assert alone.item() == pytest.approx(scores[row].item(), abs=1e-5)


def test_reward_model_starts_from_the_policy_with_a_zero_head_and_seeds_the_value_model(tokenizer):
    policy = build_model("tiny", seed=2)
    reward_model = build_reward_model(policy)
    ids, mask, completion_mask = encode_completions(tokenizer, ["1+2="], ["3"])
    assert sequence_scores(reward_model, ids, mask).item() == pytest.approx(0.0, abs=1e-12)
    with torch.no_grad():
        reward_model.score.weight.normal_()
    value_model = build_value_model(policy, init="reward_model", reward_model=reward_model)
    # the critic's value at the last token's *prediction* position is the reward model's score of the prefix
    values = token_values(value_model, ids, mask, completion_mask)
    prefix = sequence_scores(reward_model, ids[:, :-1], mask[:, :-1])
    assert values[0, -1].item() == pytest.approx(prefix.item(), abs=1e-5)
    with pytest.raises(ValueError, match="unknown reward-model init"):
        build_reward_model(policy, init="sft")


def test_training_separates_an_easy_preference(tokenizer):
    """Chosen answers end in '1', rejected ones in '0': a few dozen steps learn it on held-out pairs."""
    rng = np.random.default_rng(0)

    def pairs(n):
        out = []
        for _ in range(n):
            stem = "".join(rng.choice(list("23456789"), size=3))
            out.append(PreferencePair(prompt=f"{stem}=", chosen=stem + "1", rejected=stem + "0"))
        return out

    model = build_reward_model(build_model("tiny", seed=0))
    train, test = pairs(256), pairs(64)
    before = pair_accuracy(model, tokenizer, test)
    history = train_reward_model(model, tokenizer, train, test, RewardModelConfig(steps=40, eval_every=20, lr=3e-3))
    assert history.eval_accuracy[-1] >= 0.95 > before
    assert np.mean(history.losses[-5:]) < 0.5 * np.mean(history.losses[:5])
    with pytest.raises(ValueError, match="needs training and test pairs"):
        train_reward_model(model, tokenizer, [], test)


def test_scorer_normalises_clips_and_penalises_missing_eos(tokenizer):
    model = build_reward_model(build_model("tiny", seed=3), init="random")
    with torch.no_grad():
        model.score.weight.mul_(100.0)  # raw scores far outside the clip
    examples = [type("Example", (), {"prompt": "1+2="})()] * 3
    scorer = RewardModelScorer(model, tokenizer, mean=0.0, std=1.0, clip=2.0, missing_eos_penalty=1.0)
    raw = scorer.raw_scores(["1+2="] * 3, ["3", "4", "55"])
    scores = scorer(examples, ["3", "4", "55"], truncated=[False, True, False])
    np.testing.assert_allclose(scores, np.clip(raw, -2, 2) - np.array([0.0, 1.0, 0.0]), rtol=1e-6, atol=1e-6)
    centred = RewardModelScorer(model, tokenizer, mean=raw.mean(), std=raw.std() + 1e-6, clip=None)
    assert abs(centred(examples, ["3", "4", "55"]).mean()) < 1e-6
    with pytest.raises(ValueError, match="std must be positive"):
        RewardModelScorer(model, tokenizer, std=0.0)
