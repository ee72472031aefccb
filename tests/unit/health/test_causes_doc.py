"""docs/health/README.md's "What each cause predicts" is the taxonomy's own table
(tether.health.causes.format_predictions): a cause's predictions cannot drift from the page. Pure
string work: well under a second."""

from pathlib import Path

from tether.health.causes import CAUSES, HALLMARK, format_predictions

PAGE = Path(__file__).resolve().parents[3] / "docs" / "health" / "README.md"
BEGIN = "<!-- predictions: generated from tether.health.causes.format_predictions(); do not edit -->"
END = "<!-- predictions: end -->"


def page_block(text: str) -> str:
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def test_the_page_holds_the_taxonomys_table():
    assert page_block(PAGE.read_text()) == format_predictions(), (
        "docs/health/README.md's cause table is stale: python -c 'from tether.health.causes import "
        "format_predictions; print(format_predictions())' and paste it between the predictions markers")


def test_every_cause_has_a_hallmark_and_one_row():
    table = format_predictions()
    for c in CAUSES.values():
        assert any(w >= HALLMARK for w in c.fingerprint.values()), c.name
        assert sum(line.startswith(f"| `{c.name}` |") for line in table.splitlines()) == 1
