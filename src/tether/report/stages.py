"""A multi-stage pipeline's stages side by side (`tether report PIPELINE_DIR`): held-out metrics
after every stage, from the pipeline's summary.json (recipes/multistage.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = (("eval/pass@1", "pass@1"), ("eval/greedy_accuracy", "greedy"), ("eval/answer_tokens", "tokens/answer"),
           ("eval/turns_mean", "turns"))


def load_stages(path: Path) -> list[dict[str, Any]] | None:
    """The stage rows of a pipeline directory's summary.json, or None for any other directory."""
    f = Path(path) / "summary.json"
    try:
        summary = json.loads(f.read_text()) if f.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return None
    rows = summary.get("stages") if isinstance(summary, dict) else None
    return rows if isinstance(rows, list) and rows else None


def last_stage_run(path: Path, rows: list[dict[str, Any]]) -> Path | None:
    """The last stage folder with metrics (the one whose curves the report draws)."""
    for row in reversed(rows):
        d = Path(path) / str(row.get("name"))
        if (d / "metrics.jsonl").is_file():
            return d
    return None


def format_stage_table(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Header + one row per stage: name, kind, the held-out columns present, seconds."""
    cols = [(k, label) for k, label in COLUMNS if any(k in r.get("heldout", {}) for r in rows)]
    out = [["stage", "kind", *(label for _, label in cols), "seconds"]]
    for r in rows:
        h = r.get("heldout", {})
        out.append([str(r.get("name")), str(r.get("kind")),
                    *(f"{h[k]:.3f}" if isinstance(h.get(k), (int, float)) else "–" for k, _ in cols),
                    f"{r.get('seconds', 0.0):.0f}"])
    return out


def render_stages(rows: list[dict[str, Any]], esc) -> str:
    table = format_stage_table(rows)
    head = "".join(f"<th>{esc(c)}</th>" for c in table[0])
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in table[1:])
    return (f"<section id='stages'><h2>Stages</h2><p>held-out metrics of each stage's model, in pipeline order</p>"
            f"<table class='kv'><tr>{head}</tr>{body}</table></section>")
