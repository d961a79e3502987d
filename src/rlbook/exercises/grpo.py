"""Exercises of the chapter "GRPO": the group-normalised advantage, GRPO's loss and one whole GRPO step.

Each ``check_<name>(fn)`` runs the reader's ``fn`` and the reference on the same random torch tensors (seeded, so
a failure is reproducible), raises ``AssertionError`` at the first disagreement with the inputs that caused it,
and prints ``ok`` when everything agrees.

- :func:`check_grpo_advantages`: ``fn(rewards, num_generations) -> (N*G,)``, GRPO's advantage
  ``(r_i - mean) / (std + 1e-4)`` inside each contiguous group of ``num_generations`` completions, with the
  *sample* standard deviation (divide by G - 1, as ``torch.std``, TRL and verl do). A group whose rewards are all
  equal must get advantage 0, never NaN. The usual mistakes are the population std (erratum E8) and a division
  without the small constant, which gives 0/0 on such a group (erratum E11).
- :func:`check_grpo_loss`: ``fn(logits, ref_logits, tokens, old_logp, rewards, mask, G, temperature, epsilon,
  beta) -> scalar``, GRPO's loss (eq-grpo-objective) from the policy's and the reference's logits (B, T, V) at
  the completion positions: log-probs at the sampling temperature, group advantages, the clipped surrogate plus
  beta * k3 per token, each completion's token mean, then the mean over completions. The find-the-bug exercise;
  the hints name the four common bugs (beta applied twice, the batch's std, padding counted in a completion's
  mean, log-probs at the wrong temperature).
- :func:`check_grpo_step`: ``fn(policy, reference, optimizer, ids, attention, mask, old_logp, rewards, G,
  epsilon=, beta=, temperature=, max_grad_norm=) -> float``, one whole GRPO update on a sampled batch, against
  the package's pieces (:func:`rlbook.rollout.sequence_logprobs`, :func:`rlbook.losses.policy_loss_of` with
  ``loss_type="grpo"``), on a tiny random model: the loss it returns, the gradients it leaves and the
  parameters after the optimizer's step.

torch is imported inside the functions, so that ``import rlbook.exercises`` stays light for the tabular chapters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from rlbook.exercises._compare import assert_close, call_reader, checker
from rlbook.exercises.pg import _compare, _group_trials

if TYPE_CHECKING:
    import torch

_SEED = 20240612
NUM_TRIALS = 200
EPS = 1e-4


def reference_grpo_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """(N*G,) ``(r_i - mean_G) / (std_G + 1e-4)`` per contiguous group, std with G - 1 in the denominator."""
    groups = rewards.double().view(-1, num_generations)
    centred = groups - groups.mean(-1, keepdim=True)
    std = (centred.pow(2).sum(-1, keepdim=True) / (num_generations - 1)).sqrt()
    return (centred / (std + EPS)).flatten().to(rewards.dtype)


@checker
def check_grpo_advantages(fn: Callable, num_trials: int = NUM_TRIALS, seed: int = _SEED) -> None:
    """Compare ``fn(rewards, num_generations) -> (N*G,)`` with GRPO's group-normalised advantage on random groups."""
    for original, G, got, inputs in _group_trials(fn, num_trials, seed):
        expected = reference_grpo_advantages(original, G)
        if got.shape == expected.shape and not bool(got.isfinite().all()):
            raise AssertionError("your advantages contain NaN or inf: a group whose rewards are all equal has std 0, "
                                 f"so divide by (std + 1e-4), as in erratum E11\n{inputs}")
        hint = ""
        if got.shape == expected.shape:
            groups = original.double().view(-1, G)
            centred = groups - groups.mean(-1, keepdim=True)
            population = (centred / (groups.std(-1, unbiased=False, keepdim=True) + EPS)).flatten()
            with np.errstate(invalid="ignore", divide="ignore"):
                bare = (centred / groups.std(-1, keepdim=True)).flatten()
            flat = original.double()
            batch_z = [(flat - flat.mean()) / (flat.std(unbiased=unbiased) + EPS) for unbiased in (True, False)]
            batch_std = (centred / (flat.std() + EPS)).flatten()
            mine = got.double().numpy()

            def matches(candidate, atol=1e-4):
                return np.allclose(mine, candidate.numpy(), atol=atol, rtol=1e-4)

            if np.allclose(mine, population.numpy(), atol=1e-4, rtol=1e-4):
                hint = (" (you divided by the population std, 1/G inside the square root; GRPO's code uses the "
                        "sample std, 1/(G - 1): see erratum E8)")
            elif np.allclose(mine, bare.numpy(), atol=1e-6, rtol=1e-6, equal_nan=True):
                hint = " (you divided by the std alone; the code divides by (std + 1e-4): see erratum E11)"
            elif any(matches(z) for z in batch_z):
                hint = (" (you normalised over the whole batch: one mean and one std for all N*G rewards; GRPO "
                        "takes both inside each group of num_generations, e.g. rewards.view(-1, G).mean(-1))")
            elif matches(batch_std):
                hint = (" (you centred per group but divided by the batch's std, TRL's scale_rewards='batch'; "
                        "here each group's own std is wanted)")
            elif matches(centred.flatten()):
                hint = " (you only centred the rewards, as Dr. GRPO does; GRPO also divides by the group's std + 1e-4)"
        _compare(got, expected, "GRPO advantage", inputs, hint)
    print("ok")


