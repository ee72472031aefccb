"""Preflight (verl#7656): requests that cannot be placed fail at once with a message naming the fix."""

import pytest

from tether.config import load_config
from tether.dist.cluster import PreflightError, compute_bundles, compute_placement_problem, format_preflight_error


def test_bundles_follow_the_config():
    d = load_config(None, ["dist.rollout_workers=3", "dist.trainer_workers=2", "dist.placement.rollout.gpus=0.5"]).dist
    assert compute_bundles(d) == [{"CPU": 1.0, "GPU": 0.5}] * 3 + [{"CPU": 1.0}]
    with pytest.raises(PreflightError, match="0 CPUs and 0 GPUs"):
        compute_bundles(load_config(None, ["dist.placement.rollout.cpus=0"]).dist)


def test_placement_problems():
    node2 = {"CPU": 2.0}
    assert compute_placement_problem([{"CPU": 1.0}] * 2, [node2], "PACK") == ""
    assert "short of 1 CPU" in compute_placement_problem([{"CPU": 1.0}] * 3, [node2], "PACK")
    assert "short of 1 GPU" in compute_placement_problem([{"CPU": 1.0, "GPU": 1.0}], [node2], "PACK")
    # enough in total, but no single node holds a 3-CPU bundle
    assert "no node has room" in compute_placement_problem([{"CPU": 3.0}], [node2, node2], "PACK")
    assert "STRICT_PACK" in compute_placement_problem([{"CPU": 1.0}] * 3, [node2, node2], "STRICT_PACK")
    assert compute_placement_problem([{"CPU": 1.0}] * 3, [node2, node2], "SPREAD") == ""
    assert "a node per bundle" in compute_placement_problem([{"CPU": 1.0}] * 3, [node2, node2], "STRICT_SPREAD")


def test_message_names_request_cluster_and_fix():
    d = load_config(None, ["dist.rollout_workers=4"]).dist
    bundles = compute_bundles(d)
    msg = format_preflight_error(d, bundles, [{"CPU": 2.0}], compute_placement_problem(bundles, [{"CPU": 2.0}], "PACK"))
    for part in ("4 rollout worker(s)", "4 CPU", "short of 2 CPU", "node 0: 2 CPU", "dist.rollout_workers", "ray start"):
        assert part in msg, part
