"""The trainer under torchrun: two processes over gloo on this CPU.

The central check: given the same rollout, one step's updates on 2 processes (each holding half the groups,
DDP averaging the gradients) equal the single-process updates on the whole batch (the gradient of every
optimizer step to 1e-5), for every loss_type,
every ratio level and the presets whose advantages or losses read the whole batch (batch-level reward scaling,
PPO's whitening, GFPO's filter, VAPO's NLL, λ-GRPO's learnable weights, a KL to a reference). The settings take
two optimizer steps per pass, two micro-batches per optimizer step and two passes per rollout, so the minibatches
hold uneven numbers of each process's rows.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlbook.distributed import World, global_share, reduce_metrics, shard_groups
from rlbook.checkpointing import read_checkpoint
from rlbook.lm import build_model, build_tokenizer
from rlbook.presets import preset
from rlbook.tasks import get_task
from rlbook.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
AGREE = 1e-5
# 16 groups of 4; per pass 2 optimizer steps of 2 micro-batches of 16 rows; 2 passes
LAYOUT = dict(num_generations=4, per_device_train_batch_size=16, gradient_accumulation_steps=2,
              steps_per_generation=4, num_iterations=2, max_completion_length=8, learning_rate=1e-3)
CASES = {
    **{f"{loss}/{level}": ("trl_grpo", dict(loss_type=loss, importance_sampling_level=level, epsilon=0.2))
       for loss in ("grpo", "bnpo", "dr_grpo", "dapo") for level in ("token", "sequence", "sequence_token")},
    "gmpo/token": ("gmpo", {}),
    "grpo_kl_batch_scale": ("grpo", dict(scale_rewards="batch")),
    "dapo": ("dapo", {}),
    "ppo": ("ppo", dict(beta=0.05)),
    "vapo": ("vapo", dict(value_pretrain_steps=0, lam_alpha=0.5)),
    "gfpo": ("gfpo", dict(num_generations=8, gfpo_k=4)),
    "lambda_grpo": ("lambda_grpo", {}),
    "rloo": ("rloo", {}),
}


def length_reward(examples, completions, truncated):
    return np.array([len(c) for c in completions], dtype=np.float64)


def make_trainer(name, overrides, world=None):
    torch.manual_seed(0)
    config = preset(name, **{**LAYOUT, **overrides})
    return Trainer(build_model("tiny", seed=0), build_tokenizer(), get_task("arithmetic", num_digits=1), config,
                   reward_fn=length_reward, world=world)


def run_update(trainer, rollout):
    """Score and update ``rollout``; the gradients at every optimizer step and the parameters after."""
    grads = []
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        grads.append(torch.cat([p.grad.flatten() for group in trainer.optimizer.param_groups
                                for p in group["params"] if p.grad is not None]).clone())
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    metrics = trainer.update(trainer.score(rollout))
    params = torch.cat([p.detach().flatten() for group in trainer.optimizer.param_groups
                        for p in group["params"]])
    return {"grads": grads, "params": params, "optimizer_steps": metrics["optimizer_steps"]}


def _ddp_worker(rank, world_size, init_file, rollouts_path, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        rollouts = torch.load(rollouts_path, weights_only=False)
        results = {}
        for case in rollouts:
            trainer = make_trainer(*CASES[case])
            assert trainer.world == World(rank, world_size)
            share = shard_groups(trainer.config.num_prompts, trainer.world)
            results[case] = run_update(trainer, rollouts[case].select_groups(range(share.start, share.stop)))
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_process_updates(tmp_path_factory):
    """The single-process results and each rank's, for every case."""
    folder = tmp_path_factory.mktemp("ddp")
    rollouts, single = {}, {}
    for case, (name, overrides) in CASES.items():
        trainer = make_trainer(name, overrides, world=World())
        rollouts[case] = trainer.sample_rollout(0)
        single[case] = run_update(trainer, rollouts[case])
    torch.save(rollouts, folder / "rollouts.pt")
    mp.spawn(_ddp_worker, args=(2, str(folder / "init"), str(folder / "rollouts.pt"), str(folder)), nprocs=2)
    ranks = [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return single, ranks


@pytest.mark.parametrize("case", list(CASES))
def test_one_ddp_update_equals_the_single_process_update(two_process_updates, case):
    single, ranks = two_process_updates
    expected = single[case]
    assert expected["optimizer_steps"] == 4  # 2 passes x 2 optimizer steps
    for rank in ranks:
        got = rank[case]
        assert got["optimizer_steps"] == expected["optimizer_steps"]
        assert len(got["grads"]) == len(expected["grads"])
        for k, (a, b) in enumerate(zip(got["grads"], expected["grads"])):
            assert float(b.abs().max()) > 1e-4, f"{case}: optimizer step {k} has no gradient to compare"
            torch.testing.assert_close(a, b, atol=AGREE, rtol=0, msg=f"{case}: gradient of optimizer step {k}")
        # AdamW divides by sqrt(v) + 1e-8, so a gradient far below 1e-8 that rounds differently moves its
        # parameter by a different fraction of the learning rate (1e-3): compare the parameters to lr / 10
        torch.testing.assert_close(got["params"], expected["params"], atol=1e-4, rtol=0,
                                   msg=f"{case}: parameters after the step")
    # and the two processes hold the same model, bit for bit on any kernels: the all-reduce hands both ranks the
    # same averaged gradient, and the same AdamW step of the same numbers gives the same parameters
    assert torch.equal(ranks[0][case]["params"], ranks[1][case]["params"])


def test_groups_are_dealt_out_whole_and_bad_world_sizes_are_named():
    assert shard_groups(8, World(1, 2)) == slice(4, 8)
    assert shard_groups(8, World()) == slice(0, 8)
    with pytest.raises(ValueError, match="cannot be split into whole groups over 3 processes"):
        shard_groups(8, World(0, 3))
    with pytest.raises(ValueError, match="5 processes but only 4 groups"):
        shard_groups(4, World(0, 5))
    # the trainer refuses such a world when it is built
    with pytest.raises(ValueError, match="whole groups"):
        make_trainer("grpo", dict(per_device_train_batch_size=12), world=World(0, 5))


def test_one_process_needs_no_collective():
    world = World()
    metrics = {"reward": 0.5, "ratio/min": 0.9}
    assert reduce_metrics(metrics, world) is metrics
    assert global_share(3, 7, world) == 1.0


def _torchrun(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "rlbook", "train", *args, "--no-progress"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def test_rlbook_train_under_torchrun_runs_saves_and_resumes_as_if_uninterrupted(tmp_path):
    common = ["--algo", "grpo", "--task", "arithmetic", "--seed", "1"]
    whole = _torchrun(*common, "--max-steps", "3", "--output-dir", str(tmp_path / "whole"), cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert "(2 processes)" in whole.stderr
    lines = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]  # rank 0 alone wrote, once per step
    assert all(m["num_completions"] == 64 for m in lines)  # the global batch, summed over the two processes
    assert json.loads((tmp_path / "whole" / "run.json").read_text())["world_size"] == 2
    assert (tmp_path / "whole" / "checkpoint-3" / "trainer_state.pt").is_file()

    part = tmp_path / "part"
    first = _torchrun(*common, "--max-steps", "2", "--output-dir", str(part), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = _torchrun(*common, "--max-steps", "3", "--output-dir", str(part), "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed" in resumed.stderr
    again = [json.loads(line) for line in (part / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(again, lines, strict=True):
        for key in ("reward", "loss/policy", "grad_norm", "objective/kl"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), key
    final = [read_checkpoint(folder / "checkpoint-3")["policy"] for folder in (tmp_path / "whole", part)]
    for key in final[0]:
        torch.testing.assert_close(final[0][key], final[1][key], atol=1e-6, rtol=0)


def test_a_world_the_batch_cannot_fill_is_one_clear_line(tmp_path):
    bad = _torchrun("--algo", "grpo", "--task", "arithmetic", "--max-steps", "1", "--output-dir",
                    str(tmp_path / "bad"), "--set", "per_device_train_batch_size=24", cwd=tmp_path)
    assert bad.returncode != 0
    assert "error: bad configuration: the global batch of 3 groups cannot be split into whole groups over 2 " \
           "processes" in bad.stderr
    # torchrun reports the failed processes with its own traceback; ours printed one line each
    assert bad.stderr.count("error: bad configuration") == 2
    assert not re.search(r'File ".*rlbook', bad.stderr)
