"""`tether report RUN_DIR`: one self-contained HTML file (inline CSS and SVG; no script, no
network) with the training curves, the evaluation and its test-time-scaling curves, the health
timeline, sample trajectories turn by turn, and the resolved config.

Sections carry stable ids (`summary`, `curves`, `evaluation`, `health`, `trajectories`,
`config`) so that tests and tools can find them. Records of `health.jsonl` and turns of
multi-turn samples are rendered generically: whatever keys a record has are shown.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tether.eval.tts import compute_tts_curves, make_problem_samples
from tether.report.data import RunData, load_run, read_jsonl_gz
from tether.report.svg import ChartStyle, fmt_num, render_line_chart, render_timeline

esc = html.escape

# Chart title -> metric keys (present ones are drawn). The first eight are always shown.
CURVE_GROUPS: list[tuple[str, tuple[str, ...]]] = [
    ("reward", ("reward/mean", "reward/std", "reward/total/mean")),
    ("accuracy", ("accuracy", "eval/pass@1", "eval/greedy_accuracy", "eval/maj@4", "eval/best@4")),
    ("KL", ("kl_loss", "approx_kl", "kl_reward", "rollout_kl_k3")),
    ("entropy", ("entropy",)),
    ("response length", ("response_length/mean", "response_length/max", "response_length/min")),
    ("clip fraction", ("clip_frac", "clip_frac_low", "clip_frac_high", "dual_clip_frac")),
    ("grad norm", ("grad_norm", "grad_norm_max")),
    ("throughput (tokens/s)", ("rollout/tokens_per_s", "train/tokens_per_s")),
    ("loss", ("pg_loss", "value_loss", "sft/loss")),
    ("zero-variance groups / truncation", ("frac_zero_variance_groups", "truncation_rate")),
    ("step time (s)", ("time/step", "time/generate", "time/update", "time/eval")),
    ("learning rate", ("lr",)),
]
REQUIRED_CHARTS = 8

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#f6f7f9}
header{background:#1f2937;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header .sub{color:#cbd5e1;font-size:13px;margin-top:4px}
nav{padding:6px 24px;background:#e5e7eb;font-size:13px}nav a{margin-right:14px;color:#1f2937}
section{background:#fff;margin:14px 24px;padding:12px 18px;border-radius:6px;box-shadow:0 1px 2px rgba(0,0,0,.08)}
h2{font-size:17px;margin:4px 0 10px}h3{font-size:14px;margin:12px 0 6px}
.grid{display:flex;flex-wrap:wrap;gap:10px}.chart{border:1px solid #e5e7eb;border-radius:4px}
.ct{font-size:12px;font-weight:600}.tick{font-size:10px;fill:#444}.muted{fill:#888;font-size:12px;color:#888}
table{border-collapse:collapse;font-size:12px}td,th{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f4f6}.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f8fafc;border:1px solid #e5e7eb;padding:8px;font-size:12px;white-space:pre-wrap;word-break:break-word;margin:4px 0}
.trajectory{border:1px solid #d1d5db;border-radius:6px;margin:8px 0;padding:6px 10px}
.trajectory .meta{font-size:12px;color:#444}.turn{border-left:3px solid #9ca3af;margin:6px 0;padding:2px 8px}
.turn.role-user,.turn.role-prompt{border-color:#3b82f6}.turn.role-assistant,.turn.role-completion{border-color:#10b981}
.turn.role-tool,.turn.role-observation{border-color:#f59e0b}.turn .role{font-size:11px;font-weight:600;text-transform:uppercase;color:#555}
.badge{display:inline-block;padding:0 6px;border-radius:8px;font-size:11px;color:#fff;background:#6b7280}
.ok{background:#059669}.bad{background:#dc2626}.kind-finding{background:#dc2626}.kind-action{background:#d97706}
.kind-halt{background:#111}.warn{color:#b45309;font-size:12px}
"""


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return fmt_num(v)
    if isinstance(v, (dict, list)):
        text = json.dumps(v, default=str)
        return text if len(text) <= 300 else text[:297] + "..."
    return str(v)


