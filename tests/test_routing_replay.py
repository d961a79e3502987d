"""Routing Replay (rlbook.lm.moe.replay_routes, RLConfig.routing_replay): the GSPO paper's baseline for GRPO on
mixture-of-experts policies computes pi_theta's log-probs on the experts pi_old routed each token to."""

import numpy as np
import pytest
import torch

from rlbook.lm import build_model, build_tokenizer
from rlbook.lm.moe import completion_routing_changed, expert_choices, replay_routes, routers, routing_changed
from rlbook.rollout import generate_rollouts, sequence_logprobs
from rlbook.tasks import get_task
from rlbook.trainer import Trainer, preset

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def moe(seed=0):
    return build_model("tiny", arch="qwen3_moe", seed=seed, num_experts=8, num_experts_per_tok=2)


@pytest.fixture(scope="module")
def rollout():
    """A few sampled completions of a tiny 8-expert MoE: (input_ids, attention_mask, completion mask)."""
    tokenizer = build_tokenizer()
    batch = generate_rollouts(moe(), tokenizer, ["12+34=", "7+5=", "99+1="], num_generations=2, max_new_tokens=6,
                              seed=0)
    return batch.input_ids, batch.attention_mask, batch.completion_mask.float()


def experts_used(model, input_ids, attention_mask, mask):
    """(layers, B, L, k) the experts the expert modules were handed in one log-prob forward (sorted per token)."""
    seen = []
    modules = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    hooks = [m.register_forward_pre_hook(lambda module, args: seen.append(args[1])) for m in modules]
    try:
        with torch.no_grad():
            sequence_logprobs(model, input_ids, attention_mask, mask)
    finally:
        for hook in hooks:
            hook.remove()
    B, L = input_ids.shape
    return torch.stack([indices.reshape(B, L, -1).sort(-1).values for indices in seen])


def test_replay_with_unchanged_weights_gives_the_plain_log_probs(rollout):
    input_ids, attention_mask, mask = rollout
    model = moe()
    routes = expert_choices(model, input_ids, attention_mask)
    with torch.no_grad():
        plain = sequence_logprobs(model, input_ids, attention_mask, mask)
        with replay_routes(model, routes):
            replayed = sequence_logprobs(model, input_ids, attention_mask, mask)
    # the same experts with the same weights (summed in sorted order: float rounding only)
    torch.testing.assert_close(replayed, plain, rtol=0, atol=1e-6)
    assert not any(gate._forward_hooks for gate in routers(model)), "the hooks are removed on exit"


