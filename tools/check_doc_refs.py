"""Find code comments, docstrings and docs that name a repository file that does not exist.

    python tools/check_doc_refs.py        # lists each stale reference as FILE:LINE: REF; exit 1 if any

Why: a comment that cites a file outside the repository, or one that moved, sends a maintainer
nowhere. What counts as a reference (tests/unit/test_docs_links.py runs this):
- in Python files, only comments and docstrings (string literals in code are data, often a file a
  test creates or a path that must not exist);
- a relative path with a directory that starts at a repository folder (`docs/...`, `src/...`,
  `benchmarks/...`) or at a tether package (`policy/chat.py`, `envs/...`): it must exist relative to the
  repository, the citing file's folder, `src/` or `src/tether/`;
- any `.md` name, with or without a folder: it must be such a path or the name of a file in the
  repository (that is what catches notes kept outside it, e.g. a design page of another project);
- in Markdown, every link target that is not a URL: it must exist relative to the page, and a
  `#anchor` into a Markdown page must be one of that page's headings or `<a id>`s;
- `path.py::name` (and `::name` after such a path earlier in the same file): `name` must be defined
  in that file, so a renamed test does not leave its citation behind.
Files that runs and tools write into run directories (`config.yaml`, `summary.json`, ...) never carry
a folder that starts at the repository, so they are not references; neither are a command's output
(`--out benchmarks/results/x.json`), a file the results page marks "(absent)", a file in a commit (`git show 9aa2a78:benchmarks/x.py`) or a
placeholder (`configs/NAME.yaml`). `ALLOWED` lists the few names that look like repository paths but
are not (each with its reason).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ALLOWED = {
    "docs/algo/rollout_corr_math.md": "verl's documentation, cited with its project's name",
}
EXT = r"(?:md|py|yaml|yml|json|jsonl|toml|sh|txt|log)"
PATH = re.compile(r"(?<![\w/.\-~$<{@*])((?:[A-Za-z0-9_.\-]+/)*[A-Za-z0-9_\-][A-Za-z0-9_.\-]*\." + EXT + r")(?![\w/(])")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
# `path.py::name`, or `::name` after such a path earlier in the same file: the name must be defined there.
PY_NAME = re.compile(r"(?:((?:[A-Za-z0-9_.\-]+/)*[A-Za-z0-9_\-]+\.py)|(?<![\w>)\]:]))::([A-Za-z_]\w*)")
ANCHOR_ID = re.compile(r'<a\s+(?:id|name)="([^"]+)"')
SCANNED = {".py", ".md", ".yaml", ".yml", ".toml", ".sh"}
# Not references: an output a command is told to write, a file in a commit (`git show abc1234:path`),
# a placeholder the reader fills in (`configs/NAME.yaml`).
OUTPUT_OR_COMMIT = re.compile(r"(?:--out[= ]|--output[= ]|> ?|\b[0-9a-f]{7,40}:)$")
PLACEHOLDERS = {"NAME", "CONFIG", "RUN", "FILE", "DIR"}


def repo_files(root: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files (what a clone of the working tree would hold)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return sorted({f for f in out if f and (root / f).exists()})


def _python_text(src: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring (a string that is a statement of its own) of a
    Python source, from one pass of the tokenizer."""
    out, prev = [], tokenize.NEWLINE
    skip = (tokenize.NL, tokenize.COMMENT)
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (SyntaxError, tokenize.TokenError):
        return out
    for i, tok in enumerate(toks):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            nxt = next((t for t in toks[i + 1:] if t.type not in skip), None)
            if nxt is None or nxt.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                out += [(tok.start[0] + j, line) for j, line in enumerate(tok.string.splitlines())]
        if tok.type not in skip:
            prev = tok.type
    return out


def _text_lines(path: Path) -> list[tuple[int, str]]:
    src = path.read_text(errors="replace")
    if not PATH.search(src) and "::" not in src and "](" not in src:
        return []  # nothing that could be a reference
    if path.suffix == ".py":
        return _python_text(src)
    if path.suffix in (".yaml", ".yml", ".toml", ".sh") or path.name == "Makefile":
        return [(i, line[line.index("#"):]) for i, line in enumerate(src.splitlines(), 1) if "#" in line]
    return list(enumerate(src.splitlines(), 1))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(errors="replace")
    found = set(ANCHOR_ID.findall(text))
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


