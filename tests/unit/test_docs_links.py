"""No code comment, docstring or doc names a repository file that does not exist
(tools/check_doc_refs.py), and docs/README.md indexes every page. The scan reads every tracked
text file once: about a second."""

import importlib.util
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_doc_refs", ROOT / "tools" / "check_doc_refs.py")
refs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(refs)


def test_no_comment_docstring_or_doc_names_a_missing_file():
    stale = refs.Checker().stale()
    assert not stale, "references to files that are not in the repository (fix or cite docs/design.md):\n" + "\n".join(stale)


def test_every_docs_page_is_in_the_index():
    index = (ROOT / "docs" / "README.md").read_text()
    linked = set(re.findall(r"\]\(([^)#]+)", index))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    pages |= {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*/README.md")}
    assert not pages - linked, f"docs/README.md does not list {sorted(pages - linked)}: add one line for each"


def _repo(tmp_path, files):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return refs.Checker(tmp_path)


def test_the_checker_finds_what_it_should_and_nothing_else(tmp_path):
    checker = _repo(tmp_path, {
        "src/tether/policy/chat.py": '"""Token ids are the truth (DESIGN.md rule 5; docs/design.md, rule 5)."""\n'
                                     "x = 'envs/runner.py'  # data, not a reference\n"
                                     "# see policy/chat.py and envs/runner.py\n",
        "src/tether/envs/__init__.py": "",  # envs/ is a package, and the runner cited below is not in it
        "docs/design.md": "# Design\n\n## House rules\n\n<a id=\"rule-5\"></a>\n",
        "docs/a.md": "[ok](design.md#house-rules) [ok](design.md#rule-5) [bad anchor](design.md#nope) [gone](old.md)\n"
                     "run `tether sweep configs/NAME.yaml --out benchmarks/results/new.json`; "
                     "`git show 9aa2a78:benchmarks/gone.py`; a run's config.yaml and summary.json; "
                     "see pitfalls.md and https://example.org/docs/x.md; reads `benchmarks/results/none.json` (absent)\n",
        "configs/c.yaml": "# tether train configs/c.yaml  (docs/missing.md)\nkey: docs/not-a-comment.md\n",
        "tests/unit/test_x.py": "def test_real():\n    pass\n",
        "docs/b.md": "pinned by `tests/unit/test_x.py::test_real`, `::test_gone`; the op `aten::mm`\n",
    })
    found = sorted(s.split(": ", 1)[1] + " @ " + s.split(":")[0] for s in checker.stale())
    assert found == sorted([
        "DESIGN.md @ src/tether/policy/chat.py",
        "envs/runner.py @ src/tether/policy/chat.py",
        "link design.md#nope @ docs/a.md",
        "link old.md @ docs/a.md",
        "pitfalls.md @ docs/a.md",
        "docs/missing.md @ configs/c.yaml",
        "tests/unit/test_x.py::test_gone @ docs/b.md",
    ])