def _kv_table(items: Iterable[tuple[str, Any]], cls: str = "kv") -> str:
    rows = "".join(f"<tr><th>{esc(str(k))}</th><td class='num'>{esc(_fmt(v))}</td></tr>" for k, v in items)
    return f"<table class='{cls}'>{rows}</table>" if rows else "<p class='muted'>nothing recorded</p>"


# ----------------------------------------------------------------------------- sections


QUIET_KINDS = ("context",)  # run metadata the monitor records for replay, not events: table only


def health_markers(data: RunData) -> list[tuple[float, str, str]]:
    """(step, kind, tooltip) of every health record that has a step (curve markers, timeline)."""
    out = []
    for rec in data.health or []:
        step = rec.get("step")
        if isinstance(step, (int, float)) and rec.get("kind") not in QUIET_KINDS:
            kind = str(rec.get("kind", "event"))
            label = rec.get("detector") or rec.get("event") or rec.get("cause") or rec.get("message") or ""
            out.append((float(step), kind, f"step {step}: {kind} {label}".strip()))
    return out


def render_summary(data: RunData) -> str:
    s = data.summary
    items = [(k, v) for k, v in s.items() if not isinstance(v, (dict, list))]
    train = [r for r in data.metrics if isinstance(r.get("step"), int) and r["step"] > 0]
    items.append(("metric rows", len(data.metrics)))
    if train:
        items.append(("last step", train[-1]["step"]))
    warn = "".join(f"<p class='warn'>{esc(w)}</p>" for w in data.warnings)
    return f"<section id='summary'><h2>Summary</h2>{_kv_table(items)}{warn}</section>"


def render_curves(data: RunData, markers: Sequence[tuple[float, str, str]]) -> str:
    keys = set(data.keys())
    charts = []
    for i, (title, group) in enumerate(CURVE_GROUPS):
        present = [k for k in group if k in keys]
        if not present and i >= REQUIRED_CHARTS:
            continue
        series = {k: data.series(k) for k in present}
        note = ChartStyle(empty_note=f"not logged by this run ({', '.join(group[:2])})")
        charts.append(render_line_chart(series, title, metric=title, markers=markers, style=note))
    note = "<p class='muted'>dashed lines: health events (hover for details)</p>" if markers else ""
    return f"<section id='curves'><h2>Training curves</h2>{note}<div class='grid'>{''.join(charts)}</div></section>"


def _tts_from_file(path: Path) -> dict[str, dict[int, float]] | None:
    rows = read_jsonl_gz(path)
    probs = make_problem_samples(rows)
    if not probs or min(p.n for p in probs) < 1:
        return None
    try:
        return compute_tts_curves(probs)
    except ValueError:
        return None


def render_evaluation(data: RunData) -> str:
    files = data.files("eval")
    parts = []
    evals = [r for r in data.metrics if "eval/pass@1" in r]
    if evals:
        keys = [k for k in evals[-1] if k.startswith("eval/")]
        head = "".join(f"<th>{esc(k[5:])}</th>" for k in keys)
        body = "".join("<tr><td>" + str(r.get("step")) + "</td>" + "".join(
            f"<td class='num'>{esc(_fmt(r.get(k)))}</td>" for k in keys) + "</tr>" for r in evals)
        parts.append(f"<table><tr><th>step</th>{head}</tr>{body}</table>")
    curves_by_label: dict[str, dict[str, dict[int, float]]] = {}
    picks = [files[0], files[-1]] if len(files) > 1 else files
    for f in picks:
        c = _tts_from_file(f.path)
        if c:
            curves_by_label[f"step {f.step}"] = c
    if data.eval_json and isinstance(data.eval_json.get("curves"), dict):
        curves_by_label["eval.json"] = {n: {int(k): v for k, v in c.items()} for n, c in data.eval_json["curves"].items()}
    charts = []
    for name in ("pass@k", "maj@k", "best@k"):
        series = {label: sorted(c[name].items()) for label, c in curves_by_label.items() if name in c}
        if series:
            charts.append(render_line_chart(series, f"{name} vs k", metric=f"tts-{name}", xlabel="k", style=ChartStyle(log2_x=True)))
    if charts:
        parts.append("<h3>Test-time scaling (k = 1..samples per problem)</h3><div class='grid'>" + "".join(charts) + "</div>")
        parts.append(interpret_tts(curves_by_label))
    if not parts:
        parts.append("<p class='muted'>no evaluation recorded</p>")
    return "<section id='evaluation'><h2>Evaluation</h2>" + "".join(parts) + "</section>"