class Checker:
    def __init__(self, root: Path = ROOT):
        self.root = root
        self.files = repo_files(root)
        self.known = set(self.files)
        self.dirs = {str(Path(f).parent) for f in self.files}
        self.names = {os.path.basename(f) for f in self.files}
        top = {f.split("/")[0] for f in self.files if "/" in f}
        pkgs = {p.name for p in (root / "src" / "tether").iterdir() if p.is_dir()} if (root / "src" / "tether").is_dir() else set()
        pkgs.discard("runs")  # `runs/NAME/...` is a run directory a command writes, not the tether.runs package
        self.prefixes = top | pkgs | {"tether"}

    def resolves(self, ref: str, citing: str) -> bool:
        for base in ("", os.path.dirname(citing), "src", "src/tether"):
            cand = os.path.normpath(os.path.join(base, ref))
            if cand in self.known or cand in self.dirs:
                return True
        return False

    def check_ref(self, ref: str, citing: str) -> bool:
        """True when `ref` is fine: not a repository-like path, or one that exists."""
        if ref in ALLOWED or any(Path(part).stem in PLACEHOLDERS for part in ref.split("/")):
            return True
        if "/" not in ref:
            return not ref.endswith(".md") or ref in self.names
        first = ref.split("/")[0]
        if first in (".", ".."):
            return self.resolves(ref, citing)
        if first not in self.prefixes and not ref.endswith(".md"):
            return True
        return self.resolves(ref, citing)

    def check_link(self, target: str, citing: str) -> bool:
        if re.match(r"^[a-z][a-z0-9+.\-]*:", target):  # a URL or mailto:
            return True
        path, _, anchor = target.partition("#")
        if not path:
            path_abs = self.root / citing
        else:
            rel = os.path.normpath(os.path.join(os.path.dirname(citing), path))
            if rel not in self.known and rel not in self.dirs:
                return False
            path_abs = self.root / rel
        if anchor and path_abs.suffix == ".md" and path_abs.is_file():
            return anchor in anchors(path_abs)
        return True

    def defines(self, ref: str, citing: str, name: str) -> bool:
        for base in ("", os.path.dirname(citing), "src", "src/tether"):
            cand = self.root / os.path.normpath(os.path.join(base, ref))
            if cand.is_file():
                return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b", cand.read_text(errors="replace"), re.M) is not None
        return True  # a missing file is reported as such

    def stale(self) -> list[str]:
        out = []
        for f in self.files:
            p = self.root / f
            if (p.suffix not in SCANNED and p.name != "Makefile") or f.startswith("benchmarks/results/"):
                continue
            last_py = None
            for line_no, text in _text_lines(p):
                for m in PY_NAME.finditer(text):
                    last_py = m.group(1) or last_py
                    if last_py and not self.defines(last_py, f, m.group(2)):
                        out.append(f"{f}:{line_no}: {last_py}::{m.group(2)}")
                bare = MD_LINK.sub("]", text) if p.suffix == ".md" else text  # link targets: checked below
                for m in PATH.finditer(bare):
                    before = bare[:m.start(1)]
                    if re.search(r"https?://\S*$", before) or OUTPUT_OR_COMMIT.search(before) \
                            or bare[m.end(1):].startswith("` (absent)"):  # a result page's declared-absent file
                        continue
                    if not self.check_ref(m.group(1), f):
                        out.append(f"{f}:{line_no}: {m.group(1)}")
                if p.suffix == ".md":
                    out += [f"{f}:{line_no}: link {t}" for t in MD_LINK.findall(text) if not self.check_link(t, f)]
        return out


def main() -> int:
    stale = Checker().stale()
    for s in stale:
        print(s)
    if stale:
        print(f"{len(stale)} reference(s) to files that are not in the repository", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
