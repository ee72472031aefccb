"""FSDP2 trainer ranks: parameters, gradients and AdamW state sharded over the ranks
(`torch.distributed.fsdp.fully_shard`, arXiv:2304.11277; gloo on CPU, NCCL on GPUs).

    shard_model(policy.model)                          # every decoder layer, then the root (embeddings, norm, head)
    optimizer = build_optimizer(model.parameters(), ...)  # built AFTER sharding: its state is sharded too
    run_update(UpdateContext(..., dp=ShardedDataParallel(rank, world, token_budget)), batch)
    save_sharded(path, model, optimizer); load_sharded(path, model, optimizer)   # DCP: each rank its shards
    load_sharded_into_single(path, plain_model)        # the same checkpoint in one plain process
    for name, tensor in iter_full_state(model): ...    # full weights, one tensor at a time (a collective)

Why the update equals one process's: tether divides every micro-batch loss by its mini-batch's
GLOBAL denominators (`agg_loss`, docs/design.md, correctness rule 7), so the mini-batch gradient is the SUM of the
micro-batch gradients wherever they ran. FSDP2's reduce-scatter AVERAGES over ranks, and gloo has
no PREMUL_SUM for `set_gradient_divide_factor(1.0)`, so `ShardedDataParallel.reduce_grads`
multiplies the sharded gradients by the world size before clipping (exact for a power-of-two world).

Scoring: tether's scorer runs the backbone and then reads the LM head's weight directly (chunked
head), so the root unit's forward (which unshards embeddings, final norm and head, tied or not)
never runs. `shard_model` registers `tether_sharded_call` on the root as an FSDP forward method
(`register_fsdp_forward_method`); `tether.policy.prefix.compute_sequence_logprobs` scores through it.

Lockstep: every forward all-gathers each layer and every backward reduce-scatters it, so every
rank must run the same number of micro-batches, each with one backbone pass (prefix sharing off):
`compute_lockstep_shards` balances rows over ranks by tokens and splits micro-batches until the
counts match (any split is exact, see above).
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as tdist

from tether.algos.config import AlgoConfig
from tether.dist.trainer import DataParallel
from tether.train.config import TrainConfig


def _run_sharded(self: torch.nn.Module, fn: Callable[[], Any]) -> Any:
    """`fn()` between the root unit's pre- and post-forward hooks (registered in `shard_model`)."""
    return fn()


