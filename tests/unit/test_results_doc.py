"""docs/results.md and the README's headline lines are what the committed result files give
(tools/gen_results.py), the README stays a product page, and a section whose file is absent shows no
figure. Pure file reading: well under a second."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    sys.path.insert(0, str(ROOT / "tools"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gen = _load("gen_results")
lib = _load("results_lib")


def test_results_page_and_readme_headlines_are_current():
    page, headlines = gen.generate()
    assert (ROOT / "docs" / "results.md").read_text() == page, "docs/results.md is stale: run `make results`"
    readme = (ROOT / "README.md").read_text()
    assert gen.readme_with(headlines, readme) == readme, "README.md's headlines are stale: run `make results`"
    assert len(headlines) == len(gen.HEADLINES) and all("docs/results.md#" in h for h in headlines)


def test_readme_is_a_product_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "make demo" in readme and "make test" in readme and "pip install -e ." in readme
    assert re.search(r"^```python\n(.*?)^```", readme, re.S | re.M), "the Python example is one ```python block"
    assert "configs/byo.yaml" in readme


def test_every_headline_links_to_a_section_of_the_results_page():
    page, headlines = gen.generate()
    for h in headlines:
        key = re.search(r"docs/results\.md#([\w-]+)", h).group(1)
        assert f'<a id="{key}"></a>' in page


def _entry(tmp_rel, **kw):
    args = dict(key="probe", title="A probe", sources={"x": tmp_rel}, command="python make_probe.py",
                read=lambda d: {"v": f"{d['x']['value']:.2f}"}, text="value {v}", headline="probe {v}")
    args.update(kw)
    return lib.Entry(**args)


def test_an_absent_result_file_is_said_so_and_shows_no_figure():
    md, headline = gen.render_entry(_entry("benchmarks/results/no_such_result_42.json"))
    assert headline is None
    assert "Not measured yet" in md and "no_such_result_42.json" in md
    assert not re.search(r"\d", md.replace("no_such_result_42", "")), md


def test_a_present_file_gives_its_number_with_the_file_and_command(tmp_path, monkeypatch):
    (tmp_path / "r.json").write_text(json.dumps({"value": 0.4175}))
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    md, headline = gen.render_entry(_entry("r.json"))
    assert headline == "probe 0.42"
    assert "value 0.42" in md and "`python make_probe.py`" in md and "(../r.json)" in md


def test_a_result_file_in_another_format_names_the_entry_and_file(tmp_path, monkeypatch):
    (tmp_path / "r.json").write_text(json.dumps({"renamed": 1}))
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match=r"entry 'probe' could not read its files \(r\.json\): KeyError"):
        gen.render_entry(_entry("r.json"))


def test_formatting_helpers():
    assert lib.pts(0.1825) == "+18.2" and lib.pts(-0.03) == "-3.0"
    assert lib.mmss(289.3) == "4 min 49 s" and lib.mmss(42) == "42 s"
    mean, se = lib.mean_se([10.0, 10.625, 9.75])
    assert mean == pytest.approx(10.125) and se == pytest.approx(0.2602, abs=1e-4)
    assert lib.pm([10.0, 10.625, 9.75]) == "+10.1 ± 0.3"
