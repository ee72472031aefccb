"""What tools/gen_results.py's entries share: the `Entry` record and one way of printing numbers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Entry:
    """One section of docs/results.md.

    sources: name -> repository-relative path; `read` gets {name: loaded file} (JSON parsed, other
    files as text) and returns the values `text` and `headline` name as `{value}` placeholders.
    optional: names of sources the section can do without (the reader gets None for them).
    """

    key: str
    title: str
    sources: dict[str, str]
    command: str
    read: Callable[[dict[str, Any]], dict[str, Any]]
    text: str
    headline: str = ""
    optional: tuple[str, ...] = ()


# ---- formatting: every entry prints numbers the same way -------------------------------------------

def f2(x: float) -> str:
    return f"{x:.2f}"


def f3(x: float) -> str:
    return f"{x:.3f}"


def pts(frac: float) -> str:
    """A difference of two fractions in percentage points, signed: 0.1825 -> '+18.3'."""
    return f"{frac * 100:+.1f}"


def pct(frac: float, digits: int = 0) -> str:
    return f"{frac * 100:.{digits}f}%"


def mmss(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (sample s.d., ddof 1, over sqrt(n)), as tether's sweeps report them."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, (var / n) ** 0.5


def pm(values: list[float], fmt: str = "{:+.1f}") -> str:
    mean, se = mean_se(values)
    return f"{fmt.format(mean)} ± {abs(se):.1f}" if se == se else fmt.format(mean)


def loadavg(values: list[float] | None) -> str:
    return "/".join(f"{v:.1f}" for v in values) if values else "not recorded"


def cpu_of(machine: dict) -> str:
    """'AMD EPYC (native-bf16, family 25 model 17)' from a result's machine / precision block."""
    parts = [p for p in (machine.get("cpu_class"), machine.get("cpu_generation")) if p]
    return f"{machine.get('cpu', 'CPU')} ({', '.join(parts)})" if parts else machine.get("cpu", "CPU")


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
