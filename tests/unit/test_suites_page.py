"""docs/suites.md names every suite file: a new suite is documented where users look for
what the standard suites assert."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def undocumented(page: str, suite_files: list[str]) -> list[str]:
    return [name for name in suite_files if name not in page]


def test_every_suite_file_is_on_the_suites_page():
    files = sorted(p.name for p in (ROOT / "suites").glob("test_*.py"))
    assert files and not undocumented((ROOT / "docs" / "suites.md").read_text(), files), \
        f"docs/suites.md lacks a row for {undocumented((ROOT / 'docs' / 'suites.md').read_text(), files)}"


def test_a_suite_file_the_page_does_not_name_is_found():
    page = "| `test_a.py`: x |\n| `suites/test_b.py` (extended) |"
    assert undocumented(page, ["test_a.py", "test_b.py", "test_c.py"]) == ["test_c.py"]
