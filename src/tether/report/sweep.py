"""`tether report SWEEP_DIR`: the sweep's table (mean +- s.e. per arm, differences from the first
arm), its plot inlined, and links to every run's own directory — one self-contained HTML file."""

from __future__ import annotations

import base64
import html
import json
import math
import time
from pathlib import Path

from tether.report.html import CSS

esc = html.escape


def _num(v: float) -> str:
    return "—" if v is None or not math.isfinite(v) else f"{v:.4f}"


def render_sweep(payload: dict, plot_png: bytes | None, root: Path) -> str:
    spec, rows = payload["spec"], payload["table"]
    head = "<tr><th>arm</th><th>n</th><th>mean</th><th>s.e.</th><th>seeds</th><th>vs first arm (± s.e.)</th></tr>"
    body = []
    for r in rows:
        d = r.get("vs_first")
        dcell = "reference" if d is None else (f"{d['diff']:+.4f} ± {_num(d['se'])} ({d['kind']}"
                                               f"{', within noise' if d['within_noise'] else ''})")
        seeds = ", ".join(f"{s}: {v:.3f}" for s, v in r["values"].items())
        body.append(f"<tr><td>{esc(r['arm'])}</td><td class='num'>{r['n']}</td><td class='num'>{_num(r['mean'])}</td>"
                    f"<td class='num'>{_num(r['se'])}</td><td>{esc(seeds)}</td><td>{esc(dcell)}</td></tr>")
    img = "" if plot_png is None else (
        f"<img alt='sweep plot' src='data:image/png;base64,{base64.b64encode(plot_png).decode()}'>")
    runs = "".join(f"<li>{esc(r['arm'])} seed {r['seed']}: <code>{esc(r['run_dir'])}</code> "
                   f"({esc(spec['metric'])} = {_num(r['value']) if r['value'] is not None else '—'})</li>"
                   for r in payload["runs"])
    fails = "".join(f"<li class='warn'>{esc(f)}</li>" for f in payload.get("failures", []))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>tether sweep: {esc(root.name)}</title>"
            f"<style>{CSS}</style></head><body><header><h1>tether sweep: {esc(root.name)}</h1>"
            f"<div class='sub'>{esc(str(root))} · command {esc(spec['command'])} · metric {esc(spec['metric'])} · "
            f"seeds {esc(str(spec['seeds']))} · generated {time.strftime('%Y-%m-%d %H:%M')}</div></header>"
            f"<section id='table'><h2>{esc(spec['metric'])} per arm</h2><table>{head}{''.join(body)}</table>"
            f"<p class='muted'>standard error = s / sqrt(n); paired differences when both arms ran the same seeds; "
            f"'within noise' = |difference| &lt; 2 s.e.</p></section>"
            f"<section id='plot'><h2>plot</h2>{img}</section>"
            f"<section id='runs'><h2>runs</h2><ul>{runs}</ul>{'<ul>' + fails + '</ul>' if fails else ''}</section>"
            f"<section id='config'><h2>grid</h2><pre>{esc(json.dumps(spec, indent=1))}</pre></section></body></html>")


def write_sweep_report(root: str | Path, out: str | Path | None = None) -> Path:
    root = Path(root)
    payload = json.loads((root / "sweep.json").read_text())
    png = root / "plots" / "sweep.png"
    path = Path(out) if out else root / "report.html"
    path.write_text(render_sweep(payload, png.read_bytes() if png.exists() else None, root), encoding="utf-8")
    return path
