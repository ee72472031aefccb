"""tether.runtime: glibc malloc keeps freed memory, so a step's activations reuse mapped pages."""

import platform
import subprocess
import sys

import pytest

PROBE = """
import random, resource, sys, torch
if sys.argv[1] == "retain":
    from tether.runtime import retain_freed_memory
    assert retain_freed_memory()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rng = random.Random(0)
sizes = [rng.randint(1 << 17, 3 << 20) for _ in range(40)]  # 0.5-12 MiB float32 buffers, like a step's activations
per_step = []
for step in range(10):
    f0 = faults()
    held = [torch.empty(n).fill_(1.0) for n in sizes]  # held until the "backward", then all freed
    del held
    per_step.append(faults() - f0)
print(sum(per_step[2:]))  # steady state: after glibc's adaptive thresholds have settled
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=120)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0].startswith("glibc"), reason="glibc only")
def test_retained_memory_is_reused_without_page_faults():
    default, retained = _faults("default"), _faults("retain")
    assert default > 5000  # the control: glibc hands memory back between steps and faults it in again
    assert retained * 10 < default  # kept: the next step reuses mapped pages


def test_retain_is_idempotent_and_on_by_default_for_cpu_runs():
    from tether.config import TetherConfig
    from tether.runtime import retain_freed_memory

    first = retain_freed_memory()
    assert retain_freed_memory() == first
    assert TetherConfig().run.retain_memory is None  # None: on for CPU-only runs (seed_everything)