# ---------------------------------------------------------------------------------------------- GRPO's loss
def reference_grpo_loss(logits, ref_logits, tokens, old_logp, rewards, mask, G, temperature, epsilon=0.2,
                        beta=0.04):
    """GRPO's loss (eq-grpo-objective) from logits (B, T, V) at the completion positions, tokens (B, T)."""
    import torch

    def token_logp(z):
        return (z / temperature).log_softmax(-1).gather(-1, tokens[..., None])[..., 0]

    logp, ref_logp = token_logp(logits), token_logp(ref_logits)
    advantages = reference_grpo_advantages(rewards, G)[:, None].to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - epsilon, 1 + epsilon) * advantages)
    k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    per_token = (-surrogate + beta * k3) * mask
    return (per_token.sum(-1) / mask.sum(-1)).mean()


def _loss_variants(logits, ref_logits, tokens, old_logp, rewards, mask, G, temperature, epsilon, beta):
    """The common bugs, each as the loss it gives: (loss, hint)."""
    import torch

    def loss(temp_policy=temperature, temp_ref=temperature, kl_weight=beta, advantages=None, mean="completion",
             masked=True):
        logp = (logits / temp_policy).log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
        ref_logp = (ref_logits / temp_ref).log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
        A = (reference_grpo_advantages(rewards, G) if advantages is None else advantages)[:, None].to(logp.dtype)
        ratio = torch.exp(logp - old_logp)
        surrogate = torch.minimum(ratio * A, ratio.clamp(1 - epsilon, 1 + epsilon) * A)
        k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
        per_token = (-surrogate + kl_weight * k3) * (mask if masked else torch.ones_like(mask))
        if mean == "completion":
            return (per_token.sum(-1) / (mask.sum(-1) if masked else mask.shape[-1])).mean()
        if mean == "padded":
            return per_token.mean(-1).mean()
        return per_token.sum() / mask.sum()

    flat = rewards.double()
    groups = flat.view(-1, G)
    centred = (groups - groups.mean(-1, keepdim=True)).flatten()
    batch_std = centred / (flat.std() + EPS)
    batch_z = (flat - flat.mean()) / (flat.std() + EPS)
    population = (centred.view(-1, G) / (groups.std(-1, unbiased=False, keepdim=True) + EPS)).flatten()
    twice = " (beta is applied twice: the KL term weighs 2 beta k3; add beta * k3 once, inside the token loss)"
    return [
        (loss(kl_weight=2 * beta), twice),
        (loss() + beta * loss(kl_weight=1.0, advantages=torch.zeros_like(flat)), twice),
        (loss(kl_weight=beta * beta), " (beta is applied twice: the KL term weighs beta**2 k3; once is enough)"),
        (loss(advantages=batch_std), " (the std is taken over the whole batch; GRPO divides by each group's own "
                                     "std, rewards.view(-1, G).std(-1))"),
        (loss(advantages=batch_z), " (the mean and the std are taken over the whole batch; GRPO takes both "
                                   "inside each group of G)"),
        (loss(mean="padded"), " (padding tokens count in each completion's mean: you divide by the padded length "
                              "T, mask.shape[-1], instead of the completion's own length mask.sum(-1))"),
        (loss(masked=False), " (the padding tokens' losses enter the loss: multiply the token losses by the mask "
                             "and divide by mask.sum(-1))"),
        (loss(temp_policy=1.0, temp_ref=1.0), " (the log-probs are taken at temperature 1, but the completions "
                                              "were sampled, and old_logp recorded, at the given temperature: "
                                              "divide the logits by it before log_softmax)"),
        (loss(temp_policy=1.0), " (the policy's log-probs are taken at temperature 1, not at the sampling "
                                "temperature: divide the logits by it before log_softmax)"),
        (loss(temp_ref=1.0), " (the reference's log-probs are taken at temperature 1, not at the sampling "
                             "temperature the policy's use)"),
        (loss(advantages=population), " (you divided by the population std, 1/G inside the square root; GRPO's "
                                      "code uses the sample std: see erratum E8)"),
        (loss(mean="tokens"), " (you averaged over all the batch's tokens, DAPO's token-level loss; GRPO averages "
                              "each completion's tokens first, then the completions)"),
    ]


