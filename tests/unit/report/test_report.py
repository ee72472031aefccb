"""The HTML report and compare page: sections, charts, health records, turns; self-contained."""

from __future__ import annotations

import re

from report_helpers import make_fake_run, parse

from tether.report.compare import format_comparison, render_compare_html, run_compare
from tether.report.data import compute_cumulative_compute, load_run, resolve_run_dir
from tether.report.html import REQUIRED_CHARTS, render_report, render_turn, write_report
from tether.report.svg import nice_ticks, render_line_chart

SECTIONS = ("summary", "curves", "evaluation", "health", "trajectories", "config")


def test_report_has_every_section_chart_and_trajectory(tmp_path):
    run = make_fake_run(tmp_path / "run")
    path = write_report(run)
    assert path == run / "report.html"
    text = path.read_text()
    dom = parse(text)
    assert [a["id"] for a in dom.find("section")] == list(SECTIONS)
    charts = {a["data-metric"]: int(a["data-points"]) for a in dom.find("svg", class_="chart")}
    for name in ("reward", "accuracy", "KL", "entropy", "response length", "clip fraction", "grad norm",
                 "throughput (tokens/s)"):
        assert charts[name] > 0, name
    assert charts["tts-pass@k"] > 0 and charts["tts-maj@k"] > 0 and charts["tts-best@k"] > 0
    assert charts["health"] == 2  # two records carry a step; the third is listed only
    assert len(dom.find("line", class_="marker")) >= 2 * REQUIRED_CHARTS  # health events marked on curves
    assert len(dom.find("tr", class_="health-record")) == 3
    assert "something_new" in text and "entropy_collapse" in text and "algo.entropy_coef" in text
    trajs = dom.find("div", class_="trajectory")
    assert len(trajs) >= 4
    # the multi-turn sample is rendered turn by turn, tool call included
    assert len(dom.find("div", class_="role-tool")) == 1 and "calc" in text and "what is 3*7?" in text
    assert "coverage grew" in text or "sharpening" in text  # first vs last eval interpreted
    assert "advantage:" in text  # the config


def test_report_is_self_contained_and_escaped(tmp_path):
    text = render_report(load_run(make_fake_run(tmp_path / "run")))
    assert "<script" not in text  # the sample's "<script>alert(1)</script>" is escaped, and we ship none
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "url(" not in text and "<link" not in text and "@import" not in text


def test_report_of_sparse_runs(tmp_path):
    run = make_fake_run(tmp_path / "run", health=False)
    text = render_report(load_run(run))
    assert "no health.jsonl" in text
    (run / "health.jsonl").write_text("")
    assert "no findings" in render_report(load_run(run))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.yaml").write_text("run: {name: x}\n")
    text = render_report(load_run(bare))
    assert "not logged by this run" in text and "no samples recorded" in text and "no evaluation" in text
    assert len(parse(text).find("svg", class_="chart")) == REQUIRED_CHARTS


def test_torn_and_pipeline_dirs(tmp_path):
    run = make_fake_run(tmp_path / "pipe" / "rl")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "reward/me')  # a crash mid-write
    assert resolve_run_dir(tmp_path / "pipe") == run
    data = load_run(tmp_path / "pipe")
    assert data.name == "pipe/rl" and data.metrics[-1]["step"] == 12 and data.warnings


def test_cumulative_compute(tmp_path):
    data = load_run(make_fake_run(tmp_path / "run", steps=3, n=4, bp=8))
    assert compute_cumulative_compute(data, "rollouts") == {0: 0.0, 1: 32.0, 2: 64.0, 3: 96.0}
    assert compute_cumulative_compute(data, "tokens")[3] == 960.0
    assert compute_cumulative_compute(data, "steps")[2] == 2.0


def test_svg_chart_details():
    svg = render_line_chart({"a": [(1, 0.1), (2, None), (3, 0.3), (4, 0.4)], "b": [(1, 1.0)]}, "t", markers=[(2, "finding", "x")])
    dom = parse(svg)
    assert len(dom.find("polyline")) == 1  # "a" is split at the gap; only (3, 4) forms a line
    assert len(dom.find("circle")) == 4 and len(dom.find("line", class_="marker")) == 1
    assert "no data" in render_line_chart({}, "empty")
    ticks = nice_ticks(0, 1)
    assert len(ticks) == 6 and ticks[0] == 0 and abs(ticks[-1] - 1) < 1e-9
    assert nice_ticks(0.13, 0.71)[0] >= 0.13 and nice_ticks(5, 5) == [5]


def test_render_turn_is_generic():
    html = render_turn({"role": "env", "observation": "x<y", "reward": 0.5}, 2)
    assert "x&lt;y" in html and "reward" in html and "env" in html
    assert "plain" in render_turn("plain", 0)


def test_compare_table_and_overlay(tmp_path):
    a = make_fake_run(tmp_path / "a" / "rl")
    b = make_fake_run(tmp_path / "b" / "rl", n=8, bp=4, steps=6, reward_shift=0.1)
    rows, out = run_compare([a, b], tmp_path / "cmp.html", x="rollouts")
    assert [r["run"] for r in rows] == ["a/rl", "b/rl"]
    assert rows[0]["rollouts"] == 12 * 32 and rows[1]["steps"] == 6 and rows[1]["final pass@1"] == 0.4
    table = format_comparison(rows)
    assert "a/rl" in table and "final pass@1" in table
    dom = parse(out.read_text())
    charts = dom.find("svg", class_="chart")
    assert len(charts) >= 6 and len(dom.find("polyline")) >= 2 * len(charts)  # one line per run per chart
    assert "compare-table" in render_compare_html([load_run(a)])
