"""The rollout side of recipes/rl_async.py: workers, weight sync, admission control, the queue.

`AsyncRollouts.collect_groups(st, cfg)` takes the place of `tether.rollout.collect_groups` in
`run_rl_step`. At trainer version T it:

1. publishes the weights (version T) to every worker: numpy through the object store, each
   worker acks with the checksum of what it loaded and its log-probs on the probe sequence
   (handshake: a worker's version only advances on a matching checksum; the probe gap must stay
   under dist.sync.probe_tol);
2. admits work: batches T .. T + max_staleness that are not yet out are split into one shard per
   worker and dispatched — each order names the oldest weights allowed to serve it, and a
   worker's calls run in order, so an order queued behind a weight load is served by the new
   weights;
3. waits for batch T's shards and returns them with the staleness metrics. Meanwhile the workers
   go on with batches T+1 .. T+max_staleness while the trainer updates: generation overlaps
   training.

Failures are values: a worker that dies (or stays silent for dist.order_timeout_s) is killed and
replaced, its orders are retried elsewhere (dist.max_retries), then dropped and counted — the
run goes on. An order that raises inside the worker (a systematic reward or environment failure)
stops the run with that error.

Sequential mode (max_staleness 0, one worker, no partial rollouts, no pool): the trainer's own
data stream and RNG state travel with the order and come back, so the run is bit-identical to
`tether train` — the staleness-0 equivalence the tests pin (verl#6780).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from tether.dist.cluster import compute_bundles, make_actor_options, make_placement_group
from tether.dist.staleness import compute_admissible_batches, compute_lags, compute_staleness_metrics
from tether.policy.weights import compute_checksum, make_model_bundle, make_publish_state, to_numpy_state
from tether.dist.worker import Order, RolloutWorker, StaleWorkerError, merge_metrics

log = logging.getLogger(__name__)


class SyncError(RuntimeError):
    """A rollout engine did not follow the trainer's weights (probe gap over tolerance)."""


def pick_fingerprint(results: list[dict[str, Any]]) -> dict[str, float]:
    """One worker's (weights fingerprint, version) pair for the health layer's stale-sync check:
    workers may hold different versions (staleness, in-flight updates), and `merge_metrics`
    would average their fingerprints into one that matches no weights. The oldest version's
    pair is kept (a worker left behind is what the check is for)."""
    pairs = [(m["rollout/weights_fp_version"], m["rollout/weights_fp"]) for m in (r["metrics"] for r in results)
             if "rollout/weights_fp" in m and "rollout/weights_fp_version" in m]
    if not pairs:
        return {"rollout/weights_fp": float("nan"), "rollout/weights_fp_version": float("nan")}
    version, fp = min(pairs, key=lambda p: p[0])
    return {"rollout/weights_fp": float(fp), "rollout/weights_fp_version": float(version)}


@dataclass
class _Slot:
    """One rollout worker as the controller sees it."""

    index: int  # worker id (a replacement gets a new one: its RNG stream differs)
    bundle: int  # placement-group bundle
    handle: Any
    version: int = -1  # confirmed by an ack
    last_progress: float = field(default_factory=time.monotonic)
    parked: int = 0
    probe: list[float] | None = None


@dataclass
class _Call:
    kind: str  # "order" | "ack"
    slot: int
    order: Order | None = None
    version: int = -1
    checksum: str = ""


@dataclass
class _Batch:
    shards: int
    results: dict[int, dict[str, Any] | None] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.results) == self.shards