def _random_loss_inputs(rng: np.random.Generator):
    """Random GRPO loss inputs with every bug visible: temperature != 1, padding, beta > 0, ratios off 1."""
    import torch

    G = int(rng.choice([2, 4]))
    N, T, V = int(rng.integers(2, 4)), int(rng.integers(3, 7)), int(rng.integers(5, 12))
    B = N * G
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64) * 2
    ref_logits = logits + torch.randn(B, T, V, generator=gen, dtype=torch.float64) * 0.5
    tokens = torch.randint(0, V, (B, T), generator=gen)
    lengths = torch.as_tensor(rng.integers(1, T + 1, size=B))
    lengths[0] = T  # the padded length is reached, and at least one row is shorter
    lengths[1] = max(1, T - 2)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    temperature = float(rng.choice([0.7, 1.3]))
    true_logp = (logits / temperature).log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
    old_logp = (true_logp + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3) * mask
    rewards = torch.as_tensor(rng.integers(0, 2, size=B), dtype=torch.float64)
    rewards[:2] = torch.tensor([1.0, 0.0])  # the first group has a right and a wrong answer
    if N > 2:
        rewards[-G:] = 1.0  # an all-right group: its advantages must be 0
    return dict(logits=logits, ref_logits=ref_logits, tokens=tokens, old_logp=old_logp, rewards=rewards,
                mask=mask, G=G, temperature=temperature, epsilon=0.2, beta=float(rng.choice([0.04, 0.5])))


