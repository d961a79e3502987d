"""Exercises of the chapter "The policy-gradient theorem": discounted reward-to-go, the leave-one-out baseline and
one whole REINFORCE step.

Each ``check_<name>(fn)`` runs the reader's ``fn`` and the reference on the same random torch tensors (seeded, so
a failure is reproducible), raises ``AssertionError`` at the first disagreement with the inputs that caused it,
and prints ``ok`` when everything agrees.

- :func:`check_discounted_pg_weights`: ``fn(rewards, mask, gamma) -> (B, T)``, the weight that multiplies
  ``grad log pi(a_t | s_t)`` in the gradient of the *discounted* objective: ``gamma^t * G_t`` with the reward-to-go
  ``G_t = sum_{k >= t} gamma^(k - t) r_k`` over the row's real steps (t counted from 0), and 0 on padding. The
  usual mistake is to forget the ``gamma^t`` (erratum E4); the second is to let padding leak into ``G_t``.
- :func:`check_leave_one_out_advantages`: ``fn(rewards, num_generations) -> (N*G,)``, RLOO's advantage
  ``r_i - mean_{j != i} r_j`` inside each contiguous group of ``num_generations`` completions.
- :func:`check_reinforce_step`: ``fn(logits, tokens, mask, rewards, num_generations, max_completion_length,
  baseline) -> loss``, the chapter's minimal loop's step from a given sample: the sampled tokens' log-probs, the
  advantages, the loss ``-(1 / (B L)) sum_i A_i sum_t m_t log pi(o_t)`` and ``loss.backward()``. The gradient
  left in ``logits.grad`` is compared, and the loss's value in either of its two usual forms. The usual mistakes
  (a token mean for the constant denominator, the wrong sign, padding scored, the wrong baseline) are named.

torch is imported inside the functions, so that ``import rlbook.exercises`` stays light for the tabular chapters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from rlbook.exercises._compare import as_tensor, assert_close, call_reader, checker, show

if TYPE_CHECKING:
    import torch

_SEED = 20240611
NUM_TRIALS = 200


# ---------------------------------------------------------------------------------------------- references
def reference_discounted_pg_weights(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, T) ``gamma^t * G_t`` with ``G_t = sum_{k >= t} gamma^(k - t) r_k`` over the mask; 0 on padding.

    Written as a loop over time (backwards: ``G_t = r_t + gamma G_{t+1}``), the way the definition reads.
    """
    import torch

    kept = rewards.double().where(mask.bool(), 0.0)
    B, T = kept.shape
    weights = torch.zeros(B, T, dtype=torch.float64)
    to_go = torch.zeros(B, dtype=torch.float64)
    for t in reversed(range(T)):
        to_go = kept[:, t] + gamma * to_go
        weights[:, t] = gamma**t * to_go
    return weights.where(mask.bool(), 0.0).to(rewards.dtype)


def reference_leave_one_out_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """(N*G,) ``r_i - (sum of the group's rewards - r_i) / (G - 1)`` for contiguous groups of ``G``."""
    G = num_generations
    groups = rewards.double().view(-1, G)
    others = (groups.sum(-1, keepdim=True) - groups) / (G - 1)
    return (groups - others).flatten().to(rewards.dtype)


