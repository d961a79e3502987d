"""Model organisms: small settings where the failure an algorithm was invented against appears under its baseline.

At the book's default scale (short answers, one right answer, 0/1 rewards) most of Part IV's failures do not show,
so each chapter's fix has nothing to fix. An *organism* is a setting built until the failure does show, the way
biologists study a process in the fruit fly: a shipped base policy, a task setting, training settings shared by
every arm, the baseline algorithm and the fixes as arms, and the held-out metric that shows the failure.

Every arm is measured by :class:`rlbook.evaluation.HeldOutEvaluation`: ``num_prompts`` held-out prompts,
``num_samples`` samples each, the same prompts and sampling stream for every arm and seed (paired). Two numbers
summarise an experiment (:func:`phenomenon`):

- the **gate**, ``baseline_change``: the metric's change under the baseline from the first evaluation to the last,
  mean and 95 % t-interval over seeds. The gate *holds* when that interval excludes 0 in the failure's direction:
  the failure appeared.
- ``fix_minus_baseline``: the fix's metric minus the baseline's at the end, over paired seeds (same seed, same
  prompts, same sampling stream), mean and 95 % t-interval.

Designing an organism until its gate holds is legitimate (the failure must exist before a fix can be shown);
measuring the fix is done once, as it comes out.

This module is the registry of experiments (:data:`ORGANISMS`) and the family table's entries (:func:`phenomenon`),
on top of the package: no other module of ``rlbook`` imports it. The readings and gates it uses (``metric_at``,
``baseline_change``, ``gate_holds``, ...) live in :mod:`rlbook.stats` and are re-exported here, their old home.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from rlbook.experiment import Arm
from rlbook.stats import (  # noqa: F401  re-exported: the old home of the gates and readings of stored series
    DIRECTIONS, baseline_change, baseline_level, eval_series, gate_holds, metric_at, metric_at_budget,
    paired_difference)


@dataclass(frozen=True)
class Organism:
    """One organism: what it trains, how it is measured and which way the failure moves the metric.

    Attributes:
        name: e.g. ``"length_inflation"``.
        description: one sentence, the failure and the setting.
        policy: the shipped base policy (:data:`rlbook.checkpoints.RECIPES`) every arm starts from.
        task_kwargs: the task setting on top of the recipe's (e.g. ``{"incorrect_reward": -1.0}``: ±1 rewards).
        settings: trainer settings shared by every arm (completion budget, learning rate, steps, ...).
        arms: ``{name: Arm}``, the baseline first.
        metric: the :meth:`rlbook.evaluation.PolicyEvaluation.summary` key that shows the failure.
        failure: ``"up"`` or ``"down"``, which way the failure moves ``metric`` under the baseline.
        num_prompts, num_samples, eval_every: the held-out evaluation (prompts, samples per prompt, steps between
            evaluations; 0 for only the first and the last).
        eval_at: more steps to evaluate at besides every ``eval_every`` (e.g. densely early in a run that moves
            fast at first).
        failure_threshold: None for a failure that *grows* under the baseline (the gate is the change from the
            first evaluation to the last); a number for a failure that is a *level* present from the start (the
            gate is the metric averaged over the baseline's evaluations, beyond this threshold in the failure's
            direction; e.g. most groups without reward spread: ``frac_reward_zero_std`` above 0.5).
    """

    name: str
    description: str
    policy: str
    task_kwargs: dict
    settings: dict
    arms: dict = field(default_factory=dict)
    metric: str = "expected_accuracy"
    failure: str = "down"
    num_prompts: int = 1024
    num_samples: int = 8
    eval_every: int = 0
    failure_threshold: float | None = None
    eval_at: tuple = ()

    def __post_init__(self):
        if self.failure not in DIRECTIONS:
            raise ValueError(f"failure must be one of {DIRECTIONS}, got {self.failure!r}")
        if not self.arms:
            raise ValueError(f"organism {self.name!r} needs at least one arm (the baseline first)")
        for arm_name, arm in self.arms.items():
            if not isinstance(arm, Arm):
                raise ValueError(f"arm {arm_name!r} of {self.name!r} must be an Arm, got {type(arm).__name__}")

    @property
    def baseline(self) -> str:
        """The baseline arm's name (the first arm)."""
        return next(iter(self.arms))

    def arm(self, name: str) -> Arm:
        """The arm ``name`` with the organism's task setting added to its own."""
        if name not in self.arms:
            raise ValueError(f"organism {self.name!r} has no arm {name!r}; its arms: {list(self.arms)}")
        arm = self.arms[name]
        return Arm(arm.preset, task=arm.task, task_kwargs={**self.task_kwargs, **arm.task_kwargs}, **arm.overrides)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["arms"] = {name: self.arm(name).to_json() for name in self.arms}
        return out