@checker
def check_grpo_loss(fn: Callable, num_trials: int = 20, seed: int = _SEED) -> None:
    """Compare ``fn(logits, ref_logits, tokens, old_logp, rewards, mask, G, temperature, epsilon, beta)`` with
    GRPO's loss, its value and its gradient with respect to the policy's logits, on random inputs."""
    import torch

    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        arguments = _random_loss_inputs(rng)
        a = arguments
        inputs = (f"  inputs of trial {trial} (seed {seed}): G={a['G']}, temperature={a['temperature']}, "
                  f"beta={a['beta']}, epsilon={a['epsilon']}, logits of shape {tuple(a['logits'].shape)}, "
                  f"completion lengths {a['mask'].sum(-1).int().tolist()}, rewards {a['rewards'].tolist()}")
        logits = a["logits"].clone().requires_grad_()
        got = call_reader(fn, (logits, *[a[k] for k in ("ref_logits", "tokens", "old_logp", "rewards", "mask",
                                                          "G", "temperature", "epsilon", "beta")]), inputs)
        if not isinstance(got, torch.Tensor) or got.dim() != 0:
            raise AssertionError(f"your function returned {type(got).__name__}"
                                 f"{'' if not isinstance(got, torch.Tensor) else ' of shape ' + str(tuple(got.shape))}"
                                 f"; it must return the loss as a 0-dim tensor (a scalar with a gradient)\n{inputs}")
        if not got.requires_grad:
            raise AssertionError(f"your loss has no gradient with respect to the logits (detached somewhere?)\n"
                                 f"{inputs}")
        (grad,) = torch.autograd.grad(got, logits)
        reference_logits = a["logits"].clone().requires_grad_()
        expected = reference_grpo_loss(reference_logits, *[a[k] for k in (
            "ref_logits", "tokens", "old_logp", "rewards", "mask", "G", "temperature", "epsilon", "beta")])
        (expected_grad,) = torch.autograd.grad(expected, reference_logits)
        hint = ""
        value = float(got.detach())
        if not np.isclose(value, float(expected.detach()), atol=1e-7, rtol=1e-6):
            with torch.no_grad():
                for candidate, why in _loss_variants(**a):
                    if np.isclose(value, float(candidate), atol=1e-7, rtol=1e-6):
                        hint = why
                        break
        assert_close(value, float(expected.detach()), "GRPO loss", atol=1e-7, rtol=1e-6, hint=hint, inputs=inputs)
        assert_close(grad.numpy(), expected_grad.numpy(), "the gradient of your loss with respect to the logits",
                     atol=1e-7, rtol=1e-6, hint=" (the value is right but the gradient is not: is a term detached, "
                     "or the ratio computed from a detached logp?)", inputs=inputs)
    print("ok")


