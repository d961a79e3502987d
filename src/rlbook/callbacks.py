"""Public extension points of :class:`rlbook.trainer.Trainer`, modelled on TRL's ``TrainerCallback``.

A callback sees the loop at fixed points and may return a dict of metrics, which the trainer merges into the
step's metrics (so they land in ``history``, ``metrics.jsonl`` and the experiments' records). It should not change
what it is shown. The hooks, in the order one step calls them::

    on_train_begin(trainer)                       once per train() call
    on_rollout_end(trainer, rollout)  -> metrics  completions sampled and rewarded (a Rollout)
    on_score_end(trainer, scored)     -> metrics  old/reference log-probs, values and advantages (a ScoredRollout)
    on_update_end(trainer, scored)    -> metrics  after the step's optimizer updates
    on_step_end(trainer, metrics)                 the step's metrics, complete (logging, progress)
    on_train_end(trainer)                         once per train() call

A callback that adds metrics documents their keys in its ``metrics`` attribute (key -> explanation); the ones
defined in this module are explained in :data:`rlbook.metrics.METRICS` too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from rlbook.checkpointing import prune_checkpoints
from rlbook.objectives import masked_mean
from rlbook.rollout import sequence_logprobs

if TYPE_CHECKING:
    from rlbook.rollout import Rollout, ScoredRollout

# ``Trainer`` in the annotations is :class:`rlbook.trainer.Trainer`, named but not imported (not even for type
# checkers): the trainer imports this module. Annotations are never evaluated (``from __future__ import
# annotations``), so the name needs no import.


class TrainerCallback:
    """Base class: every hook does nothing. Override the ones you need."""

    metrics: dict[str, str] = {}

    def on_train_begin(self, trainer: Trainer) -> None:
        pass

    def on_rollout_end(self, trainer: Trainer, rollout: Rollout) -> dict | None:
        pass

    def on_score_end(self, trainer: Trainer, scored: ScoredRollout) -> dict | None:
        pass

    def on_update_end(self, trainer: Trainer, scored: ScoredRollout) -> dict | None:
        pass

    def on_step_end(self, trainer: Trainer, metrics: dict) -> None:
        pass

    def on_train_end(self, trainer: Trainer) -> None:
        pass


class ProgressBar(TrainerCallback):
    """A tqdm bar over ``total`` steps (default: up to ``max_steps``), showing reward, entropy and the phases'
    seconds."""

    def __init__(self, total: int | None = None, desc: str = "RL"):
        self.total, self.desc = total, desc

    def on_train_begin(self, trainer):
        total = trainer.config.max_steps - trainer.step if self.total is None else self.total
        self.bar = tqdm(total=max(total, 0), desc=self.desc, mininterval=1.0)

    def on_step_end(self, trainer, metrics):
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{metrics['reward']:.3f}", entropy=f"{metrics['entropy']:.3f}",
                             gen=f"{metrics['time/generate']:.2f}s", upd=f"{metrics['time/update']:.2f}s")

    def on_train_end(self, trainer):
        self.bar.close()


class MetricsLogger(TrainerCallback):
    """Appends each step's metrics to ``path`` as one JSON object per line, flushed to disk every step."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def on_step_end(self, trainer, metrics):
        with self.path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
            f.flush()
            os.fsync(f.fileno())


class CheckpointSaver(TrainerCallback):
    """Saves the trainer (:meth:`rlbook.trainer.Trainer.save_checkpoint`) to
    ``folder/checkpoint-<step>`` every ``every`` steps. With ``keep_last=k`` (TRL's
    ``save_total_limit``), once a new checkpoint is complete the older ones beyond the newest ``k``
    are deleted (:func:`rlbook.checkpointing.prune_checkpoints`)."""

    def __init__(self, folder: str | Path, every: int, keep_last: int | None = None):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        self.folder, self.every, self.keep_last = Path(folder), every, keep_last

    def on_step_end(self, trainer, metrics):
        if trainer.step % self.every == 0:
            self.save(trainer)

    def save(self, trainer: Trainer) -> Path:
        """Save ``checkpoint-<step>`` now, then prune (rank 0 only, like the save)."""
        path = trainer.save_checkpoint(self.folder / f"checkpoint-{trainer.step}")
        if self.keep_last is not None and trainer.world.is_main:
            prune_checkpoints(self.folder, self.keep_last, keep=path)
        return path


