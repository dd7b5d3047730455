"""docs/testing.md's coverage map against the code: every fault kind, budget class and
diagnosis has its row, every test a row names is one pytest collects, and each sits in
its tier's column — so a new kind or diagnosis cannot land without saying what tests it."""

import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.verdicts import Diagnosis
from chaos.faults.catalog import BUDGET_CLASSES, KINDS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "testing.md"
SECTIONS = {
    "Fault kinds": tuple(KINDS),
    "Budget classes": BUDGET_CLASSES,
    "Diagnoses": tuple(d.value for d in Diagnosis),
    "Reporting shapes": tuple(str(n) for n in range(1, 17)),  # issue 44's shapes, each with its tests
}
# chaos/pytest_plugin.py deselects chaos and soak tests unless -m names them: this names
# both and still selects everything.
EVERY_TEST = "chaos or soak or not (chaos or soak)"
# One collection of every file the map names, reporting each test's markers too
# (--collect-only -q prints ids only).  tests/unit and suites both have a test_head_loss.py
# and a test_final_state.py, which pytest's default import mode cannot hold in one session:
# files are imported by path, and their directories put on sys.path for their helper
# modules (timelines, sessions, tapes), as the default mode would.
COLLECT = """
import json, sys, pytest
from pathlib import Path
sys.path[:0] = sorted({str(Path(a).resolve().parent) for a in sys.argv[1:] if a.endswith(".py")})
class Marks:
    def pytest_collection_finish(self, session):
        marks = {i.nodeid: sorted({m.name for m in i.iter_markers()}) for i in session.items}
        print("COLLECTED " + json.dumps(marks))
sys.exit(pytest.main(["--import-mode=importlib", *sys.argv[1:]], plugins=[Marks()]))
"""


@dataclasses.dataclass
class Row:
    section: str
    name: str
    line: int
    per_commit: list[str]
    integration: list[str]
    per_commit_cell: str = ""  # as written, for a planned row's "planned: ..."

    @property
    def planned(self) -> bool:
        """Marked planned (not built yet, e.g. ``xid``): no test can cover it yet."""
        return self.per_commit_cell.lower().startswith("planned")


def cell_ids(cell: str) -> list[str]:
    """The node ids in a cell: `<br>`-separated, each maybe followed by a note."""
    parts = (p.split() for p in re.split(r"<br\s*/?>", cell))
    return [p[0] for p in parts if p and ".py" in p[0]]


def read_map() -> list[Row]:
    rows, section, header = [], None, None
    for n, line in enumerate(DOC.read_text().splitlines(), 1):
        if line.startswith("## "):
            section = line[3:].strip()
        if section not in SECTIONS or not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            column = {tier: next((i for i, h in enumerate(header) if h.startswith(tier)), None)
                      for tier in ("per-commit", "integration")}
            assert None not in column.values(), f"{DOC.name}:{n}: a {section} table needs a per-commit and an " \
                                                f"integration column, got {header}"
            continue
        name = re.fullmatch(r"`([^`]+)`", cells[0])
        if name:
            rows.append(Row(section, name[1], n, cell_ids(cells[column["per-commit"]]),
                            cell_ids(cells[column["integration"]]), cells[column["per-commit"]]))
    return rows


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return read_map()


@pytest.fixture(scope="module")
def collected(rows) -> dict[str, list[str]]:
    """node id -> its markers, for every test in the files the map names."""
    files = sorted({i.split("::")[0] for r in rows for i in r.per_commit + r.integration})
    missing = [f for f in files if not (ROOT / f).is_file()]
    assert not missing, f"{DOC.name} names test files that do not exist: {missing}"
    p = subprocess.run([sys.executable, "-c", COLLECT, "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-m", EVERY_TEST, *files], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"collecting {DOC.name}'s test files failed (exit {p.returncode}):\n" \
                              f"{p.stdout[-3000:]}{p.stderr[-3000:]}"
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("COLLECTED "))
    return json.loads(line.removeprefix("COLLECTED "))


@pytest.mark.parametrize("section", SECTIONS)
def test_every_name_has_exactly_one_row(rows, section):
    names = [r.name for r in rows if r.section == section]
    missing = [n for n in SECTIONS[section] if n not in names]
    stale = sorted(set(names) - set(SECTIONS[section]))
    twice = sorted({n for n in names if names.count(n) > 1})
    said = "; ".join(f"{what} {', '.join(ns)}" for what, ns in (
        ("no row for", missing), ("rows for what the code does not know:", stale), ("more than one row for", twice))
        if ns)
    assert not said, f"docs/testing.md, ## {section}: {said} (one row each, naming the tests that cover it)"


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ast.unparse(node)


