"""Inline SVG line charts for the HTML report: no JavaScript, no network, crisp at any zoom.

    svg = render_line_chart({"reward/mean": [(1, 0.1), (2, 0.3)]}, title="reward", metric="reward")

Non-finite values break a line into segments (a NaN step is visible as a gap, not a fake
interpolation); a series with one point is drawn as a dot. Vertical markers (health events)
carry a `<title>` tooltip.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")
MARKER_COLORS = {"finding": "#d62728", "action": "#ff7f0e", "halt": "#000000", "hang": "#9467bd"}

Point = tuple[float, float]


def _finite(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(float(v)) else None


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 x 10^k)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], start
    while t <= hi + 1e-9 * step:
        ticks.append(round(t, 12))
        t += step
    return ticks


def fmt_num(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e4 or a < 1e-3:
        return f"{v:.1e}"
    return f"{v:.4g}"


def _segments(points: Sequence[tuple[float, float | None]]) -> list[list[Point]]:
    out: list[list[Point]] = [[]]
    for x, y in points:
        if y is None:
            if out[-1]:
                out.append([])
            continue
        out[-1].append((x, y))
    return [s for s in out if s]


@dataclass(frozen=True)
class ChartStyle:
    """How a line chart is drawn: its size in pixels, a log2 x axis, the note an empty chart shows."""

    width: int = 440
    height: int = 250
    log2_x: bool = False
    empty_note: str = "no data"


def render_line_chart(
    series: Mapping[str, Sequence[tuple[float, object]]],
    title: str,
    metric: str = "",
    xlabel: str = "step",
    markers: Iterable[tuple[float, str, str]] = (),
    style: ChartStyle = ChartStyle(),
) -> str:
    """One chart; `series` maps a label to (x, y) points; `markers` are (x, kind, tooltip)."""
    width, height, log2_x, empty_note = style.width, style.height, style.log2_x, style.empty_note
    left, right, top, bottom = 58, 12, 26, 40
    legend_h = 14 * len(series) if len(series) > 1 else 0
    h = height + legend_h
    pw, ph = width - left - right, height - top - bottom
    clean = {k: [(float(x), _finite(y)) for x, y in pts if _finite(x) is not None] for k, pts in series.items()}
    xs = [x for pts in clean.values() for x, y in pts if y is not None]
    ys = [y for pts in clean.values() for _, y in pts if y is not None]
    esc = html.escape
    head = (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" '
            f'viewBox="0 0 {width} {h}" role="img" aria-label="{esc(title)}" data-metric="{esc(metric or title)}" '
            f'data-points="{len(ys)}"><title>{esc(title)}</title>'
            f'<rect x="0" y="0" width="{width}" height="{h}" fill="#fff"/>'
            f'<text x="{width / 2}" y="16" text-anchor="middle" class="ct">{esc(title)}</text>')
    if not ys:
        return head + f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="muted">{esc(empty_note)}</text></svg>'
    tx = (lambda x: math.log2(x) if x > 0 else 0.0) if log2_x else (lambda x: x)
    x_lo, x_hi = min(tx(x) for x in xs), max(tx(x) for x in xs)
    y_lo, y_hi = min(ys), max(ys)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    if y_hi == y_lo:
        pad = abs(y_lo) * 0.1 or 1.0
        y_lo, y_hi = y_lo - pad, y_hi + pad
    else:
        pad = (y_hi - y_lo) * 0.05
        y_lo, y_hi = y_lo - pad, y_hi + pad

    def sx(x: float) -> float:
        return left + (tx(x) - x_lo) / (x_hi - x_lo) * pw

    def sy(y: float) -> float:
        return top + (1 - (y - y_lo) / (y_hi - y_lo)) * ph

    parts = [head, f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>']
    for t in nice_ticks(y_lo, y_hi):
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 4}" y="{sy(t) + 3:.1f}" text-anchor="end" class="tick">{fmt_num(t)}</text>')
    x_ticks = ([2 ** i for i in range(int(math.floor(x_lo)), int(math.ceil(x_hi)) + 1)] if log2_x
               else nice_ticks(x_lo, x_hi))
    for t in x_ticks:
        if x_lo - 1e-9 <= tx(t) <= x_hi + 1e-9:
            parts.append(f'<text x="{sx(t):.1f}" y="{top + ph + 14}" text-anchor="middle" class="tick">{fmt_num(t)}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{top + ph + 30}" text-anchor="middle" class="tick">{esc(xlabel)}</text>')
    for x, kind, tip in markers:
        if _finite(x) is not None and x_lo <= tx(x) <= x_hi:
            color = MARKER_COLORS.get(kind, "#7f7f7f")
            parts.append(f'<line class="marker" x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{top}" y2="{top + ph}" stroke="{color}" '
                         f'stroke-dasharray="3,3"><title>{esc(tip)}</title></line>')
    for i, (label, pts) in enumerate(clean.items()):
        color = PALETTE[i % len(PALETTE)]
        for seg in _segments(pts):
            if len(seg) == 1 or len(seg) <= 12:
                parts.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in seg)
            if len(seg) > 1:
                coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in seg)
                parts.append(f'<polyline class="series" data-label="{esc(label)}" points="{coords}" fill="none" '
                             f'stroke="{color}" stroke-width="1.6"/>')
        if len(series) > 1:
            ly = height + 14 * i
            parts.append(f'<rect x="{left}" y="{ly - 8}" width="10" height="10" fill="{color}"/>'
                         f'<text x="{left + 14}" y="{ly + 1}" class="tick">{esc(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_timeline(events: Sequence[tuple[float, str, str]], x_max: float, title: str = "health timeline",
                    width: int = 900) -> str:
    """One lane per event kind; each event a dot at its step with a `<title>` tooltip."""
    kinds = list(dict.fromkeys(kind for _, kind, _ in events))
    left, right, top, lane = 110, 16, 26, 22
    h = top + lane * max(len(kinds), 1) + 30
    pw = width - left - right
    x_hi = max([x_max] + [x for x, _, _ in events]) or 1.0
    esc = html.escape

    def sx(x: float) -> float:
        return left + x / x_hi * pw

    parts = [f'<svg class="chart timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" '
             f'viewBox="0 0 {width} {h}" role="img" aria-label="{esc(title)}" data-metric="health" data-points="{len(events)}">'
             f'<title>{esc(title)}</title><rect x="0" y="0" width="{width}" height="{h}" fill="#fff"/>'
             f'<text x="{width / 2}" y="16" text-anchor="middle" class="ct">{esc(title)}</text>']
    for i, kind in enumerate(kinds):
        y = top + lane * i + lane / 2
        color = MARKER_COLORS.get(kind, PALETTE[i % len(PALETTE)])
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y}" y2="{y}" stroke="#eee"/>'
                     f'<text x="{left - 6}" y="{y + 4}" text-anchor="end" class="tick">{esc(kind)}</text>')
        parts.extend(f'<circle class="event" cx="{sx(x):.1f}" cy="{y}" r="5" fill="{color}"><title>{esc(tip)}</title></circle>'
                     for x, k, tip in events if k == kind)
    axis_y = top + lane * max(len(kinds), 1) + 4
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{axis_y}" y2="{axis_y}" stroke="#bbb"/>')
    for t in nice_ticks(0.0, x_hi, 8):
        parts.append(f'<text x="{sx(t):.1f}" y="{axis_y + 14}" text-anchor="middle" class="tick">{fmt_num(t)}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{axis_y + 26}" text-anchor="middle" class="tick">step</text></svg>')
    return "".join(parts)
