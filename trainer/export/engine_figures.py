"""The engine figures of report.json's `engines` section (trainer/validation/engines.py) as the tables the model
card, report.html and bench/engines.py show: per engine and target, the target alone, the engine's n-gram
drafter, the fastest drafter setting and the other drafter file at that setting, and what an engine refused."""

from __future__ import annotations

import html

COLUMNS = ("engine", "target", "drafter, setting", "τ (engine's count)", "tokens/s", "× target alone",
           "greedy = engine's target", "greedy = float32 target")


def _setting(row: dict) -> str:
    if row.get("spec") in (None, "none"):
        return "target alone"
    if row.get("spec") in ("ngram", "ngram-simple"):
        return f"n-gram ({row['spec']})"
    setting = f"{row.get('drafter') or 'drafter'}"
    if row.get("n_max") is not None:
        setting += f", n-max {row['n_max']}, p-min {row['p_min']}"
    return setting


def _equal(value) -> str:
    if not isinstance(value, dict):
        return "–"
    return f"{value['equal']}/{value['of']}"


def headline_rows(section: dict | None, full: bool = False) -> list[dict]:
    """The rows worth a table (every row when `full`), in the section's order."""
    rows = list((section or {}).get("rows") or [])
    if full:
        return rows
    chosen = []
    groups = list(dict.fromkeys((r.get("engine"), r.get("target")) for r in rows))
    for engine, target in groups:
        group = [r for r in rows if (r.get("engine"), r.get("target")) == (engine, target)]
        drafted = [r for r in group if r.get("tokens_per_s") and r.get("spec") not in (None, "none")
                   and not str(r.get("spec")).startswith("ngram")]
        best = max(drafted, key=lambda r: r["tokens_per_s"], default=None)
        keep = {id(r) for r in group if r.get("spec") in (None, "none") or str(r.get("spec")).startswith("ngram")
                or "refused" in r or "error" in r}
        if best is not None:
            keep.add(id(best))
            keep |= {id(r) for r in drafted if r.get("drafter") != best.get("drafter") and
                     (r.get("n_max"), r.get("p_min")) == (best.get("n_max"), best.get("p_min"))}
        chosen += [r for r in group if id(r) in keep]
    return chosen


def _cells(row: dict) -> list[str]:
    if "refused" in row or "error" in row:
        what = "refused" if "refused" in row else "failed"
        reason = str(row.get("refused") or row.get("error") or "")[:300]
        return [row.get("engine", ""), str(row.get("target") or ""), _setting(row), f"{what}: {reason}",
                "", "", "", ""]
    return [row.get("engine", ""), str(row.get("target") or ""), _setting(row),
            "–" if row.get("tau") is None else f"{row['tau']:.3f}",
            "–" if row.get("tokens_per_s") is None else f"{row['tokens_per_s']:.1f}",
            "–" if row.get("ratio") is None else f"{row['ratio']:.3f}",
            _equal(row.get("greedy_equals_engine_target")), _equal(row.get("greedy_equals_reference_target"))]


def _notes(section: dict, rows: list[dict]) -> list[str]:
    notes = [f"{(section or {}).get('prompts')} held-out prompts, {(section or {}).get('max_new_tokens')} new tokens, "
             f"{(section or {}).get('decoding')}, {(section or {}).get('threads')} threads; machine load "
             f"{(section or {}).get('load_average')} (1-minute average before and after)."]
    notes += list((section or {}).get("skipped") or [])
    reasons = dict.fromkeys(r["why_not_reference"] for r in rows if r.get("why_not_reference"))
    notes += [f"Output differs from the float32 target where {reason}." for reason in reasons]
    return notes


def engine_markdown(section: dict | None, full: bool = False) -> str:
    if not section or (not section.get("rows") and not section.get("skipped")):
        return "No serving engine was measured for this drafter.\n"
    rows = headline_rows(section, full)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |" for r in rows]
    lines += [""] + [f"- {note}" for note in _notes(section, rows)]
    commands = [(r["name"], r["command"]) for r in rows if r.get("command")]
    if commands:
        lines += ["", "The commands that produced these rows:", "", "```bash"]
        lines += [f"# {name}\n{command}" for name, command in commands] + ["```"]
    return "\n".join(lines) + "\n"


def engine_html(section: dict | None) -> str:
    if not section or (not section.get("rows") and not section.get("skipped")):
        return "<p>No serving engine was measured for this drafter.</p>"
    rows = headline_rows(section)
    head = "".join(f"<th scope=\"col\">{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>" for r in rows)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in _notes(section, rows))
    commands = "\n".join(f"# {r['name']}\n{r['command']}" for r in rows if r.get("command"))
    return (f'<table class="facts" id="engine-figures"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
            f"<ul>{notes}</ul><pre>{html.escape(commands)}</pre>")
