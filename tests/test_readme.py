"""The README a newcomer reads (issue 34): its first screen shows the two set-up commands and what the main job gives,
that table is bench/readme_table.py's rendering of a typed report (the README's block has the rows and columns the
generator renders; its numbers come from a real run), and the links into sections moved out of it still land."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import readme_table
from schemas.validation_report import ValidationReport

ROOT = Path(__file__).resolve().parents[1]

README = ROOT / "README.md"
FIRST_SCREEN = 40


def main_job_report() -> ValidationReport:
    """A report shaped like the main job's (the figures of 2026-12-04, 2-core CPU)."""
    return ValidationReport.read({
        "tau": 1.2395, "block_size": 8, "prompts": 12, "recommended_block_size": 5,
        "lossless": {"greedy": {"prompts": 6, "tokens": 235, "mismatches": 0, "block_size": 5},
                     "sampling": {"status": "passed", "passed": True, "p_value": 0.047, "alpha": 0.001}},
        "speedup": {"block_size": 5, "ratio": 0.834, "ratio_ci95": [0.79, 0.868]},
        "serving_advice": {"enable": False, "summary": "do not enable this drafter on hardware like the validation "
                           "machine: it decoded at 0.834x the target alone (95 % interval 0.79-0.868x) at block "
                           "size 5"},
        "device": {"setting": "auto", "device": "cpu", "type": "cpu", "name": "cpu", "count": 1, "dtype": "float32"},
    })


FACTS = readme_table.RunFacts(train_steps=120, planned_steps=120, seconds_per_step=1.1, minutes=7.6,
                              date="2026-12-04", machine="2 CPU cores")


def test_the_first_screen_shows_the_two_commands_and_what_they_give():
    first = README.read_text().splitlines()[:FIRST_SCREEN]
    commands = [line.split("#")[0].strip() for line in first]
    assert "make run" in commands and "make test" in commands
    assert readme_table.MARK_START in first and readme_table.MARK_END in first  # the table, whole


def test_the_readme_table_has_the_generators_rows_and_columns():
    rendered = readme_table.table_in(readme_table.render_block(readme_table.render_table(main_job_report(), FACTS)))
    committed = readme_table.table_in(README.read_text())
    assert [row[0] for row in committed] == [row[0] for row in rendered] == ["`make run`", *readme_table.LABELS]
    assert {len(row) for row in committed} == {len(row) for row in rendered} == {2}
    assert all(row[1] and row[1] != readme_table.MISSING for row in committed), committed


def test_the_table_renders_the_reports_figures():
    values = dict(readme_table.rows(main_job_report(), FACTS))
    assert values["held-out tau (mean tokens per target step)"] == "**1.2395**, block 8, 12 prompts"
    assert values["greedy output = the target alone's"] == "**0** mismatches in 235 tokens over 6 prompts"
    assert values["speculative-sampling test"] == "passed (p = 0.047, alpha 0.001)"
    assert values["measured speedup, batch 1 (95 % interval)"] == "**0.834x** [0.79, 0.868] at block 5 (recommended)"
    assert values["serving advice"] == "*do not enable this drafter on hardware like the validation machine*"
    assert values["training"] == "120 steps, 1.10 s a step"
    assert values["wall clock, prepare to export"] == "7.6 min"
    assert values["device"] == "cpu, float32"
    assert values["measured"] == "2026-12-04, 2 CPU cores"


def test_a_report_missing_figures_keeps_the_shape():
    empty = readme_table.rows(ValidationReport.read({}), readme_table.RunFacts())
    assert [label for label, _ in empty] == list(readme_table.LABELS)
    assert {value for _, value in empty} == {readme_table.MISSING}
    older = ValidationReport.read({"lossless": {"sampling": {"passed": True}}, "speedup": {"ratio": 1.3}})
    values = dict(readme_table.rows(older))
    assert values["speculative-sampling test"] == "passed"  # a report from before `status`
    assert values["measured speedup, batch 1 (95 % interval)"] == "**1.3x**"


def test_write_replaces_the_block_from_a_runs_report_and_state(tmp_path):
    out = tmp_path / "out"
    (out / ".work").mkdir(parents=True)
    (out / "report.json").write_text(json.dumps(main_job_report().to_json()))
    stages = {"prepare": {"seconds": 6.0}, "generate": {"seconds": 200.0},
              "train": {"seconds": 140.0, "steps": 100, "planned_steps": 120, "seconds_per_step": 1.4},
              "validate": {"seconds": 100.0}, "export": {"seconds": 4.0}}
    (out / ".work" / "state.json").write_text(json.dumps({"config": {}, "stages": stages}))
    readme = tmp_path / "README.md"
    block = f"{readme_table.MARK_START}\n<!-- a note -->\n| old |\n{readme_table.MARK_END}"
    old = f"# Title\n\nbefore\n\n{block}\n\nafter\n"
    readme.write_text(old)

    assert readme_table.main([str(out / "report.json"), "--date", "2026-12-05", "--machine", "here",
                              "--write", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# Title\n\nbefore\n\n" + readme_table.MARK_START) and text.endswith(
        readme_table.MARK_END + "\n\nafter\n")
    assert "| old |" not in text and "a note" not in text
    values = {row[0]: row[1] for row in readme_table.table_in(text)}
    assert values["training"] == "100 of 120 steps, 1.40 s a step"
    assert values["wall clock, prepare to export"] == "7.5 min"  # 450 s, as `draftsmith run` prints it
    assert values["measured"] == "2026-12-05, here"

    # The JSON `draftsmith run` prints serves as well as its state.json.
    summary = tmp_path / "run.json"
    summary.write_text(json.dumps({"minutes": 7.6, "train_steps": 120, "train_seconds_per_step": 1.1}))
    facts = readme_table.run_facts(out / "report.json", run=summary, machine="m")
    assert (facts.train_steps, facts.seconds_per_step, facts.minutes) == (120, 1.1, 7.6)

    with pytest.raises(ValueError):
        readme_table.replace_block("no markers here", "x")


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a markdown file."""
    anchors, fenced = set(), False
    for line in path.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (match := re.match(r"#{1,6}\s+(.*)", line)):
            anchors.add(re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def test_links_from_the_readme_and_into_moved_sections_land():
    """Every link in README.md and docs/RESULTS.md, and every link from docs/ into those two, reaches its file and
    heading (other docs' links among themselves are theirs to keep)."""
    own = {README, ROOT / "docs" / "RESULTS.md"}
    checked = 0
    for source in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([^)\s#]*\.md)?(?:#([^)\s]+))?\)", source.read_text()):
            if "://" in target or not (target or anchor):
                continue
            path = (source.parent / target).resolve() if target else source
            if source not in own and path not in own:
                continue
            assert path.is_file(), f"{source.name}: {target}"
            if anchor:
                assert anchor in _anchors(path), f"{source.name}: {target}#{anchor}"
            checked += 1
    assert checked >= 10