class AsyncRollouts:
    """See the module docstring."""

    def __init__(self, cfg: Any) -> None:
        d = cfg.dist
        self.cfg, self.d = cfg, d
        self.sequential = (d.max_staleness == 0 and d.rollout_workers == 1 and d.partial.token_budget is None
                           and d.cross_policy.pool_size == 0)
        self.slots: dict[int, _Slot] = {}
        self.calls: dict[Any, _Call] = {}
        self.batches: dict[int, _Batch] = {}
        self.counters: Counter = Counter()
        self.histogram: Counter = Counter()
        self.next_batch: int | None = None
        self.published = -1
        self.pg = None
        self.trainers = None
        self._ids = 0
        self._step_sync: dict[str, float] = {}  # acks handled since the last step's metrics
        self._probe_refs: dict[int, list[float]] = {}  # the trainer's probe log-probs per published version
        for k in ("dist/worker_failures", "dist/retried_orders", "dist/dropped_orders", "dist/dropped_problems",
                  "sync/failures", "sync/probe_failures"):
            self.counters[k] = 0

    # ------------------------------------------------------------------ start / stop

    def start(self, st: Any) -> None:
        """Placement group, workers (first call: the policy now exists), trainer group."""
        import ray

        self.pg = make_placement_group(self.d, compute_bundles(self.d))
        self.bundle_ref = ray.put(make_model_bundle(st.policy))
        self.train_ref = ray.put(list(st.stream.problems)) if self.sequential else None
        self.probe_ids = self._make_probe(st)
        for b in range(self.d.rollout_workers):
            self._spawn(b)
        if self.d.trainer_workers > 1:
            from tether.dist.trainer import TrainerGroup

            self.trainers = TrainerGroup(self.cfg, self.pg, self.d.rollout_workers)
            st.dp = self.trainers.start(st)
        self.next_batch = int(st.policy.version)

    def _spawn(self, bundle: int) -> _Slot:
        import ray

        index, self._ids = self._ids, self._ids + 1
        res = self.d.placement.rollout
        device = "cuda" if res.gpus > 0 else "cpu"
        opts = make_actor_options(self.pg, bundle, res)
        if self.d.inflight:  # load_weights runs beside run_order and feeds its decode loop (tether.dist.worker)
            opts["max_concurrency"] = 3
        handle = ray.remote(RolloutWorker).options(**opts).remote(
            index, self.bundle_ref, self.cfg, self.cfg.run.seed + 7919 * (index + 1), device, self.train_ref,
            max(1, int(res.cpus)))
        slot = self.slots[index] = _Slot(index, bundle, handle)
        if self.published >= 0:  # a replacement: load the current weights before any order
            self._send_weights(slot)
        return slot

    def _make_probe(self, st: Any) -> list[int]:
        from tether.policy.chat import encode_prompt

        ids: list[int] = []
        for p in st.stream.problems[: self.d.sync.probe_problems]:
            ids.extend(encode_prompt(st.policy.tokenizer, p, self.cfg.data.chat))
        return ids[: st.policy.max_positions]

    def close(self) -> dict[str, Any]:
        """Stop the trainer group and the workers; the run-long dist summary."""
        import ray

        follower_updates = self.trainers.close() if self.trainers is not None else []
        parked = 0
        for s in list(self.slots.values()):
            parked += s.parked
            try:
                ray.kill(s.handle)
            except Exception:  # already gone
                pass
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)
        return {"staleness_histogram": {str(k): v for k, v in sorted(self.histogram.items())},
                "dist_counters": dict(self.counters), "partial_abandoned_groups": parked,
                "trainer_follower_updates": follower_updates}

    # ------------------------------------------------------------------ the hook

    def collect_groups(self, st: Any, cfg: Any) -> tuple[list, dict[str, float]]:
        """run_rl_step's rollout: publish, admit, wait for batch T (named like the function it
        replaces so that the health watchdog reports this phase as 'rollout')."""
        if self.pg is None:
            self.start(st)
        t0, T = time.perf_counter(), int(st.policy.version)
        self.cfg = cfg
        if self.published != T:
            self._publish(st)
        self._dispatch(st, cfg, T)
        if self.d.fault.kill_worker_at_step == st.step + 1 and self.slots:
            self._inject_kill()
        results = self._gather(st, T)
        while self.d.partial.token_budget is not None and not any(res["groups"] for res in results):
            self.counters["partial/extra_rounds"] += 1  # every group parked: resume them under the same weights
            self.batches[T] = _Batch(len(self.slots))
            for w in range(len(self.slots)):
                self._submit(Order(T, w, [], cfg, T - self.d.max_staleness, meta={"per_round": 0}))
            results += self._gather(st, T)
        return self._finish(st, T, results, time.perf_counter() - t0)

    # ------------------------------------------------------------------ weights

    def _publish(self, st: Any) -> None:
        import ray

        arrays = to_numpy_state(make_publish_state(st.policy.model))  # LoRA: the adapters only
        self._weights = (int(st.policy.version), ray.put(arrays), compute_checksum(arrays))
        from tether.policy.hf import compute_logprobs

        with torch.no_grad():
            ids = torch.tensor([self.probe_ids])
            ref, _ = compute_logprobs(st.policy, ids, torch.ones_like(ids), 1.0)
        self._probe_refs[self._weights[0]] = ref[0, 1:].float().tolist()
        for v in [v for v in self._probe_refs if v < self._weights[0] - self.d.max_staleness - 8]:
            del self._probe_refs[v]
        self.published = self._weights[0]
        for s in self.slots.values():
            self._send_weights(s)

    def _send_weights(self, s: _Slot) -> None:
        version, ref, checksum = self._weights
        self._touch_if_idle(s)
        fut = s.handle.load_weights.remote(version, ref, checksum, self.probe_ids)
        self.calls[fut] = _Call("ack", s.index, version=version, checksum=checksum)

    def _on_ack(self, call: _Call, ack: dict[str, Any]) -> None:
        s = self.slots[call.slot]
        s.last_progress = time.monotonic()
        if not ack["ok"] or ack["checksum"] != call.checksum or ack["version"] != call.version:
            self.counters["sync/failures"] += 1
            log.warning("weight sync to worker %d failed: %s", s.index, ack.get("error", ack))
            if self.counters["sync/failures"] > 2 * max(1, len(self.slots)):
                raise SyncError(f"weight sync keeps failing (last: worker {s.index}: {ack.get('error')})")
            if call.version == self.published:
                self._send_weights(s)
            return
        s.version = call.version
        ref = self._probe_refs.get(call.version)
        if ref is None:  # an ack older than the probe references kept: the checksum stands alone
            self.counters["sync/probe_skipped"] += 1
            return
        gap = max((abs(a - b) for a, b in zip(ack["probe_logprobs"] or [], ref)), default=0.0)
        if s.probe is not None:
            self._step_sync["sync/probe_shift"] = max(
                self._step_sync.get("sync/probe_shift", 0.0),
                sum(abs(a - b) for a, b in zip(ack["probe_logprobs"], s.probe)) / max(len(s.probe), 1))
        s.probe = ack["probe_logprobs"]
        self._step_sync["sync/probe_gap"] = max(self._step_sync.get("sync/probe_gap", 0.0), gap)
        self._step_sync["sync/seconds"] = max(self._step_sync.get("sync/seconds", 0.0), ack.get("seconds", 0.0))
        if gap > self.d.sync.probe_tol:
            msg = (f"worker {s.index} loaded version {call.version} (checksum ok) but its probe log-probs differ from "
                   f"the trainer's by {gap:.3g} nats > dist.sync.probe_tol={self.d.sync.probe_tol:g}: the rollout engine "
                   "does not follow the new weights")
            self.counters["sync/probe_failures"] += 1
            if self.d.sync.on_probe_fail == "fail":
                raise SyncError(msg)
            log.warning(msg)

    # ------------------------------------------------------------------ orders

    def _dispatch(self, st: Any, cfg: Any, T: int) -> None:
        """Admission control: dispatch batches next_batch .. T + max_staleness (see staleness.py)."""
        for c in compute_admissible_batches(T, self.next_batch, self.d.max_staleness):
            for order in self._make_orders(st, cfg, c):
                self._submit(order)
            self.next_batch = c + 1

    def _make_orders(self, st: Any, cfg: Any, c: int) -> list[Order]:
        r, ds = cfg.rollout, cfg.algo.dynamic_sampling
        min_version = c - self.d.max_staleness
        if self.sequential:
            self.batches[c] = _Batch(1)
            return [Order(c, 0, [], cfg, min_version, st.generator.get_state(), st.stream.state_dict())]
        rounds = 1 + (ds.max_gen_batches if ds.enable and self.d.partial.token_budget is None else 0)
        drawn = [st.stream.next_batch(r.problems_per_step) for _ in range(rounds)]
        k = len(self.slots) or self.d.rollout_workers
        sizes = [r.problems_per_step // k + (w < r.problems_per_step % k) for w in range(k)]
        orders, start = [], 0
        for w, n in enumerate(sizes):
            if n == 0:
                continue
            problems = [p for batch in drawn for p in batch[start:start + n]]
            orders.append(Order(c, w, problems, cfg, min_version, meta={"per_round": n}))
            start += n
        self.batches[c] = _Batch(len(orders))
        return orders

    def _submit(self, order: Order, avoid: int | None = None) -> None:
        live = sorted(self.slots)
        if not live:
            raise RuntimeError("every rollout worker has died and dist.restart_workers is off")
        prefer = [i for i in live if i != avoid] or live
        s = self.slots[prefer[(order.shard + order.attempt) % len(prefer)]]
        self._touch_if_idle(s)
        fut = s.handle.run_order.remote(order)
        self.calls[fut] = _Call("order", s.index, order=order)

    def _touch_if_idle(self, s: _Slot) -> None:
        """A worker's silence clock (dist.order_timeout_s) starts when it is given work."""
        if not any(c.slot == s.index for c in self.calls.values()):
            s.last_progress = time.monotonic()

    def _inject_kill(self) -> None:
        import ray

        victim = self.slots[min(self.slots)]
        log.warning("dist.fault.kill_worker_at_step: killing rollout worker %d", victim.index)
        self.counters["dist/injected_kills"] += 1
        ray.kill(victim.handle, no_restart=True)

    # ------------------------------------------------------------------ waiting

    def _gather(self, st: Any, T: int) -> list[dict[str, Any]]:
        import ray

        batch = self.batches[T]
        while not batch.complete:
            if not self.calls:
                raise RuntimeError(f"internal: batch {T} is incomplete with nothing in flight")
            timeout = self._time_left()
            ready, _ = ray.wait(list(self.calls), num_returns=1, timeout=timeout)
            if not ready:
                self._expire()
                continue
            # and whatever else is ready (acks too), so that nothing waits for a later step
            ready += [f for f in ray.wait(list(self.calls), num_returns=len(self.calls), timeout=0)[0] if f not in ready]
            for fut in ready:
                if fut in self.calls:  # a failure handled above may have dropped its worker's calls
                    self._handle(fut, self.calls.pop(fut))
        del self.batches[T]
        return [res for res in batch.results.values() if res is not None]

    def _time_left(self) -> float:
        busy = {c.slot for c in self.calls.values() if c.slot in self.slots}
        if not busy:
            return 0.1
        now = time.monotonic()
        return max(0.05, min(self.slots[i].last_progress + self.d.order_timeout_s - now for i in busy))

    def _expire(self) -> None:
        now = time.monotonic()
        for i in {c.slot for c in self.calls.values()}:
            s = self.slots.get(i)
            if s is not None and now - s.last_progress > self.d.order_timeout_s:
                self._fail_worker(i, f"silent for {now - s.last_progress:.0f}s (dist.order_timeout_s)")

    def _handle(self, fut: Any, call: _Call) -> None:
        import ray

        try:
            value = ray.get(fut)
        except ray.exceptions.RayActorError as err:
            if call.slot in self.slots:
                self._fail_worker(call.slot, type(err).__name__)
            if call.kind == "order":
                self._retry(call.order, call.slot)
            return
        except ray.exceptions.RayTaskError as err:
            cause = err.as_instanceof_cause()
            if call.kind == "order" and isinstance(cause, StaleWorkerError):
                self.counters["dist/stale_refused"] += 1
                self._retry(call.order, call.slot)
                return
            raise cause from None  # a systematic failure inside the rollout (rewards, envs): stop, name it
        if call.slot not in self.slots:  # a late answer from a worker already replaced
            return
        if call.kind == "ack":
            self._on_ack(call, value)
            return
        s = self.slots[call.slot]
        s.last_progress, s.parked = time.monotonic(), int(value.get("parked", 0))
        self.batches[call.order.batch_version].results[call.order.shard] = value

    def _retry(self, order: Order, failed_slot: int) -> None:
        order.attempt += 1
        if order.attempt > self.d.max_retries:
            self.counters["dist/dropped_orders"] += 1
            self.counters["dist/dropped_problems"] += len(order.problems)
            self.batches[order.batch_version].results[order.shard] = None
            return
        self.counters["dist/retried_orders"] += 1
        self._submit(order, avoid=failed_slot)

    def _fail_worker(self, index: int, reason: str) -> None:
        import ray

        s = self.slots.pop(index)
        self.counters["dist/worker_failures"] += 1
        self.counters["partial/lost_groups"] += s.parked
        log.warning("rollout worker %d failed (%s); %s", index, reason,
                    "starting a replacement" if self.d.restart_workers else "continuing without it")
        try:
            ray.kill(s.handle, no_restart=True)
        except Exception:  # already dead
            pass
        orphans = [(f, c) for f, c in self.calls.items() if c.slot == index]
        for f, c in orphans:
            del self.calls[f]
        if self.d.restart_workers:
            self._spawn(s.bundle)
            self.counters["dist/worker_restarts"] += 1
        for _, c in orphans:
            if c.kind == "order":
                self._retry(c.order, index)

    # ------------------------------------------------------------------ the batch

    def _finish(self, st: Any, T: int, results: list[dict[str, Any]], waited: float) -> tuple[list, dict[str, float]]:
        groups = [g for res in results for g in res["groups"]]
        if not groups:
            raise RuntimeError(f"batch for trainer version {T} has no samples: every order was dropped after "
                               f"dist.max_retries={self.d.max_retries} retries ({dict(self.counters)})")
        if self.sequential:
            st.generator.set_state(results[0]["generator_state"])
            st.stream.load_state_dict(results[0]["stream_state"])
        # each shard's collect_groups already computed its rollout statistics (over its first
        # round, as tether train does); merging keeps that meaning with dynamic sampling on
        metrics = merge_metrics([(res["metrics"], max(len(res["groups"]), 1)) for res in results])
        metrics.update(pick_fingerprint(results))  # a mean of fingerprints matches no weights
        bound = self.d.max_staleness + (self.d.partial.max_parks if self.d.partial.token_budget else 0) \
            + self.d.cross_policy.pool_size * self.d.cross_policy.every
        metrics.update(compute_staleness_metrics(groups, T, bound))
        self.histogram.update(compute_lags(groups, T)[0])
        metrics.update(self._step_sync)
        self._step_sync = {}
        metrics.update({f"{k}": float(v) for k, v in self.counters.items()})
        metrics.update({
            "dist/workers_alive": float(len(self.slots)), "dist/orders": float(len(results)),
            "time/wait_rollout": waited, "rollout/worker_seconds": sum(res["seconds"] for res in results),
            "dist/acting_version_mean": sum(res["acting_version"] for res in results) / len(results),
            "partial/parked": float(sum(s.parked for s in self.slots.values())),
            "partial/resumed": float(sum(res.get("resumed", 0) for res in results)),
            "batch/groups": float(len(groups)),
        })
        return groups, metrics


__all__ = ["AsyncRollouts", "SyncError"]