# ---------------------------------------------------------------------------------------------- random inputs
def _random_episodes(rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(B, T) float32 rewards, a right-padded (B, T) long mask with at least one real step per row, and gamma.

    Rewards are dense in some trials and only on each row's last real step (as for a language model) in others;
    padding holds large numbers, so a reward-to-go that sums past the end of a row is visibly wrong.
    """
    import torch

    B, T = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    lengths = rng.integers(1, T + 1, size=B)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    if rng.random() < 0.5:
        rewards = rng.normal(0.0, 1.0, size=(B, T))
    else:
        rewards = np.zeros((B, T))
        rewards[np.arange(B), lengths - 1] = rng.integers(0, 2, size=B)
    rewards = np.where(mask == 1, rewards, rng.normal(0.0, 100.0, size=(B, T)))
    gamma = float(rng.choice([0.0, 0.5, 0.9, 0.99, 1.0, float(rng.uniform(0.0, 1.0))]))
    return torch.as_tensor(rewards, dtype=torch.float32), torch.as_tensor(mask, dtype=torch.long), gamma


def _random_groups(rng: np.random.Generator) -> tuple[torch.Tensor, int]:
    """(N*G,) float32 rewards in N contiguous groups of G >= 2: 0/1 rewards (with ties), groups that are all
    equal (where a division by the std needs its small constant), or reals."""
    import torch

    N, G = int(rng.integers(1, 5)), int(rng.integers(2, 9))
    kind = rng.random()
    if kind < 0.4:
        rewards = rng.integers(0, 2, size=N * G).astype(float)
    elif kind < 0.55:
        rewards = np.repeat(rng.integers(0, 2, size=N).astype(float), G)
    else:
        rewards = rng.normal(0.0, 2.0, size=N * G)
    return torch.as_tensor(rewards, dtype=torch.float32), G


def _group_trials(fn: Callable, num_trials: int, seed: int):
    """For each random trial of a group-advantage exercise: ``(rewards, G, the reader's (N*G,) result, a
    description of the inputs)``; a crash or an in-place change of the rewards is reported with the inputs."""
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        rewards, G = _random_groups(rng)
        original = rewards.clone()
        inputs = (f"  inputs of trial {trial} (seed {seed}): num_generations={G}, rewards in {len(rewards) // G} "
                  f"group(s) of {G} =\n{show(rewards.view(-1, G), limit=64)}")
        got = as_tensor(call_reader(fn, (rewards, G), inputs), "a (N*G,) float tensor", inputs)
        if not rewards.equal(original):
            raise AssertionError(f"your function changed rewards in place; work on a copy\n{inputs}")
        yield original, G, got, inputs


# ---------------------------------------------------------------------------------------------- helpers
def _compare(got: torch.Tensor, expected: torch.Tensor, what: str, inputs: str, hint: str = "") -> None:
    if tuple(got.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}\n{inputs}")
    assert_close(got.double().numpy(), expected.double().numpy(), what, atol=1e-4, rtol=1e-4, hint=hint, inputs=inputs)


# ---------------------------------------------------------------------------------------------- checkers
@checker
def check_discounted_pg_weights(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(rewards, mask, gamma) -> (B, T)`` with ``gamma^t G_t`` (0 on padding) on random episodes."""
    import torch

    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        rewards, mask, gamma = _random_episodes(rng)
        originals = rewards.clone(), mask.clone()
        inputs = (f"  inputs of trial {trial} (seed {seed}): gamma={gamma}, rewards =\n{rewards}\n"
                  f"  mask =\n{mask}")
        got = as_tensor(call_reader(fn, (rewards, mask, gamma), inputs), "a (B, T) float tensor", inputs)
        if not (rewards.equal(originals[0]) and mask.equal(originals[1])):
            raise AssertionError(f"your function changed its inputs in place; work on a copy\n{inputs}")
        expected = reference_discounted_pg_weights(rewards, mask, gamma)
        hint = ""
        if 0.0 < gamma < 1.0 and got.shape == expected.shape:  # the common mistake: G_t without gamma^t
            powers = torch.as_tensor(gamma ** np.arange(rewards.shape[1], dtype=float))
            if np.allclose(got.double().numpy(), (expected.double() / powers).numpy(), atol=1e-4, rtol=1e-4):
                hint = " (your weights are G_t without the gamma^t in front: see erratum E4)"
        _compare(got, expected, "gamma^t * G_t", inputs, hint)
    print("ok")


@checker
def check_leave_one_out_advantages(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(rewards, num_generations) -> (N*G,)`` with the leave-one-out advantage on random groups."""
    for original, G, got, inputs in _group_trials(fn, num_trials, seed):
        expected = reference_leave_one_out_advantages(original, G)
        hint = ""
        centred = (original.double().view(-1, G) - original.double().view(-1, G).mean(-1, keepdim=True)).flatten()
        if got.shape == expected.shape and np.allclose(got.double().numpy(), centred.numpy(), atol=1e-4, rtol=1e-4) \
                and not np.allclose(centred.numpy(), expected.double().numpy(), atol=1e-4, rtol=1e-4):
            hint = " (you subtracted the mean of the whole group, r_i included: that is (G - 1)/G times RLOO)"
        _compare(got, expected, "leave-one-out advantage", inputs, hint)
    print("ok")


# ---------------------------------------------------------------------------------------------- the whole step
BASELINES = ("none", "rloo")


def _advantages(rewards: torch.Tensor, num_generations: int, baseline: str) -> torch.Tensor:
    """(N*G,) REINFORCE's advantages: the rewards (``"none"``) or leave-one-out advantages (``"rloo"``)."""
    if baseline == "none":
        return rewards
    return reference_leave_one_out_advantages(rewards, num_generations)


def reference_reinforce_step(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor,
                             num_generations: int, max_completion_length: int, baseline: str) -> torch.Tensor:
    """One REINFORCE step of the chapter's minimal loop, from the sample to ``backward``; returns the loss.

    ``logits`` (B, T, V): the policy's logits at the positions that predict each completion token (a leaf with
    ``requires_grad``); ``tokens`` (B, T): the sampled tokens; ``mask`` (B, T): 1 on each row's real tokens (right
    padding); ``rewards`` (B,) in contiguous groups of ``num_generations``; ``baseline`` "none" (A_i = r_i, the
    preset "reinforce") or "rloo" (the preset "rloo"). The loss is
    ``-(1 / (B L)) sum_i A_i sum_t m_t log pi(o_t)`` with the constant ``L = max_completion_length``.
    """
    import torch

    logp = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    logp = torch.where(mask.bool(), logp, torch.zeros((), dtype=logp.dtype))
    advantages = _advantages(rewards, num_generations, baseline).to(logp.dtype)
    loss = -(advantages[:, None] * logp).sum() / (len(rewards) * max_completion_length)
    if loss.requires_grad:
        loss.backward()
    return loss


def _random_step_inputs(rng: np.random.Generator) -> dict:
    """Random arguments of a REINFORCE step: N prompts x G completions of up to T tokens over V symbols, a
    right-padded mask with at least one token per row (padding holds arbitrary token ids), 0/1 or real rewards,
    L >= T, and a baseline."""
    import torch

    N, G = int(rng.integers(1, 4)), int(rng.integers(2, 6))
    B, T, V = N * G, int(rng.integers(1, 7)), int(rng.integers(3, 9))
    lengths = rng.integers(1, T + 1, size=B)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    if rng.random() < 0.5:
        rewards = rng.integers(0, 2, size=B).astype(float)
    else:
        rewards = rng.normal(0.0, 2.0, size=B)
    return dict(logits=torch.as_tensor(rng.normal(0.0, 1.5, size=(B, T, V)), dtype=torch.float32),
                tokens=torch.as_tensor(rng.integers(0, V, size=(B, T)), dtype=torch.long),
                mask=torch.as_tensor(mask, dtype=torch.long),
                rewards=torch.as_tensor(rewards, dtype=torch.float32),
                num_generations=G, max_completion_length=T + int(rng.integers(0, 4)),
                baseline=str(rng.choice(BASELINES)))


def _step_gradient(arguments: dict, **changes) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, gradient of the loss with respect to the logits) of the reference step on a fresh leaf, or of a
    known mistake: ``normaliser="tokens"`` (a mean over the real tokens), ``baseline="mean"`` (the group mean,
    r_i included), ``masked=False`` (padding scored), ``sign=+1`` (gradient descent on J)."""
    import torch

    logits = arguments["logits"].detach().clone().requires_grad_(True)
    tokens, mask, rewards = arguments["tokens"], arguments["mask"], arguments["rewards"]
    G, L = arguments["num_generations"], arguments["max_completion_length"]
    logp = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    if changes.get("masked", True):
        logp = torch.where(mask.bool(), logp, torch.zeros((), dtype=logp.dtype))
    baseline = changes.get("baseline", arguments["baseline"])
    if baseline == "mean":
        groups = rewards.view(-1, G)
        advantages = (groups - groups.mean(-1, keepdim=True)).flatten()
    else:
        advantages = _advantages(rewards, G, baseline)
    total = (advantages[:, None] * logp).sum()
    normaliser = mask.sum() if changes.get("normaliser") == "tokens" else len(rewards) * L
    loss = changes.get("sign", -1) * total / normaliser
    loss.backward()
    return loss.detach(), logits.grad


def _step_hint(got: torch.Tensor, arguments: dict) -> str:
    """The known mistake whose gradient equals the reader's, if one does."""
    mistakes = [(dict(normaliser="tokens"), "you divided by the number of real tokens; REINFORCE's loss here "
                 "divides by the constant B * max_completion_length (the preset's loss_type 'dr_grpo')"),
                (dict(sign=+1), "your gradient has the wrong sign: the loss is MINUS the advantage-weighted "
                 "log-probability, so that gradient descent on it climbs J"),
                (dict(masked=False), "the padding's log-probabilities entered the loss: keep only mask == 1"),
                (dict(baseline="none"), "you left the rewards as they are; baseline='rloo' subtracts the mean "
                 "reward of the other G - 1 completions of the group"),
                (dict(baseline="mean"), "you subtracted the mean of the whole group, r_i included: that is "
                 "(G - 1)/G times RLOO's advantage")]
    for change, hint in mistakes:
        if change.get("baseline") == arguments["baseline"]:
            continue
        _, wrong = _step_gradient(arguments, **change)
        if got.shape == wrong.shape and np.allclose(got.numpy(), wrong.numpy(), atol=1e-5, rtol=1e-4):
            return f" ({hint})"
    return ""


@checker
def check_reinforce_step(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(logits, tokens, mask, rewards, num_generations, max_completion_length, baseline)``, one
    REINFORCE step (advantages, loss, ``loss.backward()``; returns the loss), with the reference on random
    batches: the gradient it leaves in ``logits.grad`` and the loss it returns, written either as
    ``-A log pi`` or as ``-rho A`` with ``rho = pi / sg(pi) = 1`` (their values differ, their gradients agree)."""
    import torch

    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        arguments = _random_step_inputs(rng)
        logits = arguments["logits"].clone().requires_grad_(True)
        given = {**arguments, "logits": logits}
        originals = {k: v.clone() for k, v in arguments.items() if isinstance(v, torch.Tensor) and k != "logits"}
        inputs = (f"  inputs of trial {trial} (seed {seed}): num_generations={arguments['num_generations']}, "
                  f"max_completion_length={arguments['max_completion_length']}, "
                  f"baseline={arguments['baseline']!r},\n  rewards = {show(arguments['rewards'], limit=16)}\n"
                  f"  mask =\n{show(arguments['mask'], limit=64)}\n  tokens =\n{show(arguments['tokens'], limit=64)}")
        got = as_tensor(call_reader(fn, tuple(given.values()), inputs), "the loss, a 0-dim tensor", inputs)
        if any(not given[k].equal(v) for k, v in originals.items()) or not logits.detach().equal(arguments["logits"]):
            raise AssertionError(f"your function changed its inputs in place; work on a copy\n{inputs}")
        if tuple(got.shape) != ():
            raise AssertionError(f"the loss: expected a 0-dim tensor (shape ()), got shape {tuple(got.shape)}\n"
                                 f"{inputs}")
        if not bool(torch.isfinite(got)):
            raise AssertionError(f"the loss must be finite, got {got.item()} (NaN or inf)\n{inputs}")
        if logits.grad is None:
            raise AssertionError("logits.grad is None after your step: compute the loss from logits and call "
                                 f"loss.backward() before returning it\n{inputs}")
        loss, gradient = _step_gradient(arguments)
        grad = logits.grad.detach().cpu()
        assert_close(grad.double().numpy(), gradient.double().numpy(), "the gradient in logits.grad",
                     atol=1e-5, rtol=1e-4, hint=_step_hint(grad, arguments), inputs=inputs)
        mask, L = arguments["mask"].float(), arguments["max_completion_length"]
        advantages = _advantages(arguments["rewards"], arguments["num_generations"], arguments["baseline"])
        ratio_form = -(advantages[:, None] * mask).sum() / (len(advantages) * L)  # -rho A at rho = 1
        if not np.isclose(float(got), float(ratio_form), atol=1e-5, rtol=1e-4):
            assert_close(float(got), float(loss), "the loss you returned (-A log pi summed over the real tokens, "
                         "divided by B * max_completion_length)", atol=1e-5, rtol=1e-4, inputs=inputs)
    print("ok")
