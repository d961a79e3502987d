"""Tests for rlbook.tasks: sampling, demonstrations, rewards, garbage handling, preference pairs, evaluation."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from rlbook.tasks import (
    TASKS,
    Arithmetic,
    ConstraintString,
    ScratchpadAddition,
    Example,
    PreferencePair,
    ReverseDigits,
    SortDigits,
    Task,
    build_preference_pairs,
    check_constraints,
    evaluate,
    final_answer,
    get_task,
    parse_constraint_prompt,
    pass_at_k,
    soft_overlong_penalty,
    uses_only_alphabet,
)
from rlbook.tasks.base import split_bucket
from rlbook.vocab import ALPHABET

# One of each task with its defaults, plus the harder settings later chapters use.
TASK_FACTORIES = {
    "arithmetic": lambda: Arithmetic(),
    "arithmetic_all_ops": lambda: Arithmetic(num_digits=3, operations="+-*", allow_negative=True),
    "arithmetic_one_digit_minus": lambda: Arithmetic(num_digits=1, operations="-"),
    "sort": lambda: SortDigits(),
    "sort_scratchpad": lambda: SortDigits(min_length=1, max_length=8, scratchpad=True),
    "reverse": lambda: ReverseDigits(),
    "reverse_scratchpad": lambda: ReverseDigits(scratchpad=True),
    "constraint": lambda: ConstraintString(),
    "constraint_three_counts": lambda: ConstraintString(min_length=6, max_length=14, num_counts=3, min_count=0,
                                                        max_count=4, letters="abcd"),
    "addition_scratchpad": lambda: ScratchpadAddition(),
    "addition_scratchpad_one_digit": lambda: ScratchpadAddition(min_digits=1, max_digits=1, scratchpad_rate=1.0),
    "constraint_tight": lambda: ConstraintString(min_length=2, max_length=2, num_counts=2, letters="abc"),
}
DEFAULT_TASKS = ["arithmetic", "sort", "reverse", "constraint"]


@pytest.fixture(params=sorted(TASK_FACTORIES))
def task(request):
    return TASK_FACTORIES[request.param]()


def garbage_completions(demonstration):
    """Completions that must score as incorrect for any problem (none of them can be a valid answer)."""
    return [
        "",
        " ",
        "     ",
        "\t",
        "\n",
        demonstration + "\n",
        "\t" + demonstration,
        demonstration.replace(demonstration[0], "\u00e9", 1),  # a character outside ALPHABET
        "\uff18\uff11",  # fullwidth digits
        "\U0001f642",
        "\x00",
        demonstration + "\u200b",  # zero-width space
        "<eos>",
        "?" * 10_000,
        demonstration * 2_000,  # far beyond max_completion_length
        demonstration + " " * 2_000,
    ]


# --- sampling ----------------------------------------------------------------------------------------------


def test_same_seed_same_examples_and_different_seed_different_examples(task):
    assert task.sample(50, seed=3) == task.sample(50, seed=3)
    assert task.sample(50, seed=3) != task.sample(50, seed=4)


def test_a_generator_seed_is_accepted_and_advances(task):
    rng = np.random.default_rng(0)
    first, second = task.sample(5, rng), task.sample(5, rng)
    assert first + second == task.sample(10, seed=0)


def test_every_prompt_answer_and_demonstration_uses_only_the_alphabet_and_fits(task):
    for example in task.sample(300, seed=1):
        demonstration = task.demonstration(example)
        for text in (example.prompt, example.answer, demonstration):
            assert isinstance(text, str) and len(text) > 0
            assert uses_only_alphabet(text), text
        assert len(example.prompt) <= task.max_prompt_length
        assert len(demonstration) <= task.max_demonstration_length
        assert len(example.answer) <= task.max_demonstration_length


@pytest.mark.parametrize("name", DEFAULT_TASKS)
def test_default_tasks_are_short(name):
    """The small LMs need prompts of about 24 characters and answers of about 32 at most."""
    task = TASK_FACTORIES[name]()
    assert task.max_prompt_length <= 24
    assert task.max_demonstration_length <= 32
    for example in task.sample(200, seed=0):
        assert len(example.prompt) <= 24 and len(task.demonstration(example)) <= 32


@pytest.mark.parametrize("task, prompt_length, demonstration_length", [
    (Arithmetic(num_digits=2, operations="*"), 6, 4),
    (Arithmetic(num_digits=1, operations="+"), 4, 2),
    (Arithmetic(num_digits=2, operations="-"), 6, 2),
    (Arithmetic(num_digits=2, operations="-", allow_negative=True), 6, 3),
    (SortDigits(min_length=2, max_length=5), 11, 5),
    (SortDigits(min_length=2, max_length=5, scratchpad=True), 11, 15 + 4 + 1 + 5),
    (ReverseDigits(min_length=4, max_length=4, scratchpad=True), 9, 10 + 3 + 1 + 4),
    (ConstraintString(min_length=10, max_length=10, num_counts=2, min_count=3, max_count=3), 15, 10),
])
def test_the_stated_maximum_lengths_are_reached(task, prompt_length, demonstration_length):
    assert (task.max_prompt_length, task.max_demonstration_length) == (prompt_length, demonstration_length)
    examples = task.sample(2000, seed=0)
    assert max(len(example.prompt) for example in examples) == prompt_length
    assert max(len(task.demonstration(example)) for example in examples) == demonstration_length


def test_sample_rejects_a_bad_n(task):
    for n in (0, -3, 2.5, True, "4"):
        with pytest.raises(ValueError, match="n must be"):
            task.sample(n, seed=0)


# --- the train/test split ----------------------------------------------------------------------------------

SPLIT_TASKS = ["arithmetic", "arithmetic_all_ops", "sort", "sort_scratchpad", "reverse", "constraint",
               "constraint_three_counts"]


@pytest.mark.parametrize("name", SPLIT_TASKS)
def test_train_and_test_splits_are_disjoint_sized_and_deterministic(name):
    task = TASK_FACTORIES[name]()
    train, test = task.sample(400, seed=0, split="train"), task.sample(100, seed=0, split="test")
    assert len(train) == 400 and len(test) == 100
    assert all(task.split_of(example) == "train" for example in train)
    assert all(task.split_of(example) == "test" for example in test)
    assert not {task.split_key(example) for example in train} & {task.split_key(example) for example in test}
    assert task.sample(100, seed=0, split="test") == test  # the same seed, the same problems
    assert task.sample(100, seed=1, split="test") != test


def test_the_split_is_a_property_of_the_problem_not_of_the_seed():
    """sha256 of the canonical prompt: the same bucket on every machine; pinned values catch a changed rule."""
    assert [split_bucket(key) for key in ("23+58=", "sort:3142=", "len=7 x=3:")] == [34, 2, 52]
    task = Arithmetic()
    all_sums = [Example(f"{a}+{b}=", str(a + b)) for a in range(100) for b in range(100)]
    in_test = {example.prompt for example in all_sums if task.split_of(example) == "test"}
    assert len({task.split_key(Example(prompt, "")) for prompt in in_test}) == 481  # of 5,050 distinct sums
    assert {example.prompt for seed in range(3) for example in task.sample(300, seed, split="test")} <= in_test


def test_sample_all_is_the_unsplit_stream():
    task = SortDigits()
    assert task.sample(50, seed=3) == task.sample(50, seed=3, split="all")
    fraction_in_test = np.mean([task.split_of(example) == "test" for example in task.sample(5000, seed=0)])
    assert 0.08 < fraction_in_test < 0.12


def test_one_problem_written_two_ways_shares_a_split():
    arithmetic = Arithmetic(num_digits=2, operations="+*")
    assert arithmetic.split_key(Example("58+23=", "81")) == arithmetic.split_key(Example("23+58=", "81")) == "23+58="
    assert arithmetic.split_key(Example("9*12=", "108")) == "9*12="
    assert Arithmetic(operations="-").split_key(Example("58-23=", "35")) == "58-23="
    constraint = ConstraintString(num_counts=2)
    assert constraint.split_key(Example("len=9 x=3 b=1:", "")) == "len=9 b=1 x=3:"
    assert constraint.split_of(Example("len=9 x=3 b=1:", "")) == constraint.split_of(Example("len=9 b=1 x=3:", ""))


@pytest.mark.parametrize("name", SPLIT_TASKS)
def test_validation_is_a_slice_of_train_and_training_without_it_leaves_all_three_disjoint(name):
    """"validation" takes buckets 10..19, inside "train" (so every stored experiment's training stream is
    unchanged); "train_without_validation" is the rest of "train"."""
    task = TASK_FACTORIES[name]()
    validation = task.sample(100, seed=0, split="validation")
    fit = task.sample(400, seed=0, split="train_without_validation")
    test = task.sample(100, seed=0, split="test")
    keys = [{task.split_key(e) for e in split} for split in (validation, fit, test)]
    assert not keys[0] & keys[1] and not keys[0] & keys[2] and not keys[1] & keys[2]
    assert all(task.split_of(e) == "train" for e in validation + fit)
    assert all(10 <= split_bucket(task.split_key(e)) < 20 for e in validation)
    # "train" itself is unchanged: the same seed draws the same problems as before the validation split existed
    train = task.sample(200, seed=5, split="train")
    rng, expected = np.random.default_rng(5), []
    while len(expected) < 200:
        example = task.sample_one(rng)
        if split_bucket(task.split_key(example)) >= 10:
            expected.append(example)
    assert train == expected


def test_the_trainer_and_the_held_out_evaluation_use_the_chosen_splits():
    from rlbook.evaluation import HeldOutEvaluation
    from rlbook.presets import RLConfig

    with pytest.raises(ValueError, match="unknown train_split"):
        RLConfig(train_split="validation")
    with pytest.raises(ValueError, match="split must be 'test' or 'validation'"):
        HeldOutEvaluation(split="train")
    assert HeldOutEvaluation(split="validation").split == "validation"


def test_sample_rejects_an_unknown_split():
    for split in ("valid", "TEST", None, 1):
        with pytest.raises(ValueError, match="unknown split"):
            Arithmetic().sample(5, seed=0, split=split)


def test_a_split_without_problems_errors_instead_of_looping_forever():
    task = SortDigits(min_length=1, max_length=1)  # ten problems, "sort:0=" ... "sort:9=", none in the test split
    assert len(task.sample(20, seed=0, split="train")) == 20
    with pytest.raises(ValueError, match="too few distinct problems for a 'test' split"):
        task.sample(5, seed=0, split="test")


# --- demonstrations are correct ----------------------------------------------------------------------------


def test_the_demonstration_earns_the_correct_reward(task):
    for seed in range(5):
        examples = task.sample(200, seed=seed)
        demonstrations = [task.demonstration(example) for example in examples]
        np.testing.assert_allclose(task.rewards(examples, demonstrations), 1.0, rtol=0, atol=1e-12)
        assert all(task.is_correct(example, text) for example, text in zip(examples, demonstrations))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_plus_minus_one_rewards(name):
    task = get_task(name, correct_reward=1.0, incorrect_reward=-1.0)
    example = task.sample(1, seed=0)[0]
    assert task.reward(example, task.demonstration(example)) == pytest.approx(1.0)
    assert task.reward(example, "") == pytest.approx(-1.0)
    assert task.reward(example, task.demonstration(example), truncated=True) == pytest.approx(-1.0)


# --- garbage is incorrect, never an error -------------------------------------------------------------------


def test_garbage_gets_the_incorrect_reward(task):
    for example in task.sample(20, seed=2):
        demonstration = task.demonstration(example)
        for completion in garbage_completions(demonstration):
            assert task.reward(example, completion) == pytest.approx(0.0), repr(completion[:40])
            assert task.reward(example, completion, truncated=True) == pytest.approx(0.0)


def test_a_truncated_demonstration_is_incorrect(task):
    example = task.sample(1, seed=0)[0]
    assert task.reward(example, task.demonstration(example), truncated=True) == pytest.approx(0.0)
    assert not task.is_correct(example, task.demonstration(example), truncated=True)


def test_completions_that_are_not_strings_raise_type_error(task):
    example = task.sample(1, seed=0)[0]
    for completion in (None, b"81", 81, ["8", "1"]):
        with pytest.raises(TypeError, match="completion must be a str"):
            task.reward(example, completion)


def test_max_completion_length_is_the_cut_off(task):
    example = task.sample(1, seed=0)[0]
    short = type(task)(**{**task.config(), "max_completion_length": task.max_demonstration_length})
    padded = task.demonstration(example) + " " * (task.max_demonstration_length + 1)
    assert task.reward(example, padded) == pytest.approx(1.0)
    assert short.reward(example, padded) == pytest.approx(0.0)


def test_rewards_is_the_loop_over_reward(task):
    examples = task.sample(30, seed=5)
    rng = np.random.default_rng(0)
    completions = [task.demonstration(e) if rng.random() < 0.5 else task.near_miss(e, rng) for e in examples]
    truncated = rng.random(30) < 0.2
    rewards = task.rewards(examples, completions, truncated)
    assert rewards.dtype == np.float64 and rewards.shape == (30,)
    loop = [task.reward(e, c, bool(t)) for e, c, t in zip(examples, completions, truncated)]
    np.testing.assert_allclose(rewards, loop, rtol=0, atol=1e-12)
    assert np.all(np.isclose(rewards, 0.0) | np.isclose(rewards, 1.0))  # all or nothing


def test_rewards_rejects_mismatched_lengths():
    task = Arithmetic()
    examples = task.sample(3, seed=0)
    with pytest.raises(ValueError, match="3 examples but 2 completions"):
        task.rewards(examples, ["1", "2"])
    with pytest.raises(ValueError, match="3 completions but 1 truncated flags"):
        task.rewards(examples, ["1", "2", "3"], truncated=[True])


# --- arithmetic --------------------------------------------------------------------------------------------


def test_arithmetic_prompt_and_answer():
    task = Arithmetic(num_digits=3, operations="+-*", allow_negative=True)
    for example in task.sample(200, seed=0):
        a, b, operation = example.meta["a"], example.meta["b"], example.meta["operation"]
        assert example.prompt == f"{a}{operation}{b}="
        assert int(example.answer) == eval(f"{a}{operation}{b}")  # the prompt is a Python expression
    assert any(example.answer.startswith("-") for example in task.sample(200, seed=0))


def test_arithmetic_without_negatives_never_has_a_negative_answer():
    task = Arithmetic(num_digits=2, operations="-")
    assert all(int(example.answer) >= 0 for example in task.sample(500, seed=0))


def test_arithmetic_is_strict_about_the_form_of_the_number():
    task = Arithmetic()
    example = Example("23+58=", "81")
    assert task.reward(example, "81") == pytest.approx(1.0)
    assert task.reward(example, "  81 ") == pytest.approx(1.0)  # surrounding spaces are stripped
    for wrong in ("081", "+81", "8 1", "81.0", "80", "18", "81=", "=81", "eighty one", "81|81", "-81"):
        assert task.reward(example, wrong) == pytest.approx(0.0), wrong
    zero = Example("5-5=", "0")
    assert task.reward(zero, "0") == pytest.approx(1.0)
    assert task.reward(zero, "-0") == pytest.approx(0.0) and task.reward(zero, "00") == pytest.approx(0.0)
    negative = Example("3-50=", "-47")
    assert task.reward(negative, "-47") == pytest.approx(1.0) and task.reward(negative, "- 47") == pytest.approx(0.0)


# --- digit tasks and the scratchpad --------------------------------------------------------------------------


def test_sort_and_reverse_formats():
    assert SortDigits().demonstration(Example("sort:3142=", "1234")) == "1234"
    assert SortDigits(scratchpad=True).demonstration(Example("sort:3142=", "1234")) == "3,13,134,1234|1234"
    assert ReverseDigits(scratchpad=True).demonstration(Example("rev:3142=", "2413")) == "3,13,413,2413|2413"
    for example in SortDigits(min_length=1, max_length=9).sample(100, seed=0):
        assert example.prompt == f"sort:{example.meta['digits']}="
        assert example.answer == "".join(sorted(example.meta["digits"]))
    for example in ReverseDigits().sample(100, seed=0):
        assert example.answer == example.meta["digits"][::-1]


def test_the_scratchpad_reward_reads_only_the_final_answer():
    task = SortDigits(scratchpad=True)
    example = Example("sort:3142=", "1234")
    assert task.reward(example, "3,13,134,1234|1234") == pytest.approx(1.0)
    assert task.reward(example, "|1234") == pytest.approx(1.0)  # a skipped scratchpad is allowed: length is the model's choice
    assert task.reward(example, "anything at all (wrong steps) 9,99|1234 ") == pytest.approx(1.0)
    assert task.reward(example, "12|34|1234") == pytest.approx(1.0)  # the last marker counts
    for wrong in ("1234", "3,13,134,1234|", "1234|1243", "3,13,134,1234|1234|", "|12 34"):
        assert task.reward(example, wrong) == pytest.approx(0.0), wrong
    assert final_answer("3,13|12 ") == "12" and final_answer("1234") is None


def test_without_scratchpad_a_marker_is_wrong():
    task = SortDigits()
    assert task.reward(Example("sort:3142=", "1234"), "|1234") == pytest.approx(0.0)


def test_scratchpad_lengths_vary_with_the_input():
    task = SortDigits(min_length=2, max_length=7, scratchpad=True)
    lengths = {len(task.demonstration(example)) for example in task.sample(300, seed=0)}
    assert lengths == {length * (length + 1) // 2 + 2 * length for length in range(2, 8)}


def test_digit_task_rejects_a_foreign_prompt():
    with pytest.raises(ValueError, match="not of the form 'sort:<digits>='"):
        SortDigits(scratchpad=True).demonstration(Example("rev:123=", "321"))


# --- constraint strings ------------------------------------------------------------------------------------


def test_constraint_prompts_parse_and_the_answer_satisfies_them():
    task = ConstraintString(num_counts=2, min_count=0, letters="abcxyz")
    for example in task.sample(300, seed=0):
        length, counts = parse_constraint_prompt(example.prompt)
        assert (length, counts) == (example.meta["length"], example.meta["counts"])
        assert len(example.answer) == length and set(example.answer) <= set("abcxyz")
        assert all(example.answer.count(letter) == count for letter, count in counts.items())


def test_check_constraints_reports_each_constraint():
    assert check_constraints("len=7 x=3:", "xxxabcd") == {"length": True, "charset": True, "count_x": True}
    assert check_constraints("len=7 x=3:", " xxabcde ") == {"length": True, "charset": True, "count_x": False}
    assert check_constraints("len=7 x=3:", "xxxABCD") == {"length": True, "charset": False, "count_x": True}
    assert check_constraints("len=7 x=3:", "xxxab") == {"length": False, "charset": True, "count_x": True}
    report = check_constraints(Example("len=5 b=1 q=0:", "abccc"), "abccc")
    assert report == {"length": True, "charset": True, "count_b": True, "count_q": True}
    assert list(check_constraints("len=4 z=1 a=2:", "")) == ["length", "charset", "count_z", "count_a"]


def test_check_constraints_rejects_a_malformed_prompt():
    for prompt in ("len=7 x=3", "len=7:", "length=7 x=3:", "len=7 X=3:", "len=5 a=1 a=2:", "23+58="):
        with pytest.raises(ValueError, match="prompt"):
            check_constraints(prompt, "abc")
    with pytest.raises(TypeError, match="completion must be a str"):
        check_constraints("len=7 x=3:", None)


def test_constraint_reward_all_or_nothing_and_partial_credit():
    example = Example("len=7 x=3 b=1:", "xxxbaaa")
    strict = ConstraintString(num_counts=2)
    partial = ConstraintString(num_counts=2, partial_credit=True)
    plus_minus = ConstraintString(num_counts=2, partial_credit=True, incorrect_reward=-1.0)
    assert strict.reward(example, "bxaxcxd") == pytest.approx(partial.reward(example, "bxaxcxd")) == pytest.approx(1.0)
    assert strict.reward(example, "xxbaaaa") == pytest.approx(0.0)
    assert partial.reward(example, "xxbaaaa") == pytest.approx(0.75)  # length, charset, b ok; x wrong
    assert plus_minus.reward(example, "xxbaaaa") == pytest.approx(-1.0 + 0.75 * 2.0)
    assert partial.reward(example, "xxbaaa") == pytest.approx(0.5)
    assert partial.reward(example, "xxxbaaa", truncated=True) == pytest.approx(0.0)
    assert partial.reward(example, "xxxbaa\u00e9") == pytest.approx(0.0)  # outside ALPHABET: garbage, not partial credit
    assert partial.reward(example, "xxxbaa?") == pytest.approx(0.75)  # in ALPHABET but not a letter: only charset fails


# --- bad arguments -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("build, message", [
    (lambda: Arithmetic(num_digits=0), "num_digits must be >= 1"),
    (lambda: Arithmetic(num_digits=-2), "num_digits must be >= 1"),
    (lambda: Arithmetic(num_digits=2.0), "num_digits must be an integer"),
    (lambda: Arithmetic(operations=""), "operations must be a non-empty string"),
    (lambda: Arithmetic(operations="/"), "unknown operation '/'"),
    (lambda: Arithmetic(operations="++"), "repeats an operation"),
    (lambda: Arithmetic(operations=["+"]), "operations must be a non-empty string"),
    (lambda: SortDigits(min_length=0), "min_length must be >= 1"),
    (lambda: SortDigits(min_length=5, max_length=3), r"min_length \(5\) must be <= max_length \(3\)"),
    (lambda: ReverseDigits(max_length=-1), "max_length must be >= 1"),
    (lambda: ConstraintString(min_length=8, max_length=4), r"min_length \(8\) must be <= max_length \(4\)"),
    (lambda: ConstraintString(num_counts=0), "num_counts must be >= 1"),
    (lambda: ConstraintString(min_count=-1), "min_count must be >= 0"),
    (lambda: ConstraintString(min_count=3, max_count=2), r"min_count \(3\) must be <= max_count \(2\)"),
    (lambda: ConstraintString(min_length=3, num_counts=2, min_count=2), "do not fit in min_length"),
    (lambda: ConstraintString(letters="abC"), "lowercase a-z, got 'C'"),
    (lambda: ConstraintString(letters="ab1"), "lowercase a-z, got '1'"),
    (lambda: ConstraintString(letters="aab"), "repeats a letter"),
    (lambda: ConstraintString(letters="ab", num_counts=2), "at least num_counts \\+ 1 = 3"),
    (lambda: ConstraintString(letters=None), "letters must be a string"),
    (lambda: Arithmetic(correct_reward=0.0, incorrect_reward=0.0), "must be greater than"),
    (lambda: SortDigits(correct_reward=-1.0, incorrect_reward=1.0), "must be greater than"),
    (lambda: SortDigits(correct_reward=float("nan")), "rewards must be finite"),
    (lambda: SortDigits(scratchpad=True, max_completion_length=10), r"must be >= the longest demonstration"),
    (lambda: ConstraintString(max_completion_length=0), "max_completion_length must be >= 1"),
    (lambda: ScratchpadAddition(scratchpad_rate=1.5), "scratchpad_rate must be a number in"),
    (lambda: ScratchpadAddition(min_digits=4, max_digits=2), "min_digits"),
    (lambda: get_task("chess"), "unknown task 'chess'"),
])
def test_bad_arguments_raise_value_error_naming_the_problem(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# --- registry ----------------------------------------------------------------------------------------------


def test_get_task_builds_each_registered_task_and_config_rebuilds_it():
    assert sorted(TASKS) == ["addition_scratchpad", "arithmetic", "constraint_string", "lagged_sum", "reverse_digits",
                             "sort_digits"]
    for name, cls in TASKS.items():
        task = get_task(name)
        assert isinstance(task, cls) and isinstance(task, Task) and task.name == name
        rebuilt = type(task)(**task.config())
        assert rebuilt.config() == task.config() and repr(rebuilt) == repr(task)
        assert rebuilt.sample(5, seed=1) == task.sample(5, seed=1)
    assert get_task("arithmetic", num_digits=3).num_digits == 3


def test_examples_are_hashable_and_compare_by_value():
    assert Example("1+1=", "2", {"a": 1}) == Example("1+1=", "2", {"a": 1})
    assert len({Example("1+1=", "2", {"a": 1}), Example("1+1=", "2", {"a": 1})}) == 1


# --- preference pairs ----------------------------------------------------------------------------------------


def test_preference_pairs_chosen_correct_rejected_incorrect(task):
    pairs = build_preference_pairs(task, 200, seed=0)
    examples = task.sample(200, seed=np.random.default_rng(0))
    assert [pair.prompt for pair in pairs] == [example.prompt for example in examples]
    for pair, example in zip(pairs, examples):
        assert isinstance(pair, PreferencePair)
        assert pair.chosen == task.demonstration(example)
        assert task.reward(example, pair.chosen) == pytest.approx(1.0)
        assert task.reward(example, pair.rejected) == pytest.approx(0.0)
        assert uses_only_alphabet(pair.rejected) and pair.rejected != pair.chosen


def test_preference_pairs_can_come_from_one_split():
    task = SortDigits()
    pairs = build_preference_pairs(task, 50, seed=0, split="test")
    assert all(task.split_of(Example(pair.prompt, "")) == "test" for pair in pairs)


def test_preference_pairs_are_deterministic_and_near_misses():
    task = SortDigits()
    assert build_preference_pairs(task, 50, seed=7) == build_preference_pairs(task, 50, seed=7)
    for pair in build_preference_pairs(task, 200, seed=0):
        assert abs(len(pair.rejected) - len(pair.chosen)) <= 1  # one digit changed, swapped, dropped or added
    for pair in build_preference_pairs(ConstraintString(), 200, seed=0):
        assert abs(len(pair.rejected) - len(pair.chosen)) <= 1
        changed = sum(a != b for a, b in zip(pair.chosen, pair.rejected))
        assert len(pair.rejected) != len(pair.chosen) or changed == 1


def test_arithmetic_near_misses_are_close_numbers():
    task = Arithmetic(num_digits=2, operations="+-", allow_negative=True)
    for pair in build_preference_pairs(task, 200, seed=0):
        chosen, rejected = int(pair.chosen), int(pair.rejected)
        swapped = str(abs(chosen)) != str(abs(rejected)) and sorted(str(abs(chosen))) == sorted(str(abs(rejected)))
        assert abs(chosen - rejected) in (1, 10) or swapped
        assert pair.rejected == str(rejected)  # canonical form, so the mistake is in the value


def test_partial_credit_rejected_scores_below_chosen():
    task = ConstraintString(num_counts=2, partial_credit=True)
    examples = task.sample(100, seed=np.random.default_rng(3))
    for pair, example in zip(build_preference_pairs(task, 100, seed=3), examples):
        assert task.reward(example, pair.chosen) == pytest.approx(1.0)
        assert 0.0 < task.reward(example, pair.rejected) < 1.0


def test_build_preference_pairs_rejects_bad_n():
    with pytest.raises(ValueError, match="n must be >= 1"):
        build_preference_pairs(Arithmetic(), 0, seed=0)


# --- pass@k and evaluate -------------------------------------------------------------------------------------


def brute_force_pass_at_k(n, c, k):
    """Fraction of the k-subsets of n samples (the first c correct) holding at least one correct sample."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in subset) for subset in subsets) / len(subsets)


