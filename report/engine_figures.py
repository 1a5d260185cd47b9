"""The engine figures of report.json's `engines` section (trainer/validation/engines.py) as the tables the model
card, report.html and bench/engines.py show: per engine and target, the target alone, the engine's n-gram
drafter, the fastest drafter setting and the other drafter file at that setting, and what an engine refused.
Every function takes the section typed (schemas/validation_report.py `EngineFigures`) or as report.json holds it."""

from __future__ import annotations

import html
from collections.abc import Mapping

from schemas.validation_report import EngineFigures, EngineRow, EqualCount

COLUMNS = ("engine", "target", "drafter, setting", "τ (engine's count)", "tokens/s", "× target alone",
           "greedy = engine's target", "greedy = float32 target")


def engine_section(section: EngineFigures | Mapping | None) -> EngineFigures | None:
    """The section typed (None stays None)."""
    if section is None or isinstance(section, EngineFigures):
        return section
    return EngineFigures.model_validate(section)


def _setting(row: EngineRow) -> str:
    if row.spec in (None, "none"):
        return "target alone"
    if row.spec in ("ngram", "ngram-simple"):
        return f"n-gram ({row.spec})"
    setting = f"{row.drafter or 'drafter'}"
    if row.n_max is not None:
        setting += f", n-max {row.n_max}, p-min {row.p_min}"
    return setting


def _equal(value: EqualCount | None) -> str:
    if value is None:
        return "–"
    return f"{value.equal}/{value.of}"


def _ngram(row: EngineRow) -> bool:
    return row.spec in (None, "none") or str(row.spec).startswith("ngram")


def headline_engine_rows(section: EngineFigures | Mapping | None, full: bool = False) -> list[EngineRow]:
    """The rows worth a table (every row when `full`), in the section's order."""
    section = engine_section(section)
    rows = list(section.rows) if section is not None else []
    if full:
        return rows
    chosen = []
    groups = list(dict.fromkeys((r.engine, r.target) for r in rows))
    for engine, target in groups:
        group = [r for r in rows if (r.engine, r.target) == (engine, target)]
        drafted = [r for r in group if r.tokens_per_s and not _ngram(r)]
        best = max(drafted, key=lambda r: r.tokens_per_s, default=None)
        keep = {id(r) for r in group if _ngram(r) or r.did_not_run}
        if best is not None:
            keep.add(id(best))
            keep |= {id(r) for r in drafted if r.drafter != best.drafter and (r.n_max, r.p_min) == (best.n_max, best.p_min)}
        chosen += [r for r in group if id(r) in keep]
    return chosen


def headline_rows(section: EngineFigures | Mapping | None, full: bool = False) -> list[dict]:
    """`headline_engine_rows` as report.json holds the rows."""
    return [row.to_json() for row in headline_engine_rows(section, full)]


def _cells(row: EngineRow) -> list[str]:
    if row.did_not_run:
        what = "refused" if "refused" in row.model_fields_set else "failed"
        reason = str(row.refused or row.error or "")[:300]
        return [row.engine or "", str(row.target or ""), _setting(row), f"{what}: {reason}", "", "", "", ""]
    return [row.engine or "", str(row.target or ""), _setting(row),
            "–" if row.tau is None else f"{row.tau:.3f}",
            "–" if row.tokens_per_s is None else f"{row.tokens_per_s:.1f}",
            "–" if row.ratio is None else f"{row.ratio:.3f}",
            _equal(row.greedy_equals_engine_target), _equal(row.greedy_equals_reference_target)]


def _notes(section: EngineFigures, rows: list[EngineRow]) -> list[str]:
    notes = [f"{section.prompts} held-out prompts, {section.max_new_tokens} new tokens, {section.decoding}, "
             f"{section.threads} threads; machine load {section.load_average} (1-minute average before and after)."]
    notes += list(section.skipped)
    reasons = dict.fromkeys(r.why_not_reference for r in rows if r.why_not_reference)
    notes += [f"Output differs from the float32 target where {reason}." for reason in reasons]
    return notes


def engine_markdown(section: EngineFigures | Mapping | None, full: bool = False) -> str:
    section = engine_section(section)
    if section is None or (not section.rows and not section.skipped):
        return "No serving engine was measured for this drafter.\n"
    rows = headline_engine_rows(section, full)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |" for r in rows]
    lines += [""] + [f"- {note}" for note in _notes(section, rows)]
    commands = [(r.name, r.command) for r in rows if r.command]
    if commands:
        lines += ["", "The commands that produced these rows:", "", "```bash"]
        lines += [f"# {name}\n{command}" for name, command in commands] + ["```"]
    return "\n".join(lines) + "\n"


def engine_html(section: EngineFigures | Mapping | None) -> str:
    section = engine_section(section)
    if section is None or (not section.rows and not section.skipped):
        return "<p>No serving engine was measured for this drafter.</p>"
    rows = headline_engine_rows(section)
    head = "".join(f"<th scope=\"col\">{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>" for r in rows)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in _notes(section, rows))
    commands = "\n".join(f"# {r.name}\n{r.command}" for r in rows if r.command)
    return (f'<table class="facts" id="engine-figures"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
            f"<ul>{notes}</ul><pre>{html.escape(commands)}</pre>")
