"""The checker of the chapter "Bradley–Terry and DPO" accepts correct solutions and rejects typical mistakes."""

import pytest
import torch
import torch.nn.functional as F

from rlbook.exercises import check_dpo_loss
from rlbook.exercises.dpo import reference_dpo_loss


def dpo(chosen, rejected, ref_chosen, ref_rejected, beta):
    return -F.logsigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))


def test_checker_accepts_a_solution_and_the_reference(capsys):
    check_dpo_loss(dpo)
    check_dpo_loss(reference_dpo_loss)
    assert capsys.readouterr().out == "ok\nok\n"


def test_checker_accepts_detached_reference_log_probs(capsys):
    """The reference model is frozen: detaching its log-probs (as TRL does) is right, not a mistake."""
    def detached(chosen, rejected, ref_chosen, ref_rejected, beta):
        return dpo(chosen, rejected, ref_chosen.detach(), ref_rejected.detach(), beta)

    check_dpo_loss(detached)
    assert capsys.readouterr().out == "ok\n"


def test_checker_rejects_typical_mistakes():
    def beta_twice(chosen, rejected, ref_chosen, ref_rejected, beta):  # erratum E12
        r_w, r_l = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
        return -F.logsigmoid(beta * (r_w - r_l))

    def naive_log(chosen, rejected, ref_chosen, ref_rejected, beta):  # overflows on large margins
        return -torch.log(torch.sigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected))))

    def no_reference(chosen, rejected, ref_chosen, ref_rejected, beta):
        return -F.logsigmoid(beta * (chosen - rejected))

    def mean_not_per_pair(chosen, rejected, ref_chosen, ref_rejected, beta):
        return dpo(chosen, rejected, ref_chosen, ref_rejected, beta).mean()

    def swapped(chosen, rejected, ref_chosen, ref_rejected, beta):
        return dpo(rejected, chosen, ref_rejected, ref_chosen, beta)

    for wrong in (beta_twice, naive_log, no_reference, mean_not_per_pair, swapped):
        with pytest.raises(AssertionError):
            check_dpo_loss(wrong)


def test_not_attempted_passes_through():
    def stub(*args):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_dpo_loss(stub)
