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


# --- the whole step (exercises "Write the whole step" and "Find the bugs") ---------------------------------------

from rlbook.exercises.dpo import check_dpo_step, reference_dpo_step  # noqa: E402


def _step_with(logps_fn, beta_twice=False, zero_grad=True, swap=False):
    """A DPO step built from ``logps_fn(model, tokenizer, pairs) -> (chosen, rejected)``, with planted bugs."""
    def step(policy, reference, tokenizer, pairs, optimizer, beta):
        with torch.no_grad():
            ref_w, ref_l = logps_fn(reference, tokenizer, pairs)
        w, l = logps_fn(policy, tokenizer, pairs)
        if swap:
            w, l, ref_w, ref_l = l, w, ref_l, ref_w
        delta = (w - ref_w) - (l - ref_l)
        loss = -F.logsigmoid((beta * beta if beta_twice else beta) * delta).mean()
        if zero_grad:
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


def _package_logps(model, tokenizer, pairs):
    from rlbook.dpo import pair_logps

    out = pair_logps(model, tokenizer, pairs)
    return out["chosen"], out["rejected"]


def _padded_logps(model, tokenizer, pairs):
    """Sequence log-probs that also count the padding after each answer (the find-the-bug exercise's bug)."""
    from rlbook.rollout import encode_completions, sequence_logprobs

    prompts = [p.prompt for p in pairs]
    ids, attention, completion = encode_completions(tokenizer, prompts + prompts,
                                                    [p.chosen for p in pairs] + [p.rejected for p in pairs])
    every_column = torch.ones_like(completion)
    logps = sequence_logprobs(model, ids, torch.cat([attention[:, : -completion.shape[1]], every_column], 1),
                              every_column).sum(-1)
    return logps[: len(pairs)], logps[len(pairs):]


def test_step_checker_accepts_the_reference_and_a_solution(capsys):
    check_dpo_step(reference_dpo_step)
    check_dpo_step(_step_with(_package_logps))
    assert capsys.readouterr().out == "ok\nok\n"


@pytest.mark.parametrize("bug", ["beta_twice", "padding", "no_zero_grad", "swapped", "reference_trained"])
def test_step_checker_rejects_planted_bugs(bug):
    if bug == "reference_trained":  # the reference's log-probs keep their graph, and the reference gets a step
        def wrong(policy, reference, tokenizer, pairs, optimizer, beta):
            ref_w, ref_l = _package_logps(reference, tokenizer, pairs)
            w, l = _package_logps(policy, tokenizer, pairs)
            loss = -F.logsigmoid(beta * ((w - ref_w) - (l - ref_l))).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss.item()
    else:
        wrong = _step_with(_padded_logps if bug == "padding" else _package_logps, beta_twice=bug == "beta_twice",
                           zero_grad=bug != "no_zero_grad", swap=bug == "swapped")
    with pytest.raises(AssertionError):
        check_dpo_step(wrong)