def shard_model(model: torch.nn.Module, mesh: Any = None) -> torch.nn.Module:
    """fully_shard each decoder layer, then the root (embeddings, final norm, head), in place."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None:
        raise ValueError(f"shard_model: {type(model).__name__} has no model.layers (a decoder-only HF model is expected)")
    if mesh is None:  # one mesh over the default group, created the same way on every rank
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(next(model.parameters()).device.type, (tdist.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.tether_sharded_call = types.MethodType(_run_sharded, model)
    register_fsdp_forward_method(model, "tether_sharded_call")
    return model


def compute_lockstep_shards(lengths: Sequence[int], token_budget: int, world: int) -> list[list[list[int]]]:
    """Rows -> per-rank micro-batches (lists of row indices), the same number on every rank.

    The token-budget micro-batches are split (largest first) until their count is a multiple of
    `world`; when every one is a single row, the two cheapest are merged instead (that one goes
    over the budget). Then largest first onto the least loaded rank that still has room."""
    from tether.train.batching import split_by_token_budget

    if len(lengths) < world:
        raise ValueError(f"a mini-batch of {len(lengths)} sequences cannot feed {world} sharded ranks in lockstep; "
                         "use fewer trainer ranks or more sequences per mini-batch (rollout.problems_per_step, "
                         "rollout.n, fewer algo.mini_batches)")
    micro = [sorted(mb) for mb in split_by_token_budget(list(lengths), token_budget)]
    cost = lambda mb: sum(lengths[i] for i in mb)  # noqa: E731
    while len(micro) % world:
        multi = [j for j in range(len(micro)) if len(micro[j]) > 1]
        if multi:
            k = max(multi, key=lambda j: (cost(micro[j]), -j))
            mb = micro.pop(k)
            micro[k:k] = [mb[: len(mb) // 2], mb[len(mb) // 2:]]
        else:
            a, b = sorted(sorted(range(len(micro)), key=lambda j: (cost(micro[j]), j))[:2])
            micro[a] = sorted(micro[a] + micro.pop(b))
    per_rank, load = len(micro) // world, [0] * world
    owner: dict[int, int] = {}
    for j in sorted(range(len(micro)), key=lambda j: (-cost(micro[j]), j)):
        r = min((r for r in range(world) if sum(o == r for o in owner.values()) < per_rank), key=lambda r: (load[r], r))
        owner[j], load[r] = r, load[r] + cost(micro[j])
    return [[mb for j, mb in enumerate(micro) if owner[j] == r] for r in range(world)]


class ShardedDataParallel(DataParallel):
    """`run_update`'s hooks for FSDP2 ranks: the batch from rank 0 (as for replicas), lockstep
    micro-batches, and gradients that FSDP already reduce-scattered (averaged) turned into sums.

    In a run (`shard_run_state`) it also knows the sharded `model` and `optimizer`; on rank 0,
    `mirror` is the plain model that evaluates and publishes (refreshed in `end`), `train_policy`
    the sharded twin `run_update` trains, and `optimizer.state_dict()` gathers the full state."""

    def __init__(self, rank: int, world: int, token_budget: int, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, mirror: torch.nn.Module | None = None,
                 train_policy: Any = None) -> None:
        super().__init__(rank, world)
        self.token_budget = token_budget
        self.model, self.optimizer, self.mirror, self.train_policy = model, optimizer, mirror, train_policy

    def serve(self, cmd: str) -> bool:
        if cmd != "optimizer_state":
            return False
        self.gather_optimizer_state()
        return True

    def end(self) -> None:
        """Every rank: gather the updated weights one tensor at a time; rank 0 copies them into its mirror."""
        if self.model is None:
            return
        target = self.mirror.state_dict() if self.mirror is not None else None
        with torch.no_grad():
            for name, full in iter_full_state(self.model):
                if target is not None:
                    target[name].copy_(full)

    def gather_optimizer_state(self) -> dict[str, Any]:
        """Every rank (a collective): the optimizer's state dict with full tensors, in the format of
        an unsharded optimizer over the same parameters (what `load_checkpoint` restores)."""
        sd = torch.optim.Optimizer.state_dict(self.optimizer)  # the class's: rank 0's instance gathers (below)
        state = {i: {k: v.full_tensor() if hasattr(v, "full_tensor") else v.clone() for k, v in sd["state"][i].items()}
                 for i in sorted(sd["state"])}
        return {"state": state, "param_groups": sd["param_groups"]}

    def request_optimizer_state(self) -> dict[str, Any]:
        """Rank 0: have the followers join `gather_optimizer_state` (they wait in `begin`)."""
        tdist.broadcast_object_list([("optimizer_state", None, None, None)], src=0)
        return self.gather_optimizer_state()

    def shard(self, micro: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[Sequence[int]]:
        return compute_lockstep_shards(lengths, self.token_budget, self.world)[self.rank]

    def reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, float(self.world))


def shard_run_state(st: Any, train: TrainConfig, algo: AlgoConfig, rank: int, world: int) -> ShardedDataParallel:
    """Turn an RLState's replica into FSDP2 shards (every rank at once: a collective).

    Followers shard their policy in place; rank 0 shards a copy and keeps `st.policy` plain (one
    full copy of the weights, for evaluation, probes, checkpoints and publishing). The optimizer
    is rebuilt over the shards with the replica's state sliced into them; the scheduler follows."""
    import copy
    import dataclasses

    from torch.distributed.tensor import distribute_tensor

    from tether.optim import build_optimizer, build_scheduler

    plain, t, a = st.policy.model, train, algo
    old_opt, old_sched = st.optimizer, st.scheduler
    if len(old_opt.param_groups) != 1:
        raise ValueError("dist.trainer_sharding=fsdp2 shards one parameter group (the policy's; no critic)")
    old = old_opt.state_dict()
    model = shard_model(copy.deepcopy(plain) if rank == 0 else plain)
    opt = build_optimizer(model.parameters(), t.lr, t.weight_decay, t.betas)
    sched = None
    if old_sched is not None:
        sched = build_scheduler(opt, max(1, t.steps * a.epochs * a.mini_batches), t.warmup_steps, t.schedule)
        sched.load_state_dict(old_sched.state_dict())
    params = opt.param_groups[0]["params"]
    for i, p in enumerate(params):  # the same parameter order: shard_model keeps the modules' registration order
        if i in old["state"]:
            opt.state[p] = {k: distribute_tensor(v, p.device_mesh, p.placements, src_data_rank=None)
                            if torch.is_tensor(v) and v.dim() > 0 else v.clone() if torch.is_tensor(v) else v
                            for k, v in old["state"][i].items()}
    impl = ("params", "fused", "foreach", "capturable", "differentiable")  # hyper-parameters only
    opt.param_groups[0].update({k: v for k, v in old["param_groups"][0].items() if k not in impl})
    train_policy = dataclasses.replace(st.policy, model=model) if rank == 0 else None
    dp = ShardedDataParallel(rank, world, t.micro_batch_tokens, model, opt, plain if rank == 0 else None, train_policy)
    if rank == 0:  # checkpoints get the full state in the single-process format
        opt.state_dict = types.MethodType(lambda self: dp.request_optimizer_state(), opt)
    st.optimizer, st.scheduler = opt, sched
    return dp


def iter_full_state(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every entry of the model's state dict, gathered one tensor at a
    time (a collective: every rank iterates; one full tensor is alive at a time)."""
    for name, value in model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        yield name, full.detach()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def compute_local_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank holds: its parameter shards, their gradients and the optimizer state."""
    params = list(model.parameters())
    out = {"params": sum(_local(p).numel() * p.element_size() for p in params),
           "grads": sum(_local(p.grad).numel() * p.grad.element_size() for p in params if p.grad is not None),
           "optimizer": 0}
    if optimizer is not None:
        out["optimizer"] = sum(_local(v).numel() * v.element_size() for s in optimizer.state.values()
                               for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    return out


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
    return {"model": model_sd, **({"optim": optim_sd} if optimizer is not None else {})}


def save_sharded(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> Path:
    """A distributed checkpoint (torch.distributed.checkpoint): every rank writes its own shards."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(model, optimizer), checkpoint_id=str(path))
    return Path(path)


def load_sharded(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load a distributed checkpoint into sharded ranks (DCP reshards to this world size)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(model, optimizer)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer if optimizer is not None else [], model_state_dict=state["model"],
                   optim_state_dict=state.get("optim", {}))


def load_sharded_into_single(path: str | Path, model: torch.nn.Module) -> None:
    """The model weights of a distributed checkpoint, loaded into one plain (unsharded) model."""
    import torch.distributed.checkpoint as dcp

    state = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    dcp.load(state, checkpoint_id=str(path), no_dist=not tdist.is_initialized())
    model.load_state_dict(state["model"])


__all__ = ["shard_model", "compute_lockstep_shards", "ShardedDataParallel", "shard_run_state", "iter_full_state",
           "compute_local_bytes", "save_sharded", "load_sharded", "load_sharded_into_single"]
