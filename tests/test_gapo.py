"""GAPO: the encoder reward model is bidirectional, scores with the Trainer's interface, learns in the warm-up,
and one adversarial round updates both players."""

import numpy as np
import pytest
import torch

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.gapo import (
    EncoderScorer,
    GAPOConfig,
    build_encoder_reward_model,
    compact_left,
    encoder_scores,
    fresh_pairs,
    train_gapo,
    warmup_encoder,
)
from rlbook.rollout import encode_completions
from rlbook.tasks.preferences import build_preference_pairs


@pytest.fixture(scope="module")
def base():
    torch.set_num_threads(1)
    policy, tokenizer = load_base_policy("constraint_string")
    return policy, tokenizer, RECIPES["constraint_string"].make_task()


def _hidden(model, ids):
    return model.base_model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_encoder_is_bidirectional_unlike_the_policy(base, arch):
    policy, tokenizer, _ = base
    encoder = build_encoder_reward_model(tokenizer, arch=arch, seed=0)
    a = tokenizer(["len=5 x=2:xxabc"], return_tensors="pt")["input_ids"]
    b = a.clone()
    b[0, -1] = tokenizer.convert_tokens_to_ids("z")  # change only the last token
    with torch.no_grad():
        changed = (_hidden(encoder, a)[0, 1] - _hidden(encoder, b)[0, 1]).abs().max().item()
        causal = (policy.model(input_ids=a).last_hidden_state[0, 1]
                  - policy.model(input_ids=b).last_hidden_state[0, 1]).abs().max().item()
    assert changed > 1e-6  # an earlier position sees the later token
    assert causal < 1e-6  # the causal policy's earlier position does not


def test_compact_left_moves_real_tokens_first():
    ids = torch.tensor([[0, 0, 5, 6, 7, 0], [5, 6, 7, 8, 9, 10]])
    mask = (ids != 0).long()
    got, got_mask = compact_left(ids, mask)
    assert got.tolist() == [[5, 6, 7, 0, 0, 0], [5, 6, 7, 8, 9, 10]]
    assert got_mask.tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]


def test_scorer_interface_and_memory(base):
    _, tokenizer, task = base
    scorer = EncoderScorer(build_encoder_reward_model(tokenizer, size="tiny"), tokenizer)
    examples = task.sample(3, 0)
    scores = scorer(examples, ["abc", "xxabcde", ""], [False, False, True])
    assert scores.shape == (3,) and np.isfinite(scores).all()
    assert len(scorer.seen) == 3 and scorer.seen[1][1] == "xxabcde"
    # padding does not change a row's score (the rows are compacted before the encoder reads them)
    alone = scorer.raw_scores([examples[1].prompt], ["xxabcde"])
    assert np.allclose(alone, scorer.raw_scores([e.prompt for e in examples], ["abc", "xxabcde", ""])[1:2],
                       atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="examples"):
        scorer(examples, ["a"], None)


def test_warmup_raises_held_out_pair_accuracy(base):
    _, tokenizer, task = base
    encoder = build_encoder_reward_model(tokenizer, seed=0)
    train = build_preference_pairs(task, 500, seed=0, split="train")
    test = build_preference_pairs(task, 128, seed=1, split="test")
    before, after = warmup_encoder(encoder, tokenizer, train, test, steps=150, batch_size=64, lr=1e-3)
    assert after > before + 0.1 and after > 0.65


def test_one_adversarial_round_updates_both_players(base):
    policy, tokenizer, task = base
    import copy
    policy = copy.deepcopy(policy)
    config = GAPOConfig(rounds=1, generator_steps=1, encoder_steps=1, warmup_steps=2, num_train_pairs=64,
                        num_test_pairs=32, rl=dict(num_generations=4, per_device_train_batch_size=16,
                                                   max_completion_length=12, eval_size=16))
    policy_before = [p.detach().clone() for p in policy.parameters()]
    encoder = build_encoder_reward_model(tokenizer, seed=0)
    encoder_before = [p.detach().clone() for p in encoder.parameters()]
    calls = []
    out = train_gapo(policy, tokenizer, task, config, encoder=encoder,
                     evaluate=lambda p, e: calls.append((p, e)) or {"mine": len(calls)})
    assert [h["round"] for h in out["history"]] == [0, 1]
    assert [h["mine"] for h in out["history"]] == [1, 2] and calls[0] == (policy, encoder)
    assert not all(torch.allclose(a, b) for a, b in zip(policy_before, policy.parameters()))
    assert not all(torch.allclose(a, b) for a, b in zip(encoder_before, encoder.parameters()))
    assert out["trainer"].value_model is not None and out["trainer"].value_model is not encoder  # E29
    assert out["trainer"].config.beta == pytest.approx(0.01)
    first, last = out["history"]
    assert 0.0 <= last["gold"] <= 1.0 and np.isfinite(last["reward"]) and np.isfinite(last["encoder_loss"])
    # the trainer's KL metric, averaged over the round (round 0 has no samples yet)
    assert first["objective/kl_per_token"] == 0.0 and np.isfinite(last["objective/kl_per_token"])


def test_fresh_pairs_put_the_reference_first_and_skip_copies(base):
    _, _, task = base
    (example,) = task.sample(1, 0)
    reference = task.demonstration(example)
    pairs = fresh_pairs(task, [(example, reference), (example, "zz")])
    assert len(pairs) == 1 and pairs[0].chosen == reference and pairs[0].rejected == "zz"


def test_rule_negatives_never_reject_a_correct_sample(base):
    _, _, task = base
    (example,) = task.sample(1, 0)
    reference = task.demonstration(example)
    other_correct = reference[::-1]  # the same letters in another order satisfy the same counts
    assert other_correct != reference and task.is_correct(example, other_correct)
    wrong = task.near_miss(example, np.random.default_rng(0))
    seen = [(example, reference), (example, other_correct), (example, " " + wrong)]
    gan = fresh_pairs(task, seen)  # every non-reference sample is "fake", the correct one too
    assert [p.rejected for p in gan] == [other_correct, wrong]
    rule = fresh_pairs(task, seen, negatives="rule")
    assert [(p.chosen, p.rejected) for p in rule] == [(reference, wrong)]
    with pytest.raises(ValueError, match="negatives"):
        fresh_pairs(task, seen, negatives="all")


def test_bad_input(base):
    _, tokenizer, task = base
    with pytest.raises(ValueError, match="size"):
        build_encoder_reward_model(tokenizer, size="huge")
    with pytest.raises(ValueError, match="arch"):
        build_encoder_reward_model(tokenizer, arch="gpt")
    with pytest.raises(ValueError, match="fresh_fraction"):
        GAPOConfig(fresh_fraction=1.5)
    with pytest.raises(ValueError, match="rounds"):
        GAPOConfig(rounds=0)
    with pytest.raises(ValueError, match="negatives"):
        GAPOConfig(negatives="everything")
    encoder = build_encoder_reward_model(tokenizer, size="tiny", max_length=8)
    ids, mask, _ = encode_completions(tokenizer, ["len=5 x=2:"], ["xxabc"])
    with pytest.raises(ValueError, match="positions"):
        encoder_scores(encoder, ids, mask)
    with pytest.raises(ValueError, match="pairs"):
        warmup_encoder(encoder, tokenizer, [], [], steps=1)