def interpret_tts(curves_by_label: Mapping[str, Mapping[str, Mapping[int, float]]]) -> str:
    """Sharpening (pass@1 up, pass@K flat) or new coverage (pass@K up), first vs last eval."""
    labels = [lbl for lbl in curves_by_label if lbl.startswith("step ")]
    if len(labels) < 2:
        return ""
    a, b = curves_by_label[labels[0]]["pass@k"], curves_by_label[labels[-1]]["pass@k"]
    k_big = max(set(a) & set(b))
    d1, dk = b[1] - a[1], b[k_big] - a[k_big]
    if d1 > 0.02 and dk <= 0.02:
        verdict = "sharpening: pass@1 rose but pass@{k} did not: RL amplified answers the model could already reach"
    elif dk > 0.02:
        verdict = "coverage grew: pass@{k} rose, so some problems became solvable that were not"
    else:
        verdict = "no clear change in pass@1 or pass@{k}"
    return (f"<p>{labels[0]} → {labels[-1]}: pass@1 {a[1]:.3f} → {b[1]:.3f} ({d1:+.3f}), "
            f"pass@{k_big} {a[k_big]:.3f} → {b[k_big]:.3f} ({dk:+.3f}). {esc(verdict.format(k=k_big))}.</p>")


def render_health(data: RunData, markers: Sequence[tuple[float, str, str]]) -> str:
    if data.health is None:
        body = "<p class='muted'>no health.jsonl in this run (health monitoring off or not yet run)</p>"
    elif not data.health:
        body = "<p>health.jsonl is empty: no findings, actions or halts.</p>"
    else:
        last = max([r["step"] for r in data.metrics if isinstance(r.get("step"), int)] + [0])
        strip = render_timeline(markers, float(last)) if markers else ""
        rows = []
        for rec in data.health:
            kind = str(rec.get("kind", "event"))
            rest = [(k, v) for k, v in rec.items() if k not in ("step", "kind")]
            details = "; ".join(f"<b>{esc(k)}</b>={esc(_fmt(v))}" for k, v in rest)
            rows.append(f"<tr class='health-record'><td class='num'>{esc(_fmt(rec.get('step', '')))}</td>"
                        f"<td><span class='badge kind-{esc(kind)}'>{esc(kind)}</span></td><td>{details}</td></tr>")
        body = (strip + f"<p>{len(data.health)} record(s)</p><table><tr><th>step</th><th>kind</th><th>details</th></tr>"
                + "".join(rows) + "</table>")
    return f"<section id='health'><h2>Health timeline</h2>{body}</section>"


TEXT_KEYS = ("content", "text", "action", "observation", "completion", "prompt", "message")


def render_turn(turn: Mapping[str, Any] | str, index: int) -> str:
    """One turn of a multi-turn sample, whatever its keys: role, text, tool calls, the rest."""
    if not isinstance(turn, Mapping):
        return f"<div class='turn'><div class='role'>turn {index}</div><pre>{esc(str(turn))}</pre></div>"
    role = str(turn.get("role") or turn.get("type") or f"turn {index}")
    body = []
    for k in TEXT_KEYS:
        if isinstance(turn.get(k), str):
            body.append(f"<pre>{esc(turn[k])}</pre>")
    calls = turn.get("tool_calls") or turn.get("tool_call")
    if calls:
        for call in calls if isinstance(calls, list) else [calls]:
            body.append(f"<pre class='tool-call'>🔧 {esc(json.dumps(call, default=str, indent=1))}</pre>")
    rest = {k: v for k, v in turn.items() if k not in (*TEXT_KEYS, "role", "type", "tool_calls", "tool_call")}
    if rest:
        body.append(f"<div class='meta'>{esc(_fmt(rest))}</div>")
    return f"<div class='turn role-{esc(role.split()[0].lower())}'><div class='role'>{esc(role)}</div>{''.join(body)}</div>"


