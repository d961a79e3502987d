"""rlbook.evaluation: k samples per prompt, paired streams, and intervals that agree with scipy's."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.evaluation import PolicyEvaluation, evaluate_policy
from rlbook.rollout import generate_rollouts
from rlbook.stats import (detectable_effect, holm_intervals, mean_interval, paired_difference, paired_t_power,
                          prompt_interval, seeds_needed)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def arithmetic():
    model, tokenizer = load_base_policy("arithmetic")
    task = RECIPES["arithmetic"].make_task()
    examples = task.sample(12, seed=np.random.default_rng(7), split="test")
    return model, tokenizer, task, examples


def test_every_verdict_is_the_tasks_and_the_entropy_is_the_samplers(arithmetic):
    model, tokenizer, task, examples = arithmetic
    result = evaluate_policy(model, tokenizer, task, examples, num_samples=4, max_new_tokens=8, seed=3,
                             prompts_per_batch=5)
    assert result.correct.shape == result.lengths.shape == result.entropy_sum.shape == (12, 4)
    assert result.distinct_correct.shape == (12,)
    # chunk 0 redone by hand with the same stream: the same texts, verdicts, lengths and entropies
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence((3, 0)).generate_state(1)[0]))
    batch = generate_rollouts(model, tokenizer, [e.prompt for e in examples[:5]], num_generations=4,
                              max_new_tokens=8, seed=generator)
    texts = batch.decode_completions(tokenizer)
    repeated = [e for e in examples[:5] for _ in range(4)]
    verdicts = [task.is_correct(e, t, bool(f)) for e, t, f in zip(repeated, texts, batch.truncated.tolist())]
    assert result.correct[:5].ravel().tolist() == verdicts
    assert result.lengths[:5].ravel().tolist() == batch.lengths.tolist()
    np.testing.assert_allclose(result.entropy_sum[:5].ravel(), batch.entropies.sum(-1).numpy(), rtol=1e-6)
    for i in range(5):
        right = {t for t, ok in zip(texts[4 * i:4 * i + 4], verdicts[4 * i:4 * i + 4]) if ok}
        assert result.distinct_correct[i] == len(right)
    # consistency of the summaries
    assert result.pass_at(1) == pytest.approx(result.expected_accuracy())
    assert result.pass_at(4) >= result.pass_at(1)
    assert result.token_entropy() == pytest.approx(result.entropy_sum.sum() / result.lengths.sum())
    assert (result.distinct_correct <= result.correct.sum(1)).all()


def test_the_same_seed_gives_the_same_samples_and_another_seed_others(arithmetic):
    model, tokenizer, task, examples = arithmetic
    runs = [evaluate_policy(model, tokenizer, task, examples, num_samples=4, max_new_tokens=8, seed=s)
            for s in (1, 1, 2)]
    np.testing.assert_array_equal(runs[0].lengths, runs[1].lengths)
    np.testing.assert_array_equal(runs[0].correct, runs[1].correct)
    assert not np.array_equal(runs[0].entropy_sum, runs[2].entropy_sum)
    assert not model.training


def test_summaries_of_a_hand_made_evaluation():
    correct = np.array([[True, False, False, False], [True, True, False, True]])
    lengths = np.array([[4, 10, 12, 14], [6, 8, 20, 10]])
    result = PolicyEvaluation(correct=correct, lengths=lengths, truncated=np.zeros_like(correct),
                              entropy_sum=lengths * 0.5, distinct_correct=np.array([1, 2]))
    assert result.expected_accuracy() == pytest.approx(4 / 8)
    assert result.mean_length("correct") == pytest.approx((4 + 6 + 8 + 10) / 4)
    assert result.mean_length("wrong") == pytest.approx((10 + 12 + 14 + 20) / 4)
    # pass@2: 1 - C(3,2)/C(4,2) = 1/2 for the first prompt, 1 - C(1,2)/C(4,2) = 1 for the second
    assert result.pass_at(2) == pytest.approx(0.75)
    assert result.token_entropy() == pytest.approx(0.5)
    summary = result.summary(ks=(1, 2, 8))
    assert "pass@8" not in summary and summary["pass@2"] == pytest.approx(0.75)
    assert summary["distinct_correct"] == pytest.approx(1.5)
    assert summary["frac_reward_zero_std"] == 0.0  # both prompts have right and wrong samples
    all_same = PolicyEvaluation(correct=np.array([[True] * 4, [False] * 4, [True, False, True, True]]),
                                lengths=np.ones((3, 4)), truncated=np.zeros((3, 4), bool),
                                entropy_sum=np.ones((3, 4)), distinct_correct=np.array([1, 0, 1]))
    assert all_same.frac_reward_zero_std() == pytest.approx(2 / 3)  # all right, and all wrong, count
    with pytest.raises(ValueError, match="which must be one of"):
        result.mean_length("right")


def test_prompt_interval_is_scipys_bootstrap_and_rejects_bad_input():
    values = np.random.default_rng(0).random(200)
    mean, low, high = prompt_interval(values, seed=4)
    expected = stats.bootstrap((values,), np.mean, random_state=np.random.default_rng(4), n_resamples=2000)
    assert low == pytest.approx(expected.confidence_interval.low)
    assert high == pytest.approx(expected.confidence_interval.high)
    assert low < mean < high and mean == pytest.approx(values.mean())
    assert prompt_interval(np.ones(5)) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        prompt_interval(np.array([0.1, np.nan, 0.3]))
    with pytest.raises(ValueError, match="at least 2"):
        prompt_interval(np.array([0.5]))


def test_paired_difference_is_the_t_interval_of_the_per_seed_differences():
    baseline, fix = np.array([0.50, 0.52, 0.47, 0.55, 0.51]), np.array([0.56, 0.55, 0.50, 0.61, 0.53])
    mean, low, high = paired_difference(baseline, fix)
    d = fix - baseline
    expected = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert mean == pytest.approx(d.mean()) and (low, high) == pytest.approx(expected)
    with pytest.raises(ValueError, match="one value per seed"):
        paired_difference(baseline, fix[:4])
    with pytest.raises(ValueError, match="NaN"):
        paired_difference(baseline, np.array([0.5, np.nan, 0.5, 0.5, 0.5]))


def simulated_power(seed_sd, effect, seeds, draws=200_000, seed=0):
    """The share of simulated experiments whose paired t-interval excludes 0 (the definition of power)."""
    d = np.random.default_rng(seed).normal(effect, seed_sd, size=(draws, seeds))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(seeds))
    return float(np.mean(np.abs(t) > stats.t.ppf(0.975, seeds - 1)))


@pytest.mark.parametrize("seeds,effect", [(3, 2.0), (5, 1.0), (8, 0.7)])
def test_paired_t_power_is_what_a_simulation_of_the_t_test_finds(seeds, effect):
    assert paired_t_power(1.0, effect, seeds) == pytest.approx(simulated_power(1.0, effect, seeds), abs=0.005)
    assert paired_t_power(1.0, -effect, seeds) == paired_t_power(1.0, effect, seeds)  # two-sided
    assert paired_t_power(1.0, 0.0, seeds) == pytest.approx(0.05)  # no effect: the test's level


def test_seeds_needed_is_the_fewest_seeds_with_the_power_and_more_than_the_normal_approximation():
    normal = math.ceil((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) ** 2)  # 8 for effect = sd
    needed = seeds_needed(1.0, 1.0)
    assert needed == 10 > normal
    assert paired_t_power(1.0, 1.0, needed) >= 0.8 > paired_t_power(1.0, 1.0, needed - 1)
    assert seeds_needed(0.001, 1.0) == 2
    for bad in ({"seed_sd": 0.0, "effect": 1.0}, {"seed_sd": 1.0, "effect": 0.0},
                {"seed_sd": 1.0, "effect": 1.0, "power": 1.0}):
        with pytest.raises(ValueError):
            seeds_needed(**bad)


def test_detectable_effect_is_the_inverse_of_seeds_needed():
    effect = detectable_effect(0.9, 5)
    assert paired_t_power(0.9, effect, 5) == pytest.approx(0.8, abs=1e-9)
    # five seeds detect about 1.68 sd, not the normal approximation's 1.25 sd
    assert effect / 0.9 == pytest.approx(1.682, abs=1e-3) and effect / 0.9 > 2.8016 / math.sqrt(5)
    effect = detectable_effect(0.23, 8)
    assert seeds_needed(0.23, effect * 1.001) == 8  # eight seeds are just enough for that effect
    for bad in ({"seed_sd": 0.0, "seeds": 5}, {"seed_sd": 1.0, "seeds": 1}, {"seed_sd": 1.0, "seeds": 5, "alpha": 0}):
        with pytest.raises(ValueError):
            detectable_effect(**bad)


def test_bad_arguments_are_clear_errors(arithmetic):
    model, tokenizer, task, examples = arithmetic
    with pytest.raises(ValueError, match="at least one example"):
        evaluate_policy(model, tokenizer, task, [], max_new_tokens=8)
    with pytest.raises(ValueError, match="num_samples"):
        evaluate_policy(model, tokenizer, task, examples, num_samples=0, max_new_tokens=8)


def test_mean_interval_without_spread_is_the_mean_itself():
    assert mean_interval([29.24] * 5) == (29.24, 29.24, 29.24)  # no NaN from a zero standard error
    mean, low, high = mean_interval([1.0, 2.0, 3.0])
    assert low < mean == 2.0 < high


def test_kl_to_base_is_zero_for_the_base_itself_and_the_k1_sum_for_another_policy(arithmetic):
    """The KL to a base policy: 0 (to float32 rounding) when the base is the policy, and per sample the sum over
    the completion's tokens of log pi - log pi_base; every other number is the same with or without a base."""
    import copy

    from rlbook.rollout import sequence_logprobs

    model, tokenizer, task, examples = arithmetic
    plain = evaluate_policy(model, tokenizer, task, examples, num_samples=4, max_new_tokens=8, seed=3)
    same = evaluate_policy(model, tokenizer, task, examples, num_samples=4, max_new_tokens=8, seed=3,
                           base_model=model)
    assert plain.kl_sum is None and "kl_to_base" not in plain.summary()
    np.testing.assert_array_equal(plain.correct, same.correct)
    np.testing.assert_array_equal(plain.lengths, same.lengths)
    assert {k: v for k, v in same.summary().items() if k != "kl_to_base"} == plain.summary()
    assert same.kl_sum.shape == (12, 4) and np.abs(same.kl_sum).max() < 1e-4
    assert same.summary()["kl_to_base"] == pytest.approx(same.kl_sum.mean())
    # another base: a perturbed copy; chunk 0 (all 12 prompts, one chunk) redone by hand
    base = copy.deepcopy(model)
    with torch.no_grad():
        for p in base.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    other = evaluate_policy(model, tokenizer, task, examples, num_samples=4, max_new_tokens=8, seed=3,
                            base_model=base)
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence((3, 0)).generate_state(1)[0]))
    batch = generate_rollouts(model, tokenizer, [e.prompt for e in examples], num_generations=4,
                              max_new_tokens=8, seed=generator)
    mask = batch.completion_mask.float()
    with torch.no_grad():
        logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, mask)
        base_logp = sequence_logprobs(base, batch.input_ids, batch.attention_mask, mask)
    expected = ((logp - base_logp) * mask).sum(-1).numpy().reshape(12, 4)
    np.testing.assert_allclose(other.kl_sum, expected, atol=1e-4)
    assert other.kl_to_base() > 0.01  # a KL is positive in expectation; here clearly so