def test_pass_at_k_equals_brute_force_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_edge_cases():
    assert pass_at_k(10, 0, 3) == pytest.approx(0.0)
    assert pass_at_k(10, 10, 3) == pytest.approx(1.0)
    assert pass_at_k(10, 1, 10) == pytest.approx(1.0) and pass_at_k(10, 0, 10) == pytest.approx(0.0)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the fraction correct
    np.testing.assert_allclose(pass_at_k([5, 5, 4], [0, 2, 4], 2), [0.0, 0.7, 1.0])
    with pytest.raises(ValueError, match="k=4 is larger than the number of samples"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_at_k(3, 1, 0)
    with pytest.raises(ValueError, match=r"num_correct must lie in \[0, num_samples\]"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="shape"):
        pass_at_k([3, 3], [1], 1)


def test_pass_at_k_is_stable_for_large_n():
    n, c, k = 500, 7, 200
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_evaluate_summarises_samples():
    task = Arithmetic()
    examples = [Example("1+1=", "2"), Example("2+2=", "4")]
    completions = [["2", "3", "2 ", "22"], ["5", "5", "4", "4444444"]]
    truncated = [[False, False, False, False], [False, False, True, True]]
    result = evaluate(task, examples, completions, truncated, k=[1, 2, 4])
    assert result.accuracy == pytest.approx(2 / 8)  # the truncated "4" does not count
    assert result.pass_at_k[1] == pytest.approx((2 / 4 + 0 / 4) / 2)
    assert result.pass_at_k[2] == pytest.approx((1 - 1 / 6 + 0) / 2)
    assert result.pass_at_k[4] == pytest.approx(0.5)
    assert result.mean_reward == pytest.approx(2 / 8)
    assert result.mean_length == pytest.approx((1 + 1 + 2 + 2 + 1 + 1 + 1 + 7) / 8)
    assert result.max_length == 7
    assert result.truncated_fraction == pytest.approx(2 / 8)
    assert (result.num_problems, result.num_samples) == (2, 8)


def test_evaluate_with_demonstrations_is_perfect(task):
    examples = task.sample(20, seed=0)
    completions = [[task.demonstration(example)] * 3 for example in examples]
    result = evaluate(task, examples, completions, k=3)
    assert result.accuracy == result.pass_at_k[3] == result.mean_reward == pytest.approx(1.0)
    assert result.truncated_fraction == pytest.approx(0.0)


def test_evaluate_rejects_bad_shapes():
    task = Arithmetic()
    examples = [Example("1+1=", "2")]
    with pytest.raises(ValueError, match="k=3 is larger"):
        evaluate(task, examples, [["2", "2"]], k=3)
    with pytest.raises(ValueError, match="1 examples but 2 lists"):
        evaluate(task, examples, [["2"], ["2"]])
    with pytest.raises(ValueError, match="has no completions"):
        evaluate(task, examples, [[]])
    with pytest.raises(ValueError, match="1 completions but 2 flags"):
        evaluate(task, examples, [["2"]], truncated=[[True, False]])
    with pytest.raises(ValueError, match="at least one example"):
        evaluate(task, [], [])


# --- DAPO soft overlong punishment -----------------------------------------------------------------------------


def test_soft_overlong_penalty():
    penalty = soft_overlong_penalty([0, 12, 13, 14, 16, 17, 100], max_length=16, cache_length=4)
    np.testing.assert_allclose(penalty, [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])
    assert penalty.dtype == np.float64
    with pytest.raises(ValueError, match=r"cache_length \(5\) must be <= max_length \(4\)"):
        soft_overlong_penalty([1], max_length=4, cache_length=5)
    with pytest.raises(ValueError, match="cache_length must be >= 1"):
        soft_overlong_penalty([1], max_length=4, cache_length=0)
    with pytest.raises(ValueError, match="non-negative"):
        soft_overlong_penalty([-1], max_length=4, cache_length=2)


def test_alphabet_is_what_the_tasks_check():
    assert uses_only_alphabet(ALPHABET) and not uses_only_alphabet("A")


def test_arithmetic_max_answer_length_per_operation():
    assert Arithmetic(num_digits=3, operations="-").max_demonstration_length == 3
    assert Arithmetic(num_digits=3, operations="-", allow_negative=True).max_demonstration_length == 4
    assert Arithmetic(num_digits=3, operations="+-").max_demonstration_length == 4
    assert Arithmetic(num_digits=3, operations="-*").max_demonstration_length == 6


# --- addition with an optional scratchpad (the GFPO organism's task) -----------------------------------------


def test_scratchpad_addition_verifies_only_the_final_answer():
    task = ScratchpadAddition(min_digits=3, max_digits=3)
    example = Example("472+385=", "857", {"a": 472, "b": 385, "digits": 3, "scratchpad": True})
    assert task.demonstration(example) == "7,5,8|857"
    for right in ("857", " 857 ", "7,5,8|857", "7,5,9|857", "|857", "857|857", "1,2|3|857"):
        assert task.is_correct(example, right), right  # as with a chain of thought, the work is not checked
    for wrong in ("858", "7,5,8|858", "7,5,8|857|8", "0857", "7,5,8|", "7,5,8", "857 |"):
        assert not task.is_correct(example, wrong), wrong


def test_scratchpad_addition_draws_its_sizes_and_demonstrations_as_asked():
    examples = ScratchpadAddition(min_digits=2, max_digits=4, scratchpad_rate=0.3).sample(2000, seed=0)
    digits = np.array([e.meta["digits"] for e in examples])
    assert set(digits) == {2, 3, 4}
    for e in examples:
        a, b = e.prompt[:-1].split("+")
        assert len(a) == len(b) == e.meta["digits"] and int(e.answer) == int(a) + int(b)
    assert abs(np.mean([e.meta["scratchpad"] for e in examples]) - 0.3) < 0.04
    never = ScratchpadAddition(scratchpad_rate=0.0)
    assert all("|" not in never.demonstration(e) for e in never.sample(50, seed=1))
