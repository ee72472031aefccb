"""The training engine: what every RL-style recipe composes.

    state.py     the typed run state (`RLState`): policy, optimizer, scheduler, reference, critic, RNG, step
    setup.py     seeding, the problems, the policy (model.path or a tiny local model), LoRA, resume
    batch.py     a step's groups -> the train batch (`make_train_batch`: shaping, filtering, advantages)
    groups.py    group-level shaping, compact filtering, dynamic sampling's informative groups
    batching.py  trajectories -> padded token records (masks from lengths and stop reasons)
    credit.py    per-turn step fields of the advantage estimators (GiGPO anchors, task ids)
    update.py    M epochs x mini-batches of the policy update (losses, KL, critic, gradient clipping)
    loop.py      the loop's chrome: a graceful Ctrl-C and a progress bar

The recipes (`tether.recipes`) read top to bottom and only compose these pieces with the rollout
(`tether.rollout`). Nothing is imported here, so `import tether.train.batching` stays light.
"""