def diagnoses_used() -> dict[str, str]:
    """Diagnosis member -> where chaos/ first gives it (``Diagnosis.NAME``)."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "chaos").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Diagnosis":
                found.setdefault(node.attr, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_diagnosis_is_given_somewhere_and_none_is_spelt_by_hand():
    """The enum is the one spelling: each member is given by some verdict (none dead), and no
    verdict in chaos/ passes a diagnosis as a string."""
    used = diagnoses_used()
    assert "RESTARTED_FROM_SCRATCH" in used and "HEAD_LOSS_OUTCOME" in used, used  # a search that found none
    dead = [d.name for d in Diagnosis if d.name not in used]
    assert not dead, f"diagnoses no verdict gives (remove them, or give them): {dead}"
    by_hand = []
    for path in sorted((ROOT / "chaos").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and _name(node.func) in ("Verdict", "Judgement"):
                given = node.args[3] if len(node.args) > 3 else next(
                    (k.value for k in node.keywords if k.arg == "diagnosis"), None)
                if isinstance(given, (ast.Constant, ast.JoinedStr)) and getattr(given, "value", "") is not None:
                    by_hand.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not by_hand, f"a diagnosis spelt as a string, not a chaos.verdicts.Diagnosis: {by_hand}"


def test_each_diagnosis_row_says_what_the_enum_says(rows):
    """A diagnosis row's verdict and meaning columns are the enum's (chaos/verdicts/diagnosis.py):
    edit them there and copy the row, or the map drifts from the code."""
    cells = {}
    for n, line in enumerate(DOC.read_text().splitlines(), 1):
        m = re.match(r"\|\s*`([^`]+)`\s*\|([^|]*)\|([^|]*)\|", line)
        if m and m[1] in {d.value for d in Diagnosis}:
            cells[m[1]] = (m[2].strip(), m[3].strip(), n)
    wrong = [f"line {n}: `{d.value}` | {', '.join(d.verdicts)} | {d.doc} |"
             for d in Diagnosis if d.value in cells
             for verdicts, doc, n in [cells[d.value]] if (verdicts, doc) != (", ".join(d.verdicts), d.doc)]
    assert not wrong, "docs/testing.md's diagnosis rows should begin:\n" + "\n".join(wrong)


def test_every_mapped_test_is_collected(rows, collected):
    unknown = [f"{r.name} (line {r.line}): {i}" for r in rows for i in r.per_commit + r.integration
               if i not in collected]
    assert not unknown, "docs/testing.md names tests pytest does not collect:\n" + "\n".join(unknown)


def per_commit(markers: list[str]) -> bool:
    """What .ci/run runs: not a test marked integration, not a suite marked extended."""
    return not {"integration", "extended"} & set(markers)


def test_each_column_names_tests_of_its_tier(rows, collected):
    misplaced = [f"{r.name} (line {r.line}): {i} in the {column} column, but its markers are {collected[i]}"
                 for r in rows for column, ids in (("per-commit", r.per_commit), ("integration", r.integration))
                 for i in ids if i in collected and per_commit(collected[i]) != (column == "per-commit")]
    assert not misplaced, "docs/testing.md puts tests in the wrong column:\n" + "\n".join(misplaced)


@pytest.mark.parametrize("section", SECTIONS)
def test_every_row_is_checked_per_commit(rows, section):
    """A fault kind, budget class or diagnosis that no per-commit test checks is a gap (one
    not built yet is marked planned instead)."""
    mine = [r for r in rows if r.section == section]
    assert mine, f"{DOC.name}, ## {section}: no rows read"  # a parser that found none would pass on nothing
    gaps = [f"## {r.section}: `{r.name}` (line {r.line}): per-commit cell is {r.per_commit_cell or 'empty'!r}"
            for r in mine if not r.per_commit and not r.planned]
    assert not gaps, ("docs/testing.md names no per-commit test for these rows (write one: a unit test on a "
                      "recorded timeline will do; or mark a kind not built yet planned):\n" + "\n".join(gaps))
