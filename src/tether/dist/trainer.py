"""The trainer group: data-parallel replicas over torch.distributed (gloo on CPU, NCCL on GPU).

Rank 0 is the driver process, which runs the recipe (recipes/rl_async.py -> recipes/rl.py);
ranks 1..W-1 are Ray actors (`TrainerFollower`) holding a replica of the policy, optimizer,
scheduler, reference and critic. Every update, through the hooks `run_update` calls
(`tether.train.update`, argument `dp`):

- `begin`: rank 0 broadcasts the TrainBatch, its generator state (the mini-batch permutation)
  and the KL coefficient; the followers are waiting for it in `TrainerFollower.follow`;
- `shard`: each rank takes a disjoint share of the micro-batches (balanced by tokens);
- `reduce_grads`: gradients are SUMMED across ranks before clipping — exact, because every
  micro-batch loss is already divided by its mini-batch's global denominators (`agg_loss`),
  the same property that makes gradient accumulation exact (docs/design.md, correctness rule 7);
- `reduce_metrics`: the metric accumulators are merged, so rank 0 logs the whole batch.

Replicas stay identical (same gradient, same optimizer step), so rank 0's weights are the
group's weights: it alone evaluates, checkpoints and publishes weights to the rollout workers.
Hence the restrictions in `find_dist_problems` (no rank-0-only rollback or reference reset).
With `dist.trainer_sharding: fsdp2` the ranks hold FSDP2 shards instead (tether.dist.fsdp): the
same hooks plus `serve` (followers join rank 0's collectives between updates) and `end`.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as tdist

_BUCKET_ELEMS = 1 << 24  # all-reduce gradients in buckets of 16M elements


class _Stop(Exception):
    """Rank 0 ended the group (raised on followers out of `begin`)."""


def compute_rank_shards(micro: Sequence[Sequence[int]], lengths: Sequence[int], world: int) -> list[list[Sequence[int]]]:
    """Split micro-batches (lists of row indices) over `world` ranks, largest first onto the least
    loaded rank (tokens); each rank keeps its micro-batches in their original order."""
    load = [0] * world
    owner: dict[int, int] = {}
    cost = [sum(lengths[i] for i in mb) for mb in micro]
    for j in sorted(range(len(micro)), key=lambda j: -cost[j]):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[j] = r
        load[r] += cost[j]
    return [[mb for j, mb in enumerate(micro) if owner[j] == r] for r in range(world)]


class DataParallel:
    """Rank `rank` of `world` in the default process group; see the module docstring."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def begin(self, batch: Any, generator: torch.Generator | None, state: Any) -> Any:
        payload = [("update", batch, None if generator is None else generator.get_state(), state.kl_coef)
                   if self.rank == 0 else None]
        tdist.broadcast_object_list(payload, src=0)
        while self.rank != 0 and self.serve(payload[0][0]):  # a collective rank 0 runs between updates
            payload = [None]
            tdist.broadcast_object_list(payload, src=0)
        cmd, batch, gen_state, kl_coef = payload[0]
        if cmd == "stop":
            raise _Stop
        if self.rank != 0:
            if generator is not None and gen_state is not None:
                generator.set_state(gen_state)
            state.kl_coef = kl_coef
        return batch

    def serve(self, cmd: str) -> bool:
        """Followers: run rank 0's command `cmd` if it is not an update or a stop (True: served)."""
        return False

    def shard(self, micro: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[Sequence[int]]:
        return compute_rank_shards(micro, lengths, self.world)[self.rank]

    def reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum gradients over ranks (a rank without micro-batches contributes zeros)."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket: list[torch.Tensor] = []
        size = 0
        for p in list(params) + [None]:
            if p is not None and (size + p.numel() <= _BUCKET_ELEMS or not bucket):
                bucket.append(p.grad)
                size += p.numel()
                continue
            flat = torch.cat([g.reshape(-1) for g in bucket])
            tdist.all_reduce(flat)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            bucket, size = ([p.grad], p.numel()) if p is not None else ([], 0)

    def reduce_metrics(self, acc: Any) -> None:
        """Merge the ranks' metric accumulators (tether.train.update._Acc) into `acc`."""
        parts: list[Any] = [None] * self.world
        tdist.all_gather_object(parts, (acc.sums, acc.weights, acc.maxes, acc.losses))
        sums, weights, maxes, losses = {}, {}, {}, {}
        for s, w, m, loss in parts:
            for k, v in s.items():
                sums[k] = sums.get(k, 0.0) + v
            for k, v in w.items():
                weights[k] = weights.get(k, 0.0) + v
            for k, v in m.items():
                maxes[k] = max(maxes.get(k, v), v)
            for k, v in loss.items():
                losses[k] = losses.get(k, 0.0) + v
        acc.sums, acc.weights, acc.maxes, acc.losses = sums, weights, maxes, losses

    def end(self) -> None:
        """After the update, on every rank (replicas: nothing to do)."""

    def stop(self) -> None:
        """Rank 0: release the followers from their loop."""
        tdist.broadcast_object_list([("stop", None, None, None)], src=0)


def find_free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def do_init_group(rank: int, world: int, addr: str, port: int, backend: str, timeout_s: float) -> DataParallel:
    tdist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                             timeout=datetime.timedelta(seconds=timeout_s))
    return DataParallel(rank, world)


