"""tether.dist — Ray runner for asynchronous / distributed RL (recipes/rl_async.py, docs/distributed.md).

    config.py      the `dist:` config section and its consistency checks (explicit off-policy correction)
    cluster.py     start or join Ray, preflight resource check (fails fast, never hangs), placement
    worker.py      RolloutWorker: weight-sync handshake + probe, admission guard, orders -> groups
    controller.py  AsyncRollouts: publish weights, admission control, the queue, failure handling
    staleness.py   admission rule and staleness metrics (histogram)
    partial.py     turn-level partial rollouts (park over budget, continue with newer weights)
    pool.py        cross-policy sampling from a pool of recent versions
    trainer.py     data-parallel trainer ranks (gloo on CPU, NCCL on GPU)

Nothing here imports ray, transformers or vllm at import time.
"""
