"""The checker of the chapter "GAPO" accepts correct solutions and rejects typical mistakes."""

import pytest

from rlbook.checkpoints import RECIPES
from rlbook.exercises import check_gan_pairs
from rlbook.exercises.gapo import reference_gan_pairs
from rlbook.gapo import fresh_pairs


def gan_pairs(prompts, references, samples):
    pairs = []
    for prompt, reference, sample in zip(prompts, references, samples):
        if sample.strip() != reference:
            pairs.append((prompt, reference, sample.strip()))
    return pairs


def test_checker_accepts_a_solution_and_the_reference(capsys):
    check_gan_pairs(gan_pairs)
    check_gan_pairs(reference_gan_pairs)
    assert capsys.readouterr().out == "ok\nok\n"


def test_reference_matches_the_package():
    task = RECIPES["constraint_string"].make_task()
    examples = task.sample(6, 0)
    refs = [task.demonstration(e) for e in examples]
    samples = [refs[0], " " + refs[1], "abc", "", refs[4] + "x", "zz "]
    expected = [(p.prompt, p.chosen, p.rejected) for p in fresh_pairs(task, list(zip(examples, samples)))]
    assert reference_gan_pairs([e.prompt for e in examples], refs, samples) == expected


def test_checker_rejects_typical_mistakes():
    def swapped(prompts, references, samples):
        return [(p, s, r) for p, r, s in gan_pairs(prompts, references, samples)]

    def keeps_copies(prompts, references, samples):
        return [(p, r, s.strip()) for p, r, s in zip(prompts, references, samples)]

    def no_strip(prompts, references, samples):
        return [(p, r, s) for p, r, s in zip(prompts, references, samples) if s != r]

    def drops_all(prompts, references, samples):
        return []

    for wrong in (swapped, keeps_copies, no_strip, drops_all):
        with pytest.raises(AssertionError):
            check_gan_pairs(wrong)