class TrainerFollower:
    """Trainer rank >= 1 (a Ray actor): a replica that joins rank 0's updates."""

    def __init__(self, rank: int, world: int, bundle: Mapping[str, Any], cfg: Any,
                 train_problems: Sequence[Mapping[str, Any]], threads: int = 1) -> None:
        from tether.policy.weights import build_policy_from_bundle
        from tether.settings import RunSettings
        from tether.train.state import build_rl_state

        torch.set_num_threads(max(1, threads))
        self.rank, self.world, self.cfg = rank, world, cfg
        policy = build_policy_from_bundle(bundle, cfg.model.device)
        policy.model.train()
        self.st = build_rl_state(RunSettings(cfg), policy, list(train_problems))
        self.dp: DataParallel | None = None

    def load_state(self, extra: Mapping[str, Any], optimizer: Mapping[str, Any], scheduler: Mapping[str, Any]) -> int:
        """rank 0's counters, reference, critic and optimizer moments (after a resume, say)."""
        self.st.load_extra_state(dict(extra))
        self.st.optimizer.load_state_dict(optimizer)
        if self.st.scheduler is not None and scheduler is not None:
            self.st.scheduler.load_state_dict(scheduler)
        return self.rank

    def join(self, addr: str, port: int, backend: str, timeout_s: float) -> int:
        self.dp = do_init_group(self.rank, self.world, addr, port, backend, timeout_s)
        return self.rank

    def shard(self) -> int:
        """dist.trainer_sharding=fsdp2: this rank's replica becomes its shards (with rank 0's, a collective)."""
        from tether.dist.fsdp import shard_run_state

        self.dp = shard_run_state(self.st, self.cfg.train, self.cfg.algo, self.rank, self.world)
        return self.rank

    def follow(self) -> int:
        """Run updates as rank 0 sends them, until it stops the group; returns the update count."""
        from tether.train.update import UpdateContext, run_update

        st, cfg, n = self.st, self.cfg, 0
        while True:
            try:
                run_update(UpdateContext.from_run(st, cfg.algo, cfg.train, cfg.rollout.sampling, self.dp), None)
            except _Stop:
                break
            n += 1
        tdist.destroy_process_group()
        return n

    def state_checksum(self) -> str:
        from tether.policy.weights import compute_state_checksum

        return compute_state_checksum(self.st.policy.model)


class TrainerGroup:
    """Rank 0's handle on the followers: start them, hand them the state, stop them."""

    def __init__(self, cfg: Any, pg: Any, first_bundle: int) -> None:
        self.cfg, self.pg, self.first_bundle = cfg, pg, first_bundle
        self.followers: list[Any] = []
        self.loops: list[Any] = []
        self.dp: DataParallel | None = None

    def start(self, st: Any) -> DataParallel:
        import ray

        from tether.dist.cluster import make_actor_options
        from tether.policy.weights import make_model_bundle

        d, world = self.cfg.dist, self.cfg.dist.trainer_workers
        bundle = ray.put(make_model_bundle(st.policy))
        train = ray.put(list(st.stream.problems))
        actor = ray.remote(TrainerFollower)
        res = d.placement.trainer
        self.followers = [actor.options(**make_actor_options(self.pg, self.first_bundle + r - 1, res)).remote(
            r, world, bundle, self.cfg, train, max(1, int(res.cpus))) for r in range(1, world)]
        sched = st.scheduler.state_dict() if st.scheduler is not None else None
        ray.get([f.load_state.remote(st.extra_state(), st.optimizer.state_dict(), sched) for f in self.followers])
        backend = "nccl" if str(st.policy.device).startswith("cuda") else "gloo"
        addr, port = ray.util.get_node_ip_address(), find_free_port()
        joins = [f.join.remote(addr, port, backend, d.order_timeout_s) for f in self.followers]
        self.dp = do_init_group(0, world, addr, port, backend, d.order_timeout_s)
        ray.get(joins)
        if d.trainer_sharding == "fsdp2":
            from tether.dist.fsdp import shard_run_state

            shards = [f.shard.remote() for f in self.followers]
            self.dp = shard_run_state(st, self.cfg.train, self.cfg.algo, 0, world)
            ray.get(shards)
        self.loops = [f.follow.remote() for f in self.followers]
        return self.dp

    def close(self) -> list[int]:
        import ray

        if self.dp is None:
            return []
        self.dp.stop()
        counts = ray.get(self.loops, timeout=self.cfg.dist.order_timeout_s)
        tdist.destroy_process_group()
        self.dp = None
        return counts


__all__ = ["DataParallel", "TrainerFollower", "TrainerGroup", "compute_rank_shards", "find_free_port", "do_init_group"]