def test_held_out_evaluation_records_the_kl_to_the_policy_training_started_from():
    """HeldOutEvaluation keeps a frozen copy of the starting policy: kl_to_base is 0 at step 0 and grows as
    the policy moves; kl_to_base=False records no such key."""
    from rlbook.evaluation import HeldOutEvaluation
    from rlbook.experiment import Arm, train_run

    evaluation = HeldOutEvaluation(num_prompts=16, num_samples=2, every=2)
    plain = HeldOutEvaluation(num_prompts=16, num_samples=2, every=2, kl_to_base=False)
    train_run("arithmetic", Arm("grpo", beta=0.0), 0, callbacks=[evaluation, plain], max_steps=4,
              learning_rate=3e-3, per_device_train_batch_size=16)
    kls = [r["kl_to_base"] for r in evaluation.records]
    assert [r["step"] for r in evaluation.records] == [0, 2, 4]
    assert abs(kls[0]) < 1e-4 and kls[-1] > 0.01, kls
    assert all("kl_to_base" not in r for r in plain.records)
    assert [r["expected_accuracy"] for r in plain.records] == [r["expected_accuracy"] for r in evaluation.records]


# --- Holm's correction, with intervals that agree with it -------------------------------------------------------


def test_holm_intervals_agree_with_a_hand_made_holm_procedure():
    rng = np.random.default_rng(0)
    differences = {f"c{i}": rng.normal(shift, 0.05, size=10) for i, shift in enumerate((0.0, 0.02, 0.05, 0.1, -0.08))}
    nulls = {"c2": -0.03}  # a non-inferiority test: "worse by more than 0.03"
    out = holm_intervals(differences, nulls)
    assert list(out) == list(differences)
    # the procedure by hand: p-values from scipy's one-sample t-test, sorted, rejected step by step
    p = {k: stats.ttest_1samp(v, nulls.get(k, 0.0)).pvalue for k, v in differences.items()}
    order, m, rejecting, adjusted = sorted(p, key=p.get), len(p), True, 0.0
    for k, name in enumerate(order):
        rejecting = rejecting and p[name] <= 0.05 / (m - k)
        adjusted = max(adjusted, min(1.0, (m - k) * p[name]))
        assert out[name]["rejected"] == rejecting, name
        assert out[name]["p"] == pytest.approx(p[name], rel=1e-9) and out[name]["adjusted_p"] == pytest.approx(adjusted)
    for name, row in out.items():
        # the interval excludes its null exactly when Holm rejects, and is never narrower than the plain 95 % one
        assert (not row["low"] <= row["null"] <= row["high"]) == row["rejected"], name
        plain = paired_difference(np.zeros(10), differences[name])
        assert row["low"] <= plain[1] + 1e-12 and row["high"] >= plain[2] - 1e-12, name
        assert row["mean"] == pytest.approx(plain[0])
    assert sum(row["rejected"] for row in out.values()) >= 2  # the case is not vacuous


def test_holm_with_one_comparison_is_the_plain_t_interval():
    values = np.array([0.1, 0.3, -0.05, 0.2])
    row = holm_intervals({"a": values})["a"]
    assert (row["mean"], row["low"], row["high"]) == pytest.approx(paired_difference(np.zeros(4), values))
    assert row["level"] == pytest.approx(0.95)


@pytest.mark.parametrize("differences, nulls, match", [
    ({}, None, "at least one comparison"),
    ({"a": [0.1]}, None, "at least 2 paired differences"),
    ({"a": [0.1, float("nan")]}, None, "NaN or infinite"),
    ({"a": [0.1, 0.2]}, {"b": 0.0}, "not in differences"),
])
def test_holm_intervals_name_bad_input(differences, nulls, match):
    with pytest.raises(ValueError, match=match):
        holm_intervals(differences, nulls)
