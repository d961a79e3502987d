"""Bad configurations fail where they are made, with one message that names the fix (issue 23, item 5).

The checks themselves live in ``rlbook.presets._check`` (every field) and ``Trainer.__init__`` (what needs the
models); this file holds the cases a reader meets first, each with the words its message must contain."""

import pytest

from rlbook.lm import build_model, build_tokenizer
from rlbook.lm.value import build_value_model
from rlbook.presets import RLConfig, preset
from rlbook.tasks import get_task
from rlbook.trainer import Trainer

SMALL = dict(num_generations=4, per_device_train_batch_size=8, max_completion_length=4)

CASES = {
    # another library's name for a field, given to the dataclass itself or to a preset
    "lr to RLConfig": (lambda: RLConfig(lr=1e-3), r"unknown RLConfig key 'lr'; did you mean 'learning_rate'"),
    "lr to preset": (lambda: preset("grpo", lr=1e-3), r"'lr'; did you mean 'learning_rate'"),
    "a misspelling": (lambda: RLConfig(num_generation=4), r"did you mean 'num_generations'"),
    "dynamic sampling, G = 1": (lambda: preset("reinforce", dynamic_sampling=True, num_generations=1),
                                r"dynamic_sampling needs num_generations >= 2"),
    "epsilon_high < epsilon": (lambda: preset("grpo", epsilon=0.2, epsilon_high=0.1),
                               r"epsilon_high \(0.1\) is below epsilon \(0.2\)"),
    "group estimator, G = 1": (lambda: preset("grpo", num_generations=1, per_device_train_batch_size=8),
                               r"compares the completions of one prompt"),
    "batch not whole groups": (lambda: preset("grpo", num_generations=3, per_device_train_batch_size=8),
                               r"num_generations"),
    "value pretraining, no value model": (lambda: preset("grpo", value_pretrain_steps=5),
                                          r"value_pretrain_steps needs a value model"),
    "GFPO filter on GRPO": (lambda: preset("grpo", gfpo_k=2), r"needs advantage_estimator='gfpo'"),
    "unknown loss_type": (lambda: preset("grpo", loss_type="token_mean"), r"unknown loss_type 'token_mean'"),
    "NaN learning rate": (lambda: preset("grpo", learning_rate=float("nan")), r"learning_rate"),
    "unknown non-finite policy": (lambda: preset("grpo", nonfinite_rewards="ignore"), r"nonfinite_rewards"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_configuration_fails_at_construction_naming_the_fix(case):
    make, message = CASES[case]
    with pytest.raises(ValueError, match=message) as error:
        make()
    assert "\n" not in str(error.value), "one line"


def test_a_value_model_given_to_an_estimator_without_values_is_refused():
    policy = build_model("tiny", seed=0)
    with pytest.raises(ValueError, match=r"advantage_estimator='grpo' uses none; drop value_model"):
        Trainer(policy, build_tokenizer(), get_task("arithmetic", num_digits=1), preset("grpo", **SMALL),
                value_model=build_value_model(policy))


def test_gae_without_a_value_model_gets_one_built_from_the_policy():
    """GAE needs values: given no value model, the trainer builds one (a copy of the policy's body with a scalar
    head), so this configuration is complete, not an error."""
    trainer = Trainer(build_model("tiny", seed=0), build_tokenizer(), get_task("arithmetic", num_digits=1),
                      preset("ppo", **SMALL))
    assert trainer.value_model is not None


def test_good_configurations_still_build():
    assert RLConfig(learning_rate=1e-3).learning_rate == 1e-3
    assert preset("dapo", **SMALL).epsilon_high > preset("dapo", **SMALL).epsilon
