"""The DPO chapter's minimal loop is the package's DPO step: one step of the cell tagged ``minimal-loop`` in
``book/part5/dpo.md`` and one step of :func:`rlbook.dpo.train_dpo` (and of :func:`rlbook.dpo.dpo_batch`) on the
same batch give the same loss and the same gradient of every parameter, to 1e-6.

The policy starts a little away from its frozen reference (a seeded perturbation of the shipped arithmetic
policy), so that the log-ratio margins differ from pair to pair and the per-pair weights sigma(-beta Delta) are
not all one half. beta is 0.1, TRL's default. The two compute the same numbers along different float32 paths (the
book's loop calls the Hugging Face forward, the package its lean forward and a log-softmax over the scored tokens
only): the largest gradient difference is a few 1e-7."""

import copy

import pytest
import torch

from minimal_loops import check_torch_only, load_minimal_loop
from rlbook.checkpoints import RECIPES, load_base_policy
from rlbook.dpo import DPOConfig, dpo_batch, pair_logps, train_dpo
from rlbook.tasks.preferences import build_preference_pairs

TOL = dict(atol=1e-6, rtol=1e-6)
BETA, LR = 0.1, 1e-3


@pytest.fixture(scope="module")
def setting():
    torch.set_num_threads(1)
    loop = load_minimal_loop("part5/dpo")
    policy, tokenizer = load_base_policy("arithmetic")
    reference = copy.deepcopy(policy).eval()
    start = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in start.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    pairs = build_preference_pairs(RECIPES["arithmetic"].make_task(), 16, seed=0, split="train")
    return loop, start, reference, tokenizer, pairs


def book_step(setting):
    """One step of the chapter's loop; returns (loss, the policy whose .grad holds the step's gradient)."""
    loop, start, reference, tokenizer, pairs = setting
    model = copy.deepcopy(start).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    loss = loop["dpo_step"](model, reference, tokenizer, pairs, optimizer, BETA)
    return loss, model


def assert_same_gradients(mine, theirs):
    for (name, p), q in zip(mine.named_parameters(), theirs.parameters()):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m: f"gradient of {name}: {m}")


def test_the_loop_is_one_cell_of_torch_only(setting):
    loop = setting[0]
    assert {"encode_pairs", "sequence_logps", "dpo_batch_loss", "dpo_step"} <= set(loop)
    check_torch_only("part5/dpo")


def test_one_step_equals_one_step_of_train_dpo(setting):
    _, start, reference, tokenizer, pairs = setting
    loss, mine = book_step(setting)
    theirs = copy.deepcopy(start)
    config = DPOConfig(beta=BETA, learning_rate=LR, max_steps=1, per_device_train_batch_size=len(pairs),
                       max_grad_norm=None, seed=0)
    history = train_dpo(theirs, tokenizer, pairs, config=config, ref_model=reference)
    # one batch of every pair, in train_dpo's shuffled order: the same mean up to the order of a float sum
    torch.testing.assert_close(torch.tensor(loss), torch.tensor(history[0]["loss"]), **TOL)
    assert_same_gradients(mine, theirs)


def test_one_step_equals_dpo_batch_on_the_same_batch(setting):
    _, start, reference, tokenizer, pairs = setting
    loss, mine = book_step(setting)
    theirs = copy.deepcopy(start).train()
    with torch.no_grad():
        ref = pair_logps(reference, tokenizer, pairs)
    package_loss, _ = dpo_batch(theirs, tokenizer, pairs, ref, DPOConfig(beta=BETA))
    package_loss.backward()
    torch.testing.assert_close(torch.tensor(loss), package_loss.detach(), **TOL)
    assert_same_gradients(mine, theirs)


def test_the_loops_pieces_agree_with_the_packages(setting):
    """Its sequence log-probs are pair_logps's; its loss is the mean of rlbook.objectives.dpo_loss."""
    from rlbook.objectives import dpo_loss

    loop, start, reference, tokenizer, pairs = setting
    with torch.no_grad():
        mine = loop["sequence_logps"](start, *loop["encode_pairs"](tokenizer, pairs))
        theirs, ref = pair_logps(start, tokenizer, pairs), pair_logps(reference, tokenizer, pairs)
        ref_mine = loop["sequence_logps"](reference, *loop["encode_pairs"](tokenizer, pairs))
    torch.testing.assert_close(mine, torch.cat([theirs["chosen"], theirs["rejected"]]), atol=1e-5, rtol=1e-5)
    package = dpo_loss(theirs["chosen"], theirs["rejected"], ref["chosen"], ref["rejected"], beta=BETA)[0].mean()
    torch.testing.assert_close(loop["dpo_batch_loss"](mine, ref_mine, BETA), package, **TOL)