# --- the organisms ------------------------------------------------------------------------------------------------

LONG_CHAIN_PRETRAIN = 20  # value-pretraining rollouts of the long_chain organism's lambda arms
VAPO_ALPHA = 0.5  # VAPO's length-adaptive lambda's alpha rescaled to long_chain's 71-143 tokens
# VAPO's seven techniques, each switched off alone (on top of the rescaled alpha): the long_chain ablations
VAPO_ABLATIONS = {
    "value_pretraining": dict(value_pretrain_steps=0),
    "decoupled_gae": dict(lam_critic=None),  # the critic's targets at the policy's lambda
    "adaptive_lambda": dict(lam_alpha=None),  # lambda 0.95 for every length
    "token_loss": dict(loss_type="grpo"),  # each completion's token mean, then the batch mean
    "clip_higher": dict(epsilon_high=None),  # the symmetric clip 0.2
    "nll": dict(nll_coef=0.0),  # no NLL on the correct completions
    "group_sampling": dict(num_generations=1),  # 64 prompts with one completion each instead of 8 x 8
}

_DAPO_PARTS = dict(dynamic_sampling=False, mask_truncated_completions=False, overlong_buffer_length=None)
# The sampler and the learner disagree (outlier_ratios, sampler_mismatch): a sampler at temperature 1.3 whose
# log-probs the ratio divides by, the learner at 1, four updates per rollout; and the arm's settings that undo it.
_MISMATCH = dict(learning_rate=3e-4, max_steps=200, num_iterations=4, per_device_train_batch_size=64,
                 sampler_temperature=1.3, old_logprobs="sampler")
_MATCHED = dict(sampler_temperature=None, old_logprobs="learner")
# The mixture-of-experts organisms' arms: GRPO with the GSPO paper's clip for it and no KL, GSPO, and the same GRPO
# whose ratio's pi_theta is computed on the experts pi_old chose (Routing Replay)
_GRPO_MOE = dict(beta=0.0, epsilon=0.2, epsilon_high=0.27)
_ROUTING_ARMS = {"grpo": Arm("grpo", **_GRPO_MOE), "gspo": Arm("gspo"),
                 "grpo_routing_replay": Arm("grpo", **_GRPO_MOE, routing_replay=True)}
# ... and their training: 200 steps of 32 x 4 completions, eight updates per rollout (4 minibatches, 2 passes); each
# organism adds its learning rate and its routers' (ten times faster)
_ROUTING_UPDATES = dict(max_steps=200, per_device_train_batch_size=32, steps_per_generation=4, num_iterations=2)
# Many valid answers per prompt, four updates per rollout (entropy_collapse, entropy_methods), and the baseline's
# clip there: DAPO's token-level loss with epsilon 0.2 on both sides, without its length and sampling parts.
_MANY_ANSWERS = dict(learning_rate=3e-4, max_steps=300, num_iterations=4, per_device_train_batch_size=64)
_SYMMETRIC = dict(epsilon_high=0.2, **_DAPO_PARTS)


def _corrected(mode: str, **clip) -> Arm:
    """GRPO with pi_old recomputed by the learner and the sampler-mismatch weight of ``mode`` (TRL's names)."""
    return Arm("grpo", beta=0.0, old_logprobs="learner", vllm_importance_sampling_correction=True,
               vllm_importance_sampling_mode=mode, **{f"vllm_importance_sampling_{k}": v for k, v in clip.items()})