def render_trajectory(row: Mapping[str, Any], label: str) -> str:
    correct = row.get("correct")
    badge = ("<span class='badge ok'>correct</span>" if correct else "<span class='badge bad'>wrong</span>") if correct is not None else ""
    meta = [f"{label}", f"task {row.get('task_id', '?')}"]
    for k in ("reward", "outcome", "stop", "tokens", "answer", "pred", "score"):
        if k in row:
            meta.append(f"{k}={_fmt(row[k])}")
    turns = row.get("turns")
    if isinstance(turns, list) and turns:
        inner = "".join(render_turn(t, i) for i, t in enumerate(turns))
    else:
        inner = (f"<div class='turn role-prompt'><div class='role'>prompt</div><pre>{esc(str(row.get('prompt', '')))}</pre></div>"
                 f"<div class='turn role-completion'><div class='role'>completion</div><pre>{esc(str(row.get('completion', '')))}</pre></div>")
    comps = row.get("components")
    extra = f"<div class='meta'>components: {esc(_fmt(comps))}</div>" if comps else ""
    return f"<div class='trajectory'><div class='meta'>{badge} {esc(' · '.join(meta))}</div>{inner}{extra}</div>"


def render_trajectories(data: RunData, per_step: int = 3) -> str:
    """The first few samples of the first, middle and last logged steps, and of the last evaluation."""
    files = data.files("step")
    steps = sorted({f.step for f in files})
    picks = sorted({steps[0], steps[len(steps) // 2], steps[-1]}) if steps else []
    parts = []
    for step in picks:
        rows = [r for f in files if f.step == step for r in read_jsonl_gz(f.path, limit=per_step)][:per_step]
        if rows:
            parts.append(f"<h3>step {step}</h3>" + "".join(render_trajectory(r, f"step {step}") for r in rows))
    evals = data.files("eval")
    if evals:
        rows = read_jsonl_gz(evals[-1].path, limit=per_step)
        if rows:
            parts.append(f"<h3>evaluation at step {evals[-1].step}</h3>"
                         + "".join(render_trajectory(r, f"eval {evals[-1].step}") for r in rows))
    if not parts:
        parts.append("<p class='muted'>no samples recorded (logging.samples_per_step=0?)</p>")
    return "<section id='trajectories'><h2>Sample trajectories</h2>" + "".join(parts) + "</section>"


def render_config(data: RunData) -> str:
    text = data.config_text or "(no config.yaml)"
    return f"<section id='config'><h2>Config</h2><pre>{esc(text)}</pre></section>"


def render_report(data: RunData, stages: list[dict[str, Any]] | None = None) -> str:
    """`stages`: a multi-stage pipeline's stage rows (tether.report.stages), shown first."""
    from tether.report.stages import render_stages

    markers = health_markers(data)
    sections = [render_summary(data), render_curves(data, markers), render_evaluation(data),
                render_health(data, markers), render_trajectories(data), render_config(data)]
    names = ["summary", "curves", "evaluation", "health", "trajectories", "config"]
    if stages:
        sections.insert(0, render_stages(stages, esc))
        names.insert(0, "stages")
    nav = "".join(f"<a href='#{s}'>{s}</a>" for s in names)
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>tether report: {esc(data.name)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>tether report: {esc(data.name)}</h1><div class='sub'>{esc(str(data.root))} · generated "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}</div></header><nav>{nav}</nav>{''.join(sections)}</body></html>")


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Render the report of `run_dir` to `out` (default: <run>/report.html); returns the path."""
    from tether.report.stages import last_stage_run, load_stages

    stages = load_stages(Path(run_dir))
    last = last_stage_run(Path(run_dir), stages) if stages else None
    data = load_run(last or Path(run_dir))
    path = Path(out) if out else (Path(run_dir) if stages else data.root) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(data, stages), encoding="utf-8")
    return path