# ---------------------------------------------------------------------------------------------- the whole step
def reference_grpo_step(policy, reference, optimizer, ids, attention, mask, old_logp, rewards, G, epsilon=0.2,
                    beta=0.04, temperature=1.0, max_grad_norm=1.0) -> float:
    """One GRPO update with the package's pieces: its log-probs, its advantages and its loss
    (``loss_type="grpo"``), then clip and step."""
    import torch

    from rlbook.losses import policy_loss_of
    from rlbook.objectives import group_advantages
    from rlbook.rollout import sequence_logprobs

    with torch.no_grad():
        ref_logp = sequence_logprobs(reference, ids, attention, mask, temperature=temperature)
    logp = sequence_logprobs(policy, ids, attention, mask, temperature=temperature)
    loss, _ = policy_loss_of(logp, old_logp, group_advantages(rewards, G), mask, loss_type="grpo",
                             epsilon=epsilon, beta=beta, ref_logp=ref_logp)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def _random_step_inputs(rng: np.random.Generator, trial: int):
    """A tiny random policy and reference, and a random batch in the rollout layout: left-padded prompts,
    completions that end with EOS (or run to the budget), padding after."""
    import torch

    from rlbook.lm.model import build_model
    from rlbook.lm.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    policy = build_model("tiny", seed=int(rng.integers(1000)), num_hidden_layers=1)
    reference = build_model("tiny", seed=int(rng.integers(1000, 2000)), num_hidden_layers=1)
    for p in reference.parameters():
        p.requires_grad_(False)
    G, N, P, T = int(rng.choice([2, 4])), 2, int(rng.integers(2, 5)), int(rng.integers(3, 7))
    B = N * G
    prompt_lengths = np.repeat(rng.integers(1, P + 1, size=N), G)
    prompt_lengths[0] = P
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = T
    ids = torch.full((B, P + T), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((B, P + T), dtype=torch.long)
    for row in range(B):
        p, n = int(prompt_lengths[row]), int(lengths[row])
        prompt = rng.integers(4, len(tokenizer), size=p)
        ids[row, P - p : P] = torch.as_tensor(prompt if row % G == 0 else ids[row - 1, P - p : P].numpy())
        ids[row, P : P + n] = torch.as_tensor(rng.integers(4, len(tokenizer), size=n))
        if n < T or rng.random() < 0.5:
            ids[row, P + n - 1] = tokenizer.eos_token_id
        attention[row, P - p : P + n] = 1
    mask = attention[:, P:].clone()
    with torch.no_grad():
        from rlbook.rollout import sequence_logprobs

        temperature = float(rng.choice([1.0, 0.8]))
        true_logp = sequence_logprobs(policy, ids, attention, mask, temperature=temperature)
        noise = torch.as_tensor(rng.normal(0.0, 0.3, size=(B, T)), dtype=torch.float32)
        old_logp = (true_logp + noise) * mask
    rewards = torch.as_tensor(rng.integers(0, 2, size=B), dtype=torch.float32)
    rewards[:2] = torch.tensor([1.0, 0.0])
    max_grad_norm = [1e9, 1e-3, 1.0][trial % 3]  # unclipped, clipped, and the preset's
    settings = dict(epsilon=0.2, beta=float(rng.choice([0.04, 0.3])), temperature=temperature,
                    max_grad_norm=max_grad_norm)
    return policy, reference, (ids, attention, mask, old_logp, rewards, G), settings


@checker
def check_grpo_step(fn: Callable, num_trials: int = 6, seed: int = _SEED) -> None:
    """Run ``fn(policy, reference, optimizer, ids, attention, mask, old_logp, rewards, G, epsilon=, beta=,
    temperature=, max_grad_norm=) -> float`` and the package's GRPO step on copies of a tiny random policy and
    a random batch: the loss returned, the gradients left in ``p.grad`` and the parameters after the step."""
    import copy

    import torch

    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        policy, reference, batch, settings = _random_step_inputs(rng, trial)
        ids, attention, mask, old_logp, rewards, G = batch
        inputs = (f"  inputs of trial {trial} (seed {seed}): G={G}, {len(ids)} completions, settings {settings}, "
                  f"completion lengths {mask.sum(-1).tolist()}, rewards {rewards.tolist()}")
        mine, theirs = copy.deepcopy(policy), copy.deepcopy(policy)
        for p in mine.parameters():  # stale gradients from an earlier step: the step must clear them
            p.grad = torch.full_like(p, 0.5)
        lr = 0.1  # plain SGD, so that the parameters after the step show the gradient that was applied
        before = [t.clone() for t in batch if isinstance(t, torch.Tensor)]
        got = call_reader(fn, (mine, reference, torch.optim.SGD(mine.parameters(), lr=lr), *batch), inputs,
                          kwargs=settings)
        if any(not b.equal(t) for b, t in zip(before, [t for t in batch if isinstance(t, torch.Tensor)])):
            raise AssertionError(f"your function changed its inputs in place; work on copies\n{inputs}")
        expected = reference_grpo_step(theirs, reference, torch.optim.SGD(theirs.parameters(), lr=lr), *batch,
                                   **settings)
        try:
            value = float(got)
        except (TypeError, ValueError):
            raise AssertionError(f"your function returned {type(got).__name__}; it must return the loss as a float "
                                 f"(loss.item())\n{inputs}") from None
        assert_close(value, expected, "the loss your step returned", atol=1e-6, rtol=1e-5,
                     hint=" (the loss itself is wrong: check_grpo_loss names the common bugs)", inputs=inputs)
        for (name, p), q in zip(mine.named_parameters(), theirs.parameters()):
            if p.grad is None:
                raise AssertionError(f"{name} has no gradient after your step: call loss.backward()\n{inputs}")
            hint = ""
            if np.allclose(p.grad.numpy(), q.grad.numpy() + 0.5, atol=1e-5, rtol=1e-4):
                hint = " (the stale gradients are still there: call optimizer.zero_grad() before backward)"
            elif settings["max_grad_norm"] < 1e6:
                hint = (f" (is the gradient norm clipped at max_grad_norm={settings['max_grad_norm']}, after "
                        f"backward and before optimizer.step()?)")
            assert_close(p.grad.numpy(), q.grad.numpy(), f"the gradient of {name} after your step", atol=1e-6,
                         rtol=1e-4, hint=hint, inputs=inputs)
            moved = not np.allclose(p.detach().numpy(), policy.state_dict()[name].numpy())
            assert_close(p.detach().numpy(), q.detach().numpy(), f"{name} after your step", atol=1e-6, rtol=1e-5,
                         hint="" if moved else " (the parameters did not move: call optimizer.step())",
                         inputs=inputs)
    print("ok")
