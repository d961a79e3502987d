"""Several processes, one training step: what :class:`rlbook.trainer.Trainer` does under torchrun.

    torchrun --standalone --nproc_per_node 2 -m rlbook train --algo grpo --task arithmetic \\
        --max-steps 100 --output-dir runs/grpo-2proc

The engine is PyTorch's own: ``torch.distributed`` (gloo on CPU, NCCL on CUDA) and
:class:`~torch.nn.parallel.DistributedDataParallel`, which averages the gradients of every backward
pass over the processes ("ranks"). This module holds only what the book's algorithms add on top:

- **The config is the global step.** ``num_prompts`` groups of ``num_generations`` completions per
  step, whatever the number of ranks; each rank samples a contiguous share of whole groups
  (:func:`shard_groups`), so a group's baseline never needs another rank's rewards. The same config
  and seed train the same algorithm on 1 or 8 ranks, only faster. (TRL's
  ``per_device_train_batch_size`` is per process instead; :mod:`rlbook.integrations.trl` converts.)
- **Whatever reads the whole batch sees the whole batch.** The advantage estimators run on every
  rank on the gathered batch (:func:`gather_rows`): batch-level reward scaling, PPO's whitening and
  GFPO's filter then equal the single-process numbers; each rank keeps its own rows of the result
  (:func:`rows_of_rank`). Minibatches are drawn from one permutation of the *global* rows; each
  rank computes the rows of a minibatch that it holds.
- **Every denominator is global.** A loss is a sum over rows or tokens divided by a count: what its
  aggregation declares it divides by (``Aggregation.divides_by`` in :mod:`rlbook.losses`: the
  completions, the micro-batch's tokens, or the optimizer step's tokens; the NLL and value losses
  likewise). A rank divides its own sum by the
  all-reduced count (:func:`global_counts`) and multiplies by the world size, which DDP's average
  divides out again (:func:`global_share`), so one update equals the single-process update on the
  whole batch (:func:`micro_batch_shares`: a micro-batch's three shares, exactly 1 on one process, so
  that the trainer has one code path). A parameter outside DDP's module (λ-GRPO's λ) has its gradient
  averaged by hand (:func:`average_grad`).
- **One set of metrics.** Every step's metrics are reduced over ranks (:func:`reduce_metrics`);
  only rank 0 logs and saves checkpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` processes (``rank`` 0 writes logs and checkpoints)."""

    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def current_world() -> World:
    """The initialised process group's rank and size; ``World()`` (one process) without one."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process as one of several (``WORLD_SIZE`` > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_env(device: str = "cpu") -> tuple[World, torch.device]:
    """Join the process group torchrun describes in the environment: gloo for ``device="cpu"``,
    NCCL for ``"cuda"`` (each rank on GPU ``LOCAL_RANK``). Returns this process's :class:`World`
    and device."""
    kind = torch.device(device).type
    if kind == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        backend, where = "nccl", torch.device("cuda", local_rank)
    elif kind == "cpu":
        backend, where = "gloo", torch.device("cpu")
    else:
        raise ValueError(f"distributed training runs on cpu (gloo) or cuda (NCCL), not {device!r}")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return current_world(), where


def shard_groups(num_prompts: int, world: World) -> slice:
    """The prompts (groups) of a step that ``world.rank`` samples: a contiguous
    ``num_prompts / size`` of them. A ``ValueError`` names the fix when the groups cannot be
    dealt out whole and evenly."""
    if world.size > num_prompts:
        raise ValueError(f"{world.size} processes but only {num_prompts} groups per step: every "
                         f"rank needs at least one whole group; raise per_device_train_batch_size "
                         f"* steps_per_generation (the global batch) or run fewer processes")
    if num_prompts % world.size:
        raise ValueError(f"the global batch of {num_prompts} groups cannot be split into whole "
                         f"groups over {world.size} processes; make num_prompts "
                         f"(generation_batch_size / num_generations) a multiple of {world.size}")
    share = num_prompts // world.size
    return slice(world.rank * share, (world.rank + 1) * share)


def row_offsets(num_rows: int, world: World) -> list[int]:
    """Where each rank's rows start in the global batch, and its end: ``[0, n_0, n_0 + n_1, ...,
    B]``. Ranks may hold different numbers of rows (dynamic sampling can run out of rounds on
    one)."""
    if not world.distributed:
        return [0, num_rows]
    sizes = [None] * world.size
    dist.all_gather_object(sizes, int(num_rows))
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    return offsets


def gather_rows(tensor: torch.Tensor | None, world: World) -> torch.Tensor | None:
    """Every rank's rows of ``tensor`` (B_r, ...) stacked in rank order: (B, ...). A second
    dimension (tokens) is right-padded with zeros to the widest rank's, as one process pads its
    batch."""
    if tensor is None or not world.distributed:
        return tensor
    pieces = [None] * world.size
    dist.all_gather_object(pieces, tensor.detach().cpu())
    if tensor.dim() > 1:
        width = max(piece.shape[1] for piece in pieces)
        pieces = [torch.nn.functional.pad(piece, (0, width - piece.shape[1])) for piece in pieces]
    return torch.cat(pieces).to(tensor.device)


def all_reduce_sum(tensor: torch.Tensor, world: World) -> torch.Tensor:
    """``tensor`` summed over ranks (a new tensor; the input itself on one rank)."""
    if not world.distributed:
        return tensor
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def global_share(local, total, world: World):
    """The factor that turns a loss divided by this rank's count ``local`` into this rank's share
    of the loss divided by the all-ranks count ``total``, under DDP's gradient *average*:
    ``size * local / total``. Exactly 1 on one rank; 0 for a rank that holds none of the rows."""
    if not world.distributed:
        return 1.0
    return world.size * local / total if total > 0 else 0.0


def loss_share(divides_by: str, rows: int, tokens, counts: torch.Tensor, world: World):
    """:func:`global_share` for a policy loss whose aggregation divides by ``divides_by``
    (:class:`rlbook.losses.Aggregation`): ``"completions"`` (this rank's ``rows`` against all ranks'),
    ``"tokens"`` (its loss ``tokens`` against all ranks'), or ``"step_tokens"``, already the whole
    step's count on every rank, which DDP's average would divide by the world size."""
    if divides_by == "step_tokens":
        return world.size
    local, column = (rows, 0) if divides_by == "completions" else (tokens, 1)
    return global_share(local, counts[column], world)


@dataclass(frozen=True)
class Shares:
    """What each loss of a micro-batch is multiplied by (:func:`micro_batch_shares`): 1 on one process."""

    policy: float | torch.Tensor = 1.0
    nll: float | torch.Tensor = 1.0
    value: float | torch.Tensor = 1.0


def micro_batch_shares(divides_by: str, loss_mask: torch.Tensor, correct: torch.Tensor, mask: torch.Tensor,
                       counts: torch.Tensor | None, world: World) -> Shares:
    """The shares of a micro-batch's three losses, from its rows' ``loss_mask`` and ``mask`` (B, T), their
    ``correct`` verdicts (B,) and its ``counts`` over the ranks (a row of :func:`global_counts`): the policy loss's
    by what its aggregation ``divides_by`` (:func:`loss_share`), VAPO's NLL's by the loss tokens of correct
    completions, the value loss's by the completion tokens (:func:`global_share`). Exactly 1 each on one process
    (``counts`` None there), so that one code path serves one process and many."""
    if not world.distributed:
        return Shares()
    correct_tokens = (loss_mask * correct[:, None]).sum()
    return Shares(loss_share(divides_by, len(loss_mask), loss_mask.sum(), counts, world),
                  global_share(correct_tokens, counts[2], world), global_share(mask.sum(), counts[3], world))


def share_of(items: list, world: World) -> list:
    """This rank's contiguous share of ``items`` (all of them on one process)."""
    if not world.distributed:
        return items
    return items[world.rank * len(items) // world.size:(world.rank + 1) * len(items) // world.size]


def mean_over_ranks(mean: float, count: int, world: World, device=None) -> float:
    """The mean over every rank's items of a quantity each rank averaged over its ``count`` items: one
    all-reduce; ``mean`` itself on one process."""
    if not world.distributed:
        return mean
    total, items = all_reduce_sum(torch.tensor([mean * count, count], dtype=torch.float64, device=device),
                                  world).tolist()
    return total / items


def global_counts(scored, micro_batches: list[torch.Tensor], world: World) -> torch.Tensor:
    """What every loss of a micro-batch divides by, summed over the ranks: (k, 4) float64 for the
    ``k`` ``micro_batches``, each this rank's row indices into ``scored`` (a
    :class:`rlbook.rollout.ScoredRollout`) without the rows that add nothing. Columns: the rows,
    their loss tokens (``loss_mask``), the loss tokens of correct completions (VAPO's NLL), the
    completion tokens (``mask``, the value loss). One all-reduce for all the micro-batches of an
    optimizer step."""
    local = []
    for rows in micro_batches:
        loss_mask = scored.loss_mask[rows]
        local.append([len(rows), loss_mask.sum().item(),
                      (loss_mask * scored.correct[rows, None]).sum().item(),
                      scored.mask[rows].sum().item()])
    counts = torch.tensor(local, dtype=torch.float64, device=scored.mask.device)
    return all_reduce_sum(counts, world)


def kept_rows(scored, rows: torch.Tensor, keep_all: bool) -> torch.Tensor:
    """``rows`` without those that have no loss token (GFPO's filtered-out, DAPO's overlong), which add
    nothing, unless ``keep_all`` (a value model still learns from them)."""
    return rows if keep_all else rows[scored.loss_mask[rows].any(-1)]


def micro_batches(scored, rows_of_step: torch.Tensor, offsets: list[int], size: int, world: World,
                  keep_all: bool) -> tuple:
    """An optimizer step's global rows cut into micro-batches of ``size`` rows, each as this process's rows
    (global rows first .. first + B_local - 1 under torchrun), with what their losses divide by: under
    torchrun each micro-batch's counts over all processes (:func:`global_counts`, of its :func:`kept_rows`)
    and every process's loss tokens of the step (the "dapo" loss's num_items_in_batch); on one process no
    counts and the step's own loss tokens."""
    batches = [rows_of_step[k : k + size] for k in range(0, len(rows_of_step), size)]
    if not world.distributed:
        return batches, [None] * len(batches), scored.loss_mask[rows_of_step].sum()
    first, B_local = offsets[world.rank], scored.mask.shape[0]
    batches = [rows[(rows >= first) & (rows < first + B_local)] - first for rows in batches]
    # the counts each micro-batch's losses divide by, of its kept rows over all processes, (k, 4)
    counts = global_counts(scored, [kept_rows(scored, rows, keep_all) for rows in batches], world)
    return batches, counts, counts[:, 1].sum()


def average_grad(parameter: torch.Tensor, world: World) -> None:
    """Average the gradient of ``parameter`` over the ranks as DDP averages those of the module it
    wraps, for a parameter trained outside that module (λ-GRPO's λ). A rank whose backward did not
    reach it counts a zero gradient."""
    grad = parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
    parameter.grad = all_reduce_sum(grad, world) / world.size


def rows_of_rank(estimate, offsets: list[int], world: World, width: int):
    """An advantage estimator's output (:class:`rlbook.advantages.Advantages`) on the gathered
    batch, cut back to ``world.rank``'s rows (``offsets`` from :func:`row_offsets`) and to its
    ``width`` token columns (the gathered batch is padded to the widest rank's)."""
    rows = slice(offsets[world.rank], offsets[world.rank + 1])

    def cut(x):
        return None if x is None else (x[rows, :width] if x.dim() > 1 else x[rows])

    return replace(estimate, advantages=cut(estimate.advantages), returns=cut(estimate.returns),
                   keep=cut(estimate.keep))


# counts of the whole step
SUMMED_METRICS = ("num_completions", "dynamic_sampling/groups", "nonfinite_rewards/groups_skipped")


def reduce_metrics(metrics: dict, world: World) -> dict:
    """One rank's metrics -> the same dict on every rank: the mean over the ranks that report a
    key; keys ending in ``min`` or ``max`` (or whose last part starts so:
    ``completions/max_length``) take the minimum or maximum, the counts of
    :data:`SUMMED_METRICS` the sum. Non-numbers, and ``step`` and ``optimizer_steps`` (equal on
    every rank), are rank 0's."""
    if not world.distributed:
        return metrics
    every = [None] * world.size
    dist.all_gather_object(every, metrics)
    reduced = {}
    for key in dict.fromkeys(k for m in every for k in m):
        values = [m[key] for m in every if key in m]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            reduced[key] = values[0]
        elif _extreme(key, "min"):
            reduced[key] = min(values)
        elif _extreme(key, "max"):
            reduced[key] = max(values)
        elif key in ("step", "optimizer_steps"):
            reduced[key] = values[0]
        elif key in SUMMED_METRICS:
            reduced[key] = sum(values)
        else:
            reduced[key] = float(sum(values) / len(values))
    return reduced


def _extreme(key: str, which: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return name.endswith(which) or name.startswith(which + "_")


def barrier(world: World) -> None:
    """Wait for every rank (nothing on one rank)."""
    if world.distributed:
        dist.barrier()
