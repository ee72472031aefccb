"""The dist: section: defaults equal the synchronous recipe; an explicit off-policy correction is
required once samples can be stale, and it must match what algo.correction applies."""

import pytest

from tether.config import ConfigError, load_config


def test_defaults_are_synchronous():
    d = load_config(None).dist
    assert d.max_staleness == 0 and d.correction is None and d.partial.token_budget is None
    assert d.cross_policy.pool_size == 0 and d.backend == "hf"


@pytest.mark.parametrize("override", ["dist.max_staleness=2", "dist.cross_policy.pool_size=2"])
def test_staleness_needs_an_explicit_correction(override):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert "choose the off-policy correction explicitly" in msg
    for choice in ("tis", "mis", "opm", "none"):
        assert f"{choice} = " in msg


def test_each_choice_must_match_algo_correction():
    assert load_config(None, ["dist.max_staleness=1", "dist.correction=tis"]).dist.correction == "tis"
    with pytest.raises(ConfigError, match="dist.correction=none .* needs algo.correction.mode=none"):
        load_config(None, ["dist.max_staleness=1", "dist.correction=none"])
    load_config(None, ["dist.max_staleness=1", "dist.correction=none", "algo.correction.mode=none"])
    load_config(None, ["dist.max_staleness=1", "dist.correction=mis", "algo.correction.mode=mask",
                       "algo.correction.threshold_low=0.5"])
    with pytest.raises(ConfigError, match="off_policy_mask_delta"):
        load_config(None, ["dist.max_staleness=1", "dist.correction=opm"])
    load_config(None, ["dist.max_staleness=1", "dist.correction=opm", "algo.correction.off_policy_mask_delta=0.1"])


@pytest.mark.parametrize("overrides, match", [
    (["dist.partial.token_budget=64", "dist.correction=tis"], "set dist.max_staleness >= 1"),
    (["dist.backend=vllm"], "needs a GPU per rollout worker"),
    (["dist.trainer_workers=2", "health.mode=auto"], "replicas"),
    (["dist.ray_address=auto", "dist.num_cpus=2"], "does nothing with dist.ray_address"),
    (["dist.trainer_sharding=fsdp2"], "set dist.trainer_workers >= 2"),
    (["dist.trainer_sharding=fsdp2", "dist.trainer_workers=2", "algo.advantage.name=gae"], "does not shard the critic"),
    (["dist.trainer_sharding=fsdp3"], "trainer_sharding"),
    (["dist.trainer_sharding=fsdp2", "dist.trainer_workers=4", "rollout.problems_per_step=2", "rollout.n=2",
      "algo.mini_batches=2"], "2 sequences per mini-batch cannot feed 4 ranks"),
    (["dist.inflight=true"], "dist.inflight cannot work with dist.max_staleness=0"),
    (["dist.inflight=true", "dist.max_staleness=1", "dist.correction=tis", "algo.correction.mode=truncate",
      "dist.backend=vllm", "dist.placement.rollout.gpus=1"], "dist.inflight cannot work with the vllm backend"),
])
def test_impossible_combinations_are_rejected(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)