class PostUpdateRatios(TrainerCallback):
    """After the step's updates, the rollout's log-ratios log(π_new / π_old) under the updated policy: how far the
    updates moved each token's and each completion's probability (the GMPO and GSPO chapters' measurement). Costs
    one more forward pass per step."""

    metrics = {k: "see rlbook.metrics.METRICS" for k in (
        "post_update/log_ratio_token_var", "post_update/log_ratio_sequence_var",
        "post_update/max_abs_log_ratio_token", "post_update/max_abs_log_ratio_sequence")}

    def on_update_end(self, trainer, scored):
        log_ratio = post_update_log_ratio(trainer, scored)
        mask = scored.mask
        tokens = log_ratio[mask.bool()]
        sequences = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)  # log s_i, the mean token log-ratio
        return {"post_update/log_ratio_token_var": float(tokens.var()),
                "post_update/log_ratio_sequence_var": float(sequences.var()),
                "post_update/max_abs_log_ratio_token": float(tokens.abs().max()),
                "post_update/max_abs_log_ratio_sequence": float(sequences.abs().max())}


class ValuePretrainingHistory(TrainerCallback):
    """Keeps what value pretraining (``value_pretrain_steps``, which the trainer runs before the first step) measured
    at each of its rollouts: ``history = {"loss/value": [...], "explained_variance": [...]}``, empty lists when
    the run did not pretrain."""

    KEYS = ("loss/value", "explained_variance")

    def on_train_begin(self, trainer):
        self.history = {k: [m.get(k) for m in trainer.value_pretrain_history] for k in self.KEYS}


class ExpertRoutingChanges(TrainerCallback):
    """For a mixture-of-experts policy: the share of completion tokens whose experts changed during the step's
    updates, and the mean |log-ratio| after the update of the tokens whose routing changed and of the others (the
    GSPO chapter's measurement). A token counts as re-routed when the position that predicts it (the one before
    it, :func:`rlbook.lm.moe.completion_routing_changed`) changed experts. Nothing for a dense policy."""

    metrics = {k: "see rlbook.metrics.METRICS" for k in (
        "moe/route_changed", "moe/abs_log_ratio_route_changed", "moe/abs_log_ratio_route_same")}

    def on_score_end(self, trainer, scored):
        from rlbook.lm.moe import expert_choices, is_moe

        if not is_moe(trainer.policy):
            self.before = None
        elif scored.routes is not None:  # Routing Replay has recorded the old policy's experts already
            self.before = scored.routes
        else:
            self.before = expert_choices(trainer.policy, scored.input_ids, scored.attention_mask)

    def on_update_end(self, trainer, scored):
        from rlbook.lm.moe import completion_routing_changed, expert_choices

        if self.before is None:
            return None
        mask = scored.mask
        after = expert_choices(trainer.policy, scored.input_ids, scored.attention_mask)
        changed = completion_routing_changed(self.before, after, mask.shape[1])  # at the predicting position
        log_ratio = post_update_log_ratio(trainer, scored)
        completion = mask.bool()
        out = {"moe/route_changed": masked_mean(changed.float(), mask).item()}
        for name, which in (("route_changed", changed & completion), ("route_same", ~changed & completion)):
            if bool(which.any()):
                out[f"moe/abs_log_ratio_{name}"] = float(log_ratio[which].abs().mean())
        return out


@torch.no_grad()
def post_update_log_ratio(trainer: Trainer, scored: ScoredRollout) -> torch.Tensor:
    """(B, T) log(π_θ / π_old) of the rollout's tokens under the trainer's current policy, 0 on padding."""
    new_logp = sequence_logprobs(trainer.policy, scored.input_ids, scored.attention_mask, scored.mask,
                                 temperature=trainer.config.temperature)
    return (new_logp - scored.old_logp) * scored.mask
