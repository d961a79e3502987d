"""The family chapter's checker accepts one-slot answers and rejects wrong or too-broad ones."""

import pytest

from rlbook.exercises import check_family_changes

RIGHT = {
    "no_reference": {"beta": 0.0},
    "sequence_ratio": {"importance_sampling_level": "sequence"},
    "no_difficulty_bias": {"scale_rewards": "none"},
    "token_mean": {"loss_type": "dapo"},
}


def test_accepts_the_answers(capsys):
    check_family_changes(RIGHT)
    check_family_changes({**RIGHT, "token_mean": {"loss_type": "bnpo"}})
    check_family_changes({**RIGHT, "sequence_ratio": {"importance_sampling_level": "sequence_token"}})  # GSPO-token
    assert capsys.readouterr().out.strip().splitlines() == ["ok", "ok", "ok"]


@pytest.mark.parametrize("goal, overrides, message", [
    ("no_reference", {"beta": 0.01}, "does not give"),
    ("sequence_ratio", {"importance_sampling_level": "sequence", "epsilon": 3e-4}, "also changes"),
    ("no_difficulty_bias", {"scale_rewards": "batch"}, "does not give"),
    ("token_mean", {"loss_type": "dr_grpo"}, "does not give"),
    ("token_mean", {"no_such_field": 1}, "fails"),
    ("no_reference", {"kl_coef": 0.0}, "did you mean 'beta'"),  # another library's name: the hint is passed on
])
def test_rejects_wrong_answers(goal, overrides, message):
    with pytest.raises(AssertionError, match=message):
        check_family_changes({**RIGHT, goal: overrides})


def test_rejects_missing_and_unknown_goals():
    with pytest.raises(AssertionError, match="no answer"):
        check_family_changes({"no_reference": {"beta": 0.0}})
    with pytest.raises(AssertionError, match="unknown goal"):
        check_family_changes({**RIGHT, "faster": {}})


def test_check_family_changes_takes_a_function_and_lets_a_stub_through():
    check_family_changes(RIGHT.__getitem__)
    def stub(goal):
        raise NotImplementedError("your solution")
    with pytest.raises(NotImplementedError):
        check_family_changes(stub)