ORGANISMS: dict[str, Organism] = {
    # Dr. GRPO's failure: GRPO's per-completion token mean 1/|o_i| gives each token of a long wrong answer a smaller
    # penalty, so wrong answers drift longer once the budget leaves them room (64 tokens here, 40 in SFT). The ±1
    # rewards follow the paper; GRPO's group z-scores are the same for 0/1 and ±1 rewards (Dr. GRPO's advantages,
    # not divided by the std, double).
    "length_inflation": Organism(
        name="length_inflation",
        description="sort 3-6 digits with a scratchpad, ±1 rewards and room to grow (64 tokens, the SFT budget "
                    "was 40): under GRPO's 1/|o_i| the wrong answers grow longer",
        policy="sort_scratchpad",
        task_kwargs={"incorrect_reward": -1.0},
        settings=dict(max_completion_length=64, learning_rate=3e-4, max_steps=300, per_device_train_batch_size=64),
        arms={"grpo": Arm("grpo", beta=0.0), "dr_grpo": Arm("dr_grpo"),
              "gfpo": Arm("gfpo", num_generations=16, per_device_train_batch_size=128, gfpo_k=8),
              "lambda_grpo": Arm("lambda_grpo"),
              # added after the first runs, DAPO's parts one at a time on GRPO, then DAPO whole (budget 64: its
              # overlong buffer is 16)
              "token_loss": Arm("grpo", beta=0.0, loss_type="dapo"),
              "overlong_shaping": Arm("grpo", beta=0.0, mask_truncated_completions=True, overlong_buffer_length=16),
              "dapo": Arm("dapo")},
        metric="mean_length_wrong", failure="up", num_prompts=1024, num_samples=8, eval_every=100,
    ),
    # GFPO's premise: right answers that can be short or long, and a reason for RL to lengthen them. Sums of 2-4
    # digits, written at once or after a scratchpad of the sum's digits from the least significant one, which makes
    # a sum right more often for these models; under GRPO the scratchpad spreads and the right answers grow longer
    # while accuracy rises. GFPO's three filters sample 16 a group and keep 8 (or 4-8 by difficulty); every arm
    # samples 64 completions a step (GFPO: 4 prompts x 16), so the arms are compared at equal samples; `unfiltered`
    # is GFPO's preset with nothing filtered (the same 4 x 16 groups and token-level loss), which tells the filter
    # from the group size and the aggregation.
    "length_growth": Organism(
        name="length_growth",
        description="sums of 2-4-digit numbers with an optional scratchpad that makes them right more often, ±1 "
                    "rewards: under GRPO the right answers grow longer",
        policy="addition_scratchpad",
        task_kwargs={"incorrect_reward": -1.0},
        settings=dict(learning_rate=3e-4, max_steps=200, per_device_train_batch_size=64),
        arms={"grpo": Arm("grpo", beta=0.0),
              "unfiltered": Arm("grpo", beta=0.0, num_generations=16, loss_type="dapo"),
              "gfpo_length": Arm("gfpo", num_generations=16, gfpo_k=8),
              "gfpo_efficiency": Arm("gfpo", num_generations=16, gfpo_k=8, gfpo_metric="token_efficiency"),
              "gfpo_adaptive": Arm("gfpo", num_generations=16, gfpo_k=None, gfpo_adaptive=True)},
        metric="mean_length_correct", failure="up", num_prompts=1024, num_samples=8, eval_every=50,
    ),
    # DAPO's clip-higher: many valid answers per prompt, several updates per rollout so the clip binds; under the
    # symmetric clip the policy narrows onto few answers (entropy collapse).
    "entropy_collapse": Organism(
        name="entropy_collapse",
        description="write a string of given length and letter counts (many valid answers), ±1 rewards, four "
                    "updates per rollout: under the symmetric clip the entropy collapses",
        policy="constraint_string",
        task_kwargs={"incorrect_reward": -1.0},
        settings=dict(_MANY_ANSWERS),
        arms={"symmetric_clip": Arm("dapo", **_SYMMETRIC),
              "clip_higher": Arm("dapo", epsilon_high=0.28, **_DAPO_PARTS),
              "grpo": Arm("grpo", beta=0.0), "gmpo": Arm("gmpo")},
        metric="entropy", failure="down", num_prompts=1024, num_samples=16, eval_every=100,
    ),
    # The entropy methods of "After the note" on entropy_collapse's setting (the same policy, task and settings; a
    # separate organism so that entropy_collapse's registered file stays as it was run): against the symmetric clip,
    # the high-entropy filter (TRL's share 0.2), Skywork-OR1's adaptive bonus (TRL's step, start and range; the
    # target is half the base policy's token entropy, 2.51 nats at step 0, because the paper's 0.2 nats lies below
    # anything this organism reaches), verl's Clip-Cov and KL-Cov (its defaults) and CISPO (cap 5). Each changes one
    # thing of the symmetric clip's arm.
    "entropy_methods": Organism(
        name="entropy_methods",
        description="entropy_collapse's setting (many valid answers, ±1 rewards, four updates per rollout): the "
                    "entropy methods and CISPO against the symmetric clip, under which the entropy collapses",
        policy="constraint_string",
        task_kwargs={"incorrect_reward": -1.0},
        settings=dict(_MANY_ANSWERS),
        arms={"symmetric_clip": Arm("dapo", **_SYMMETRIC),
              "high_entropy": Arm("dapo", top_entropy_quantile=0.2, **_SYMMETRIC),
              "adaptive_entropy": Arm("dapo", use_adaptive_entropy=True, entropy_coef=0.0, entropy_target=1.25,
                                      **_SYMMETRIC),
              "clip_cov": Arm("dapo", covariance_method="clip_cov", **_SYMMETRIC),
              "kl_cov": Arm("dapo", covariance_method="kl_cov", **_SYMMETRIC),
              "cispo": Arm("dapo", loss_type="cispo", epsilon_high=5.0, **_DAPO_PARTS)},
        metric="entropy", failure="down", num_prompts=1024, num_samples=16, eval_every=100,
    ),
    # DAPO's dynamic sampling: a nearly solved policy (about 90 % of samples right), so most groups of G samples are
    # all right and carry no gradient under a group baseline; the batch that teaches anything shrinks as it learns.
    # Dynamic sampling draws more groups until the batch is full of informative ones: it pays in samples, so it is
    # measured per completion sampled as well as per step.
    "zero_gradient": Organism(
        name="zero_gradient",
        description="2-digit sums from a policy trained until about 90 % of its samples are right, ±1 rewards: most "
                    "groups are all right and teach nothing",
        policy="arithmetic_solved",
        task_kwargs={"incorrect_reward": -1.0},
        settings=dict(learning_rate=3e-4, max_steps=200, per_device_train_batch_size=64),
        arms={"no_dynamic_sampling": Arm("dapo", **_DAPO_PARTS),
              "dynamic_sampling": Arm("dapo", **{**_DAPO_PARTS, "dynamic_sampling": True}),
              # the control: as many samples per step as dynamic sampling draws (about 4 rounds), none filtered
              "larger_batch": Arm("dapo", per_device_train_batch_size=256, **_DAPO_PARTS)},
        metric="frac_reward_zero_std", failure="up", failure_threshold=0.5, num_prompts=1024, num_samples=8,
        eval_every=25,
    ),
    # GMPO's outlier ratios: the sampler and the learner disagree (a sampler at temperature 1.3, the learner at 1,
    # the ratio dividing by the sampler's log-probs as engines that skip the recompute do), so token ratios are
    # spread from the first update and four updates per rollout move them further. Under GRPO's token clip, the
    # rare tokens the hotter sampler draws start with ratios below 1 - epsilon: a wrong answer's are clipped (no
    # push down) while a right answer's are not (pushed up).
    "outlier_ratios": Organism(
        name="outlier_ratios",
        description="2-digit sums, a sampler at temperature 1.3 whose log-probs the ratio divides by, the learner at "
                    "1, four updates per rollout: the token ratios are off from the first update",
        policy="arithmetic",
        task_kwargs={"incorrect_reward": -1.0},
        settings=dict(_MISMATCH),
        arms={"grpo": Arm("grpo", beta=0.0), "gmpo": Arm("gmpo"),
              # the control: the same GRPO with the sampler and the learner agreeing
              "grpo_matched": Arm("grpo", beta=0.0, **_MATCHED),
              # GRPO without its clip (epsilon_high 1e9; the lower clip at 0.001 never binds in practice)
              "grpo_no_clip": Arm("grpo", beta=0.0, epsilon=0.999, epsilon_high=1e9),
              # added after the first runs: GRPO with GMPO's range, (e^-0.4, e^0.4) = (0.67, 1.49), as a linear
              # clip, to tell the geometric mean from the wider range
              "grpo_wide": Arm("grpo", beta=0.0, epsilon=0.33, epsilon_high=0.49)},
        metric="expected_accuracy", failure="down", num_prompts=1024, num_samples=8, eval_every=25,
    ),
    # After the note (issue 41): the same mismatch as outlier_ratios (a sampler at temperature 1.3, the learner at 1,
    # four updates per rollout, the ratio dividing by the sampler's log-probs), and the corrections practitioners
    # use for it, each at the value its paper or TRL gives (not tuned here): recompute pi_old with the learner and
    # weigh by pi_old / pi_sampler, truncated (TIS, Yao et al.: C = 2) or masked (MIS, TRL's default: sequence
    # level, C_max = 3; IcePop's token band [0.5, 5]); DeepSeek-V3.2's off-policy sequence mask (TRL's example
    # delta 0.5); and two surrogates that bound an outlier ratio's pull, CISPO (ScaleRL's cap 5) and SAPO (TRL's
    # temperatures), on the sampler's ratios as the baseline. grpo_recompute is the control: pi_old recomputed,
    # no weight, so the corrections' own share is each minus it.
    "sampler_mismatch": Organism(
        name="sampler_mismatch",
        description="2-digit sums, a sampler at temperature 1.3 and the learner at 1, four updates per rollout: the "
                    "sampler-mismatch corrections against GRPO dividing by the sampler's log-probs",
        policy="arithmetic",
        task_kwargs={"incorrect_reward": -1.0},
        settings=dict(_MISMATCH),
        arms={"grpo": Arm("grpo", beta=0.0),
              "grpo_recompute": Arm("grpo", beta=0.0, old_logprobs="learner"),
              "tis_token": _corrected("token_truncate", clip_max=2.0),
              "mis_sequence": _corrected("sequence_mask", clip_max=3.0),
              "icepop": _corrected("token_mask", clip_min=0.5, clip_max=5.0),
              "off_policy_mask": Arm("grpo", beta=0.0, old_logprobs="learner", off_policy_mask_threshold=0.5),
              "cispo": Arm("grpo", beta=0.0, loss_type="cispo", epsilon_high=5.0),
              "sapo": Arm("grpo", beta=0.0, loss_type="sapo"),
              # added after the pilot, as a reference: no mismatch at all (the sampler at the learner's temperature)
              "grpo_matched": Arm("grpo", beta=0.0, **_MATCHED)},
        metric="expected_accuracy", failure="down", num_prompts=1024, num_samples=8, eval_every=25,
    ),
    # GSPO's routing drift: a mixture of experts (16 a layer, 2 per token, no load-balancing loss) whose routers learn
    # ten times faster than the rest, eight updates per rollout (4 minibatches, 2 passes), ~40-token answers: each
    # step's updates re-route well over 10 % of the completion tokens (moe/route_changed), so a token's ratio can
    # jump when it changes experts. The fixes: GSPO's sequence ratio, and the GSPO paper's baseline for GRPO, Routing
    # Replay (the ratio's pi_theta computed on the experts pi_old chose). In the 2-seed pilot (200 steps) the gate did
    # not hold: GRPO dipped mid-run and recovered, and GRPO with Routing Replay dipped alike.
    "routing_drift": Organism(
        name="routing_drift",
        description="sort 3-6 digits with a scratchpad on a 16-expert mixture of experts whose routers learn fast, "
                    "±1 rewards, eight updates per rollout: each step re-routes many tokens and GRPO's token "
                    "ratios jump",
        policy="sort_scratchpad_moe",
        task_kwargs={"incorrect_reward": -1.0},
        settings=dict(learning_rate=3e-4, router_learning_rate=3e-3, **_ROUTING_UPDATES),
        arms=dict(_ROUTING_ARMS),
        metric="expected_accuracy", failure="down", num_prompts=1024, num_samples=8, eval_every=50,
    ),
    # GSPO's premise where it holds: a mixture of experts whose routing decides much of a token's probability. The
    # shipped sort_scratchpad_moe_top1 policy (8 experts a layer, one per token, weighted by the router's probability)
    # is the same task as routing_drift's; in a design probe, sending a position to its next-best expert moved the
    # probability of the token it predicts about 200 times as much as the other tokens' (30 times on routing_drift's
    # top-2 policy), and two of the eight experts carry most of the accuracy (ablating either loses about half of
    # it). Learning rate 1e-4 with the routers ten times faster, eight updates per rollout: at routing_drift's 3e-4
    # every arm, Routing Replay and GSPO included, fell alike in a probe (the step size, not the routing); at 1e-4
    # GRPO's largest token ratios reached the hundreds where Routing Replay's stayed in the tens (experiments/PLANS.md).
    "routing_jumps": Organism(
        name="routing_jumps",
        description="sort 3-6 digits with a scratchpad on a one-expert-per-token mixture of experts whose routers "
                    "learn ten times faster, ±1 rewards, eight updates per rollout: a re-routed token's probability "
                    "jumps, and so does GRPO's token ratio",
        policy="sort_scratchpad_moe_top1",
        task_kwargs={"incorrect_reward": -1.0},
        settings=dict(learning_rate=1e-4, router_learning_rate=1e-3, **_ROUTING_UPDATES),
        arms=dict(_ROUTING_ARMS),
        metric="expected_accuracy", failure="down", num_prompts=512, num_samples=4, eval_every=50,
    ),
    # --- Parts III and V (issue 20) ---
    # The policy-gradient chapter's baselines: REINFORCE's weights are the rewards themselves, so shifting every
    # reward by a constant c adds c times the sum of the sampled completions' scores to each gradient estimate: an
    # expected zero whose variance grows like c^2 and swamps the signal, while a group baseline subtracts the shift
    # exactly (their updates are those of 0/1 rewards). In 2-seed pilots at the chapter's learning rate, rewards
    # {1, 2} left REINFORCE's accuracy wandering while the baselines rose; {5, 6} made it fall (experiments/PLANS.md).
    "shifted_rewards": Organism(
        name="shifted_rewards",
        description="2-digit sums with every reward shifted up (right 6, wrong 5): without a baseline each sample "
                    "is pushed up and the shift's noise swamps the signal",
        policy="arithmetic",
        task_kwargs={"correct_reward": 6.0, "incorrect_reward": 5.0},
        settings=dict(learning_rate=3e-4, max_steps=200, per_device_train_batch_size=64),
        arms={"reinforce": Arm("reinforce"), "reinforce_baseline": Arm("reinforce_baseline"), "rloo": Arm("rloo")},
        metric="expected_accuracy", failure="down", num_prompts=1024, num_samples=8, eval_every=25,
    ),
    # PPO's clip, shown to be needed: the `ppo` preset (critic, GAE, whitened advantages) takes 16 optimiser steps on
    # each rollout (4 minibatches of 16, 4 epochs), so its later steps see ratios far from 1. Without the policy's
    # clip (epsilon 0.999, epsilon_high 1e9: the range (0.001, 1e9) never binds) nothing stops a token's ratio;
    # epsilon 0.2 is PPO's own; a too-wide clip (0.2, 2.0) binds only late. The value model's clip
    # (cliprange_value 0.2) is the preset's in every arm: only the policy's clip differs. Pilots (2 seeds): at lr
    # 3e-4 every arm collapsed, the clipped one too; at 1e-4 the unclipped arm fell and the clipped one rose.
    "many_updates": Organism(
        name="many_updates",
        description="2-digit sums, PPO with a critic taking 16 optimiser steps per rollout (4 minibatches, 4 "
                    "epochs): without the clip the ratios run away and accuracy falls",
        policy="arithmetic",
        task_kwargs={},
        settings=dict(learning_rate=1e-4, max_steps=80, per_device_train_batch_size=16, steps_per_generation=4,
                      num_iterations=4),
        arms={"ppo_no_clip": Arm("ppo", epsilon=0.999, epsilon_high=1e9), "ppo": Arm("ppo", epsilon=0.2),
              "ppo_wide": Arm("ppo", epsilon=0.8, epsilon_high=1.0)},
        metric="expected_accuracy", failure="down", num_prompts=1024, num_samples=8, eval_every=20,
    ),
    # Reward over-optimisation (PPO for RLHF, Gao et al.): the proxy is the task's rule plus a known flaw, a bonus of
    # 0.03 per completion character (length_bonus), whatever the verdict; the gold is the rule alone (held-out
    # expected_accuracy). Sorting with a scratchpad learns under RL (the arithmetic policy does not, so its gold
    # cannot rise); the 40-token budget is the SFT's, so a longer answer soon runs into it and is cut off (wrong).
    # In the pilot a bonus of 0.02 let the gold rise for 300 steps without falling and 0.05 made every answer run to
    # the budget by step 50; 0.03 fell by step 100 (100 steps keep the full run within the time the shared cores
    # allow). GRPO with the KL penalty in the reward (PPO-RLHF's -beta k1 per token; the arm) is used
    # because PPO's four epochs and value model cost several times as much per step on the shared cores. The held-out
    # evaluations record kl_to_base (the x-axis, sqrt(KL)); the gold is the evaluations' expected_accuracy (the
    # trainer's per-step `accuracy` is the task's verdict too, on the training samples).
    "proxy_reward": Organism(
        name="proxy_reward",
        description="sort 3-6 digits with a scratchpad against a proxy reward, the rule plus 0.03 per completion "
                    "character: the gold accuracy falls as answers run into the 40-token budget",
        policy="sort_scratchpad",
        task_kwargs={"length_bonus": 0.03},
        settings=dict(max_completion_length=40, learning_rate=3e-4, max_steps=100, per_device_train_batch_size=64),
        arms={"no_kl": Arm("grpo", beta=0.0),
              "kl_penalty": Arm("grpo", beta=0.05, kl_placement="reward"),
              # added 2026-12-03 for the frontier test: a smaller beta whose runs reach the distances (sqrt(KL) 2-3)
              # at which the no-penalty runs were measured, not only interpolated
              "kl_penalty_0.01": Arm("grpo", beta=0.01, kl_placement="reward")},
        metric="expected_accuracy", failure="down", num_prompts=1024, num_samples=8, eval_every=20,
        # the no-penalty runs moved to sqrt(KL) 2.3-3.2 before a first evaluation at step 20: the gold-versus-distance
        # frontier was then interpolated where it was never measured; dense evaluations early measure it (issue 40)
        eval_at=(2, 4, 6, 8, 10, 12, 14, 16, 18),
    ),
    # The long horizon (PPO's GAE lambda, VAPO): continue a chain of 12-24 dependent digits (71-143 tokens), each the
    # previous one plus the one three back (mod 10), with the reward on the last step only. One early slip decides
    # the outcome, far from the token the reward lands on: a critic that learned to spot the first wrong step can
    # put the blame there (small lambda), Monte Carlo returns (lambda 1) spread it over the whole chain. The lambda
    # arms share one critic recipe: pretrained on the base policy's rollouts with Monte Carlo targets (lam_critic 1,
    # VAPO's decoupled GAE, the "vapo" estimator with a fixed policy lambda), so that only the policy's lambda
    # differs. `ppo` is the preset as shipped (one lambda, 0.95, for both, and no pretraining). The critic learned
    # nothing here (explained variance near 0 after 20 pretraining rollouts; 0.07 at most in pilots of 150), so the
    # sweep measures lambda with an uninformed critic (experiments/PLANS.md).
    "long_chain": Organism(
        name="long_chain",
        description="continue a chain of 12-24 dependent digits (71-143 tokens), rewarded on the last one: one "
                    "early slip decides the outcome, far from where the reward lands",
        policy="lagged_sum",
        task_kwargs={},
        settings=dict(max_completion_length=146, learning_rate=1e-4, max_steps=40, per_device_train_batch_size=64),
        arms={"ppo": Arm("ppo"),
              **{f"ppo_lam_{lam:g}": Arm("ppo", advantage_estimator="vapo", lam=lam, lam_critic=1.0,
                                         value_pretrain_steps=LONG_CHAIN_PRETRAIN)
                 for lam in (0.0, 0.5, 0.95, 1.0)},
              # the two changes of ppo_lam_1 apart (issue 40): the policy's lambda alone (1, Monte Carlo advantages,
              # the critic as in `ppo`: no pretraining, targets at 0.95); the critic alone is ppo_lam_0.95 (the
              # preset's lambda 0.95 with the sweep's critic: 20 pretraining rollouts, Monte Carlo targets)
              "ppo_policy_lam_1": Arm("ppo", advantage_estimator="vapo", lam=1.0, lam_critic=0.95),
              "grpo": Arm("grpo", beta=0.0),
              # VAPO (issue 20, deliverable 3): alpha rescaled to these lengths (lambda 1 - 1/(alpha l) about 0.98 at
              # 107 tokens, as the paper's 0.05 gives at its 1,000-4,000), the paper's alpha beside it, each of its
              # seven techniques off in turn, and DAPO at the same samples per step
              "vapo_alpha_0.5": Arm("vapo", lam_alpha=VAPO_ALPHA),
              "vapo": Arm("vapo"),
              **{f"vapo_no_{part}": Arm("vapo", **{"lam_alpha": VAPO_ALPHA, **off})
                 for part, off in VAPO_ABLATIONS.items()},
              # added after the first runs (an explanation to test): with one update per rollout the ratio is 1 and
              # no clip binds, so clip-higher is tested again where it can act, four minibatch updates per rollout
              # (16 completions each, still 64 per step), as the paper's 512-prompt minibatches of a larger rollout
              **{f"vapo_4_updates{suffix}": Arm("vapo", lam_alpha=VAPO_ALPHA, per_device_train_batch_size=16,
                                                steps_per_generation=4, **off)
                 for suffix, off in (("", {}), ("_no_clip_higher", VAPO_ABLATIONS["clip_higher"]))},
              # DAPO without its dynamic sampling, which would draw more completions per step than the others
              "dapo": Arm("dapo", dynamic_sampling=False)},
        metric="expected_accuracy", failure="down", num_prompts=1024, num_samples=4, eval_every=20,
    ),
}