def test_replay_uses_the_recorded_experts_after_the_router_moved(rollout):
    input_ids, attention_mask, mask = rollout
    model = moe()
    routes = expert_choices(model, input_ids, attention_mask)
    with torch.no_grad():
        for gate in routers(model):
            gate.weight.add_(torch.randn(gate.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    moved = expert_choices(model, input_ids, attention_mask)
    completion = mask.bool()
    changed = completion_routing_changed(routes, moved, mask.shape[1]) & completion
    assert changed.any(), "the perturbation must re-route some completion tokens"
    with torch.no_grad():
        plain = sequence_logprobs(model, input_ids, attention_mask, mask)
        with replay_routes(model, routes):
            replayed = sequence_logprobs(model, input_ids, attention_mask, mask)
            used = experts_used(model, input_ids, attention_mask, mask)
    assert torch.equal(used, routes)  # the recorded experts, not the router's new top-k
    assert torch.equal(experts_used(model, input_ids, attention_mask, mask), moved)  # outside: its own again
    assert (replayed - plain)[changed].abs().max() > 1e-4


def test_a_completion_token_moves_with_the_routing_of_the_position_that_predicts_it(rollout):
    """Re-route one position: the log-probs of the tokens before the token it predicts do not move, that token's
    does, and completion_routing_changed flags that token (not the re-routed position's own token)."""
    input_ids, attention_mask, mask = rollout
    model = moe()
    routes = expert_choices(model, input_ids, attention_mask)
    B, L = input_ids.shape
    T = mask.shape[1]
    row, t = 0, 2  # completion token t of row 0 is predicted by position L - T + t - 1
    moved = routes.clone()
    moved[0, row, L - T + t - 1] = (routes[0, row, L - T + t - 1] + 1) % 8  # other experts in the first layer
    moved[0, row, L - T + t - 1] = moved[0, row, L - T + t - 1].sort().values
    assert not torch.equal(moved[0, row, L - T + t - 1], routes[0, row, L - T + t - 1])
    with torch.no_grad():
        plain = sequence_logprobs(model, input_ids, attention_mask, mask)
        with replay_routes(model, moved):
            rerouted = sequence_logprobs(model, input_ids, attention_mask, mask)
    flagged = completion_routing_changed(routes, moved, T)
    assert flagged.nonzero().tolist() == [[row, t]]
    delta = (rerouted - plain).abs()
    # not 0: re-routing one token reshapes every expert's batch, and some kernels (MKL's compatible path) round a
    # row by the batch it sits in (up to ~5e-7 here); leakage would move them as the re-routed token (1e-2) does
    rounding = 1e-5
    assert delta[row, :t].max() <= rounding, "tokens before it cannot see the re-routed position"
    assert delta[row, t] > 1e-4, "the token it predicts moves"
    assert delta[1:].max() <= rounding, "other rows are untouched"
    with pytest.raises(ValueError, match="completion_length"):
        completion_routing_changed(routes, moved, L)


def test_gradients_reach_the_router_through_the_replayed_weights(rollout):
    input_ids, attention_mask, mask = rollout
    model = moe()
    routes = expert_choices(model, input_ids, attention_mask)
    with replay_routes(model, routes):
        (sequence_logprobs(model, input_ids, attention_mask, mask) * mask).sum().backward()
    for gate in routers(model):
        assert gate.weight.grad is not None and gate.weight.grad.abs().sum() > 0


def test_replay_routes_checks_its_input(rollout):
    input_ids, attention_mask, mask = rollout
    model = moe()
    routes = expert_choices(model, input_ids, attention_mask)
    with pytest.raises(ValueError, match="no mixture-of-experts router"):
        with replay_routes(build_model("tiny"), routes):
            pass
    for bad in (routes[:1], routes[..., :1], routes[0]):
        with pytest.raises(ValueError, match=r"choices must be \(layers=2, B, L, k=2\)"):
            with replay_routes(model, bad):
                pass
    with pytest.raises(ValueError, match="the forward pass has"):
        with torch.no_grad(), replay_routes(model, routes[:, :2]):
            sequence_logprobs(model, input_ids, attention_mask, mask)


def test_a_trainer_with_routing_replay_runs_on_a_moe_policy():
    task = get_task("arithmetic", num_digits=1, operations="+")
    config = preset("grpo", beta=0.0, epsilon=0.2, epsilon_high=0.27, routing_replay=True, num_generations=4,
                    per_device_train_batch_size=8, steps_per_generation=4, max_completion_length=4, max_steps=2,
                    learning_rate=3e-3)
    trainer = Trainer(moe(), build_tokenizer(), task, config)
    scored = trainer.score(trainer.sample_rollout(0))
    assert scored.routes.shape == (2, 32, scored.input_ids.shape[1], 2)
    history = trainer.train(progress=False)
    assert len(history) == 2
    for metrics in history:
        assert metrics["optimizer_steps"] == 4
        assert all(np.isfinite(v) for v in metrics.values() if isinstance(v, float))
    # without it, no routes are recorded
    plain = Trainer(moe(), build_tokenizer(), task, preset("grpo", max_completion_length=4, num_generations=4,
                                                             per_device_train_batch_size=8))
    assert plain.score(plain.sample_rollout(0)).routes is None


def test_routing_replay_on_a_dense_policy_is_an_error():
    with pytest.raises(ValueError, match="routing_replay"):
        Trainer(build_model("tiny"), build_tokenizer(), get_task("arithmetic", num_digits=1),
                preset("grpo", routing_replay=True))
    with pytest.raises(ValueError, match="routing_replay must be True or False"):
        preset("grpo", routing_replay=1)
    with pytest.raises(ValueError, match="router_learning_rate needs a mixture-of-experts policy"):
        Trainer(build_model("tiny"), build_tokenizer(), get_task("arithmetic", num_digits=1),
                preset("grpo", router_learning_rate=1e-3))
    with pytest.raises(ValueError, match="router_learning_rate must be a positive"):
        preset("grpo", router_learning_rate=0.0)


def test_the_routers_learn_at_their_own_rate():
    task = get_task("arithmetic", num_digits=1, operations="+")
    config = preset("grpo", router_learning_rate=5e-3, learning_rate=1e-4, max_completion_length=4,
                    num_generations=4, per_device_train_batch_size=8)
    trainer = Trainer(moe(), build_tokenizer(), task, config)
    body, router = trainer.optimizer.param_groups
    assert (body["lr"], router["lr"], router["name"]) == (1e-4, 5e-3, "router")
    assert [id(p) for p in router["params"]] == [id(gate.weight) for gate in routers(trainer.policy)]
    assert len(body["params"]) + len(router["params"]) == len(list(trainer.policy.parameters()))
    assert len(Trainer(moe(), build_tokenizer(), task, preset("grpo")).optimizer.param_groups) == 1