def get_organism(name: str) -> Organism:
    if name not in ORGANISMS:
        raise ValueError(f"unknown organism {name!r}; choose one of {sorted(ORGANISMS)}")
    return ORGANISMS[name]


# --- summaries of stored results -----------------------------------------------------------------------------------

# The readings and gates of stored series (metric_at, eval_series, metric_at_budget, baseline_change, baseline_level,
# gate_holds) live in rlbook.stats, imported above; what follows reads an organism's own records.


def critic_explained_variance(runs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """The critic's explained variance of one arm's runs (``experiments/organisms.py`` records): over its value
    pretraining, ``(seeds, rollouts)`` (``(seeds, 0)`` for an arm that does not pretrain), and over training,
    ``(seeds, steps)``, NaN at a step whose batch had no right answer (returns without variance, where the
    explained variance is undefined)."""
    train = np.array([run["metrics"]["explained_variance"] for run in runs], dtype=float)
    train[np.array([run["metrics"]["accuracy"] for run in runs], dtype=float) == 0] = np.nan
    pretrain = np.array([run.get("value_pretrain", {}).get("explained_variance", []) for run in runs], dtype=float)
    return pretrain.reshape(len(runs), -1), train


COMPARED_AT = ("step", "num_completions", "change")


def phenomenon(result: dict, *, chapter: str, phenomenon: str, fix: str, metric: str | None = None,
               baseline: str | None = None, direction: str | None = None, fix_metric: str | None = None,
               fix_direction: str | None = None, compared_at: str = "step", script: str,
               control: str | None = None, beside: tuple = ()) -> dict:
    """One entry of ``experiments/results/phenomena.json`` from an organism experiment's stored ``result``.

    The failure: ``metric`` (default: the organism's) under ``baseline`` (default: its first arm) from the first
    evaluation to the last (``baseline_change``), and, for an organism with a ``failure_threshold``, its level
    averaged over the evaluations (``baseline_level``, which then decides the gate); ``direction``, which way of
    ``metric`` is *better*, defaults to the opposite of the organism's failure. The fix: ``fix_metric`` (default
    ``metric``, better in ``fix_direction``, default ``direction``) of ``fix`` minus ``baseline``, over paired
    seeds, compared at the last step (``compared_at="step"``) or, for a fix that spends more samples per step
    (dynamic sampling), at the number of completions the baseline sampled in its whole run (``"num_completions"``:
    the fix's evaluations interpolated there), or as a change (``"change"``: the fix's change from the first
    evaluation to the last minus the baseline's, for a failure that is a growth, such as DPO's margin).

    ``control``: an arm that isolates part of the fix (GMPO's range given to GRPO as a linear clip); the entry then
    holds ``control_minus_baseline`` and ``fix_minus_control``, compared as the fix is. ``beside``: more metrics
    whose fix-minus-baseline at the last evaluation is reported next to the fix's (``{metric: interval}``; the
    gold accuracy beside a margin).
    """
    organism = result["organism"]
    metric = metric or organism["metric"]
    baseline = baseline or next(iter(result["arms"]))
    opposite = {"up": "down", "down": "up"}
    for name, value in (("direction", direction), ("fix_direction", fix_direction)):
        if value is not None and value not in DIRECTIONS:
            raise ValueError(f"{name} must be one of {DIRECTIONS}, got {value!r}")
    if compared_at not in COMPARED_AT:
        raise ValueError(f"compared_at must be one of {COMPARED_AT}, got {compared_at!r}")
    failure = opposite[direction] if direction is not None else organism["failure"]
    direction = opposite[failure]
    fix_metric, fix_direction = fix_metric or metric, fix_direction or direction
    for arm_name in (baseline, fix) + ((control,) if control else ()):
        if arm_name not in result["runs"]:
            raise ValueError(f"{result['experiment']}: no arm {arm_name!r}; it has {list(result['runs'])}")
        if [r["seed"] for r in result["runs"][arm_name]] != [r["seed"] for r in result["runs"][baseline]]:
            raise ValueError(f"{result['experiment']}: arms {baseline!r} and {arm_name!r} were not run on the same "
                             f"seeds")
    base_runs = result["runs"][baseline]
    change = baseline_change(base_runs, metric)
    threshold = organism.get("failure_threshold") if metric == organism["metric"] else None
    level = None if threshold is None else baseline_level(base_runs, metric)

    def compared(arm_name: str, measure: str = fix_metric, how: str = compared_at) -> np.ndarray:
        """One value per seed of ``arm_name`` as the comparison reads it."""
        runs = result["runs"][arm_name]
        if how == "change":
            return metric_at(runs, measure, -1) - metric_at(runs, measure, 0)
        if how == "num_completions" and arm_name != baseline:
            return metric_at_budget(runs, measure, metric_at(base_runs, "num_completions", -1))
        return metric_at(runs, measure, -1)

    def rounded(interval) -> list[float]:
        return [round(x, 6) for x in interval]

    entry = {"chapter": chapter, "phenomenon": phenomenon, "organism": organism["name"], "baseline": baseline,
             "fix": fix, "metric": metric, "direction": direction, "seeds": len(base_runs),
             "baseline_change": rounded(change),
             "failure_threshold": threshold, "baseline_level": None if level is None else rounded(level),
             "fix_metric": fix_metric, "fix_direction": fix_direction, "compared_at": compared_at,
             "fix_minus_baseline": rounded(paired_difference(compared(baseline), compared(fix))),
             "gate_holds": gate_holds(change, failure) if level is None else gate_holds(level, failure, threshold),
             "script": script}
    if control is not None:
        entry["control"] = control
        entry["control_minus_baseline"] = rounded(paired_difference(compared(baseline), compared(control)))
        entry["fix_minus_control"] = rounded(paired_difference(compared(control), compared(fix)))
    if beside:
        entry["beside"] = {m: rounded(paired_difference(compared(baseline, m, "step"), compared(fix, m, "step")))
                           for m in beside}
    return entry
