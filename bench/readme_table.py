"""The README's table of what the main job gives, rendered from the main job's typed report, never copied by hand.

    make run
    python bench/readme_table.py out/smollm2-135m/report.json --write README.md

reads `report.json` through `schemas.validation_report.ValidationReport` (leniently, as every reader of it does),
adds the run's own figures from `OUT/.work/state.json` beside it, or `--run` (training steps, seconds a step,
minutes from prepare to export: what `draftsmith run` prints at its end), and prints a two-column markdown table;
`--write README.md` replaces the README's block between MARK_START and MARK_END with it. The rows are always the
same (a figure the report lacks shows as "–"), so tests/test_readme.py holds the README's block to the shape this
script renders.

A report does not say when or where it was measured: `--date` defaults to report.json's modification date and
`--machine` to a description of the machine running this script, so run it where `make run` ran, or say both.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from schemas.validation_report import ValidationReport

MARK_START = "<!-- main-job-table:start -->"
MARK_END = "<!-- main-job-table:end -->"
HEADER = ("`make run`", "what it gave")
MISSING = "–"  # the dashboard's and report.html's sign for a figure the report lacks

LABELS = (
    "held-out tau (mean tokens per target step)",
    "greedy output = the target alone's",
    "speculative-sampling test",
    "measured speedup, batch 1 (95 % interval)",
    "serving advice",
    "training",
    "wall clock, prepare to export",
    "device",
    "measured",
)
"""The table's rows, in order: the README's block must have exactly these (tests/test_readme.py)."""


@dataclass(frozen=True)
class RunFacts:
    """What the run knows beyond report.json: its training figures (state.json) and when and where it ran."""

    train_steps: int | None = None
    planned_steps: int | None = None
    seconds_per_step: float | None = None
    minutes: float | None = None
    date: str | None = None
    machine: str | None = None


def run_facts(report_path: Path, *, run: Path | None = None, date: str | None = None,
              machine: str | None = None) -> RunFacts:
    """The run's own figures from `run`: its state.json (default: OUT/.work/state.json beside OUT/report.json) or the
    JSON `draftsmith run` printed at its end (`train_steps`, `train_seconds_per_step`, `minutes`); none if neither."""
    report_path = Path(report_path)
    run = Path(run) if run else report_path.parent / ".work" / "state.json"
    data = json.loads(run.read_text()) if run.is_file() else {}
    if "stages" in data:  # state.json
        train = data["stages"].get("train", {})
        seconds = [s.get("seconds") for s in data["stages"].values()]
        minutes = round(sum(seconds) / 60, 1) if seconds and None not in seconds else None  # as `draftsmith run`
        steps, planned, pace = train.get("steps"), train.get("planned_steps"), train.get("seconds_per_step")
    else:  # what `draftsmith run` printed
        steps, planned, pace = data.get("train_steps"), None, data.get("train_seconds_per_step")
        minutes = data.get("minutes")
    if date is None and report_path.is_file():
        date = dt.datetime.fromtimestamp(report_path.stat().st_mtime, dt.UTC).date().isoformat()
    if machine is None:
        machine = f"{os.cpu_count()} CPU cores ({platform.machine()}), where this table was rendered"
    return RunFacts(train_steps=steps, planned_steps=planned, seconds_per_step=pace, minutes=minutes, date=date,
                    machine=machine)


def _num(value: float | None, places: int = 4) -> str:
    """A figure as the report has it, to at most `places` decimals ("–" when missing)."""
    if value is None:
        return MISSING
    text = f"{round(float(value), places):g}"
    return text if any(c in text for c in ".en") else f"{text}.0"  # 1.0, not 1


def rows(report: ValidationReport, facts: RunFacts = RunFacts()) -> list[tuple[str, str]]:
    """(label, value) for every row of LABELS, in order."""
    greedy, sampling, speed = report.greedy, report.sampling, report.speedup
    values: list[str] = []

    tau = MISSING if report.tau is None else f"**{_num(report.tau)}**"
    where = [f"block {report.block_size}" if report.block_size else "",
             f"{report.prompts} prompts" if report.prompts else ""]
    values.append(", ".join([tau, *filter(None, where)]))

    if greedy.mismatches is None:
        values.append(MISSING)
    else:
        detail = [f"{greedy.tokens} tokens" if greedy.tokens is not None else "",
                  f"{greedy.prompts} prompts" if greedy.prompts is not None else ""]
        detail = " over ".join(filter(None, detail))
        values.append(f"**{greedy.mismatches}** mismatches" + (f" in {detail}" if detail else ""))

    verdict = sampling.verdict()
    if not verdict:
        values.append(MISSING)
    else:
        extra = [f"p = {_num(sampling.p_value, 3)}" if sampling.p_value is not None else "",
                 f"alpha {_num(sampling.alpha)}" if sampling.alpha is not None else ""]
        extra = ", ".join(filter(None, extra))
        values.append(verdict + (f" ({extra})" if extra else ""))

    if speed is None or speed.ratio is None:
        values.append(MISSING)
    else:
        interval = f" [{_num(speed.ratio_ci95[0], 3)}, {_num(speed.ratio_ci95[1], 3)}]" \
            if speed.ratio_ci95 and len(speed.ratio_ci95) == 2 else ""
        block = speed.block_size or report.recommended_block_size
        recommended = " (recommended)" if block is not None and block == report.recommended_block_size else ""
        at = f" at block {block}{recommended}" if block is not None else ""
        values.append(f"**{_num(speed.ratio, 3)}x**{interval}{at}")

    summary = report.serving_advice.summary if report.serving_advice else None
    # Its first clause is the advice ("do not enable this drafter on hardware like the validation machine"); the
    # rest repeats the speedup row.
    values.append(f"*{summary.split(':')[0].strip()}*" if summary else MISSING)

    if facts.train_steps is None:
        values.append(MISSING)
    else:
        of = f" of {facts.planned_steps}" if facts.planned_steps and facts.planned_steps != facts.train_steps else ""
        pace = f", {facts.seconds_per_step:.2f} s a step" if facts.seconds_per_step is not None else ""
        values.append(f"{facts.train_steps}{of} steps{pace}")

    values.append(MISSING if facts.minutes is None else f"{facts.minutes:.1f} min")

    device = report.device
    if device is None or not (device.type or device.name):
        values.append(MISSING)
    else:
        name = device.name if device.name and device.name != device.type else ""
        count = f" x {device.count}" if device.count and device.count > 1 else ""
        parts = [f"{device.type or device.device}{count}", name, device.dtype or ""]
        values.append(", ".join(filter(None, parts)))

    values.append(", ".join(filter(None, [facts.date, facts.machine])) or MISSING)
    return list(zip(LABELS, values, strict=True))


def render_table(report: ValidationReport, facts: RunFacts = RunFacts()) -> str:
    """The markdown table (no trailing newline)."""
    lines = [f"| {HEADER[0]} | {HEADER[1]} |", "|---|---|"]
    lines += [f"| {label} | {value.replace('|', '/')} |" for label, value in rows(report, facts)]
    return "\n".join(lines)


def render_block(table: str, note: str | None = None) -> str:
    """The README's block: the markers around the table, with an HTML comment first when `note` is given."""
    comment = [f"<!-- {note.replace('--', '-')} -->"] if note else []
    return "\n".join([MARK_START, *comment, table, MARK_END])


def replace_block(text: str, block: str) -> str:
    """`text` with its one block between the markers replaced by `block`."""
    start, end = text.find(MARK_START), text.find(MARK_END)
    if start < 0 or end < start or text.count(MARK_START) != 1 or text.count(MARK_END) != 1:
        raise ValueError(f"expected one {MARK_START} ... {MARK_END} block")
    return text[:start] + block + text[end + len(MARK_END):]


def table_in(text: str) -> list[list[str]]:
    """The cells of the markdown table between the markers of `text` (the separator row left out)."""
    start, end = text.find(MARK_START), text.find(MARK_END)
    if start < 0 or end < start:
        return []
    cells = []
    for line in text[start + len(MARK_START):end].splitlines():
        line = line.strip()
        if line.startswith("|") and not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line):
            cells.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="the main job's report.json (out/smollm2-135m/report.json)")
    parser.add_argument("--run", type=Path, help="the run's state.json (default: .work/state.json beside the report) "
                        "or the JSON `draftsmith run` printed")
    parser.add_argument("--date", help="when it was measured (default: report.json's modification date)")
    parser.add_argument("--machine", help="where (default: a description of this machine)")
    parser.add_argument("--note", help="an HTML comment to put first in the block (e.g. where the figures came from)")
    parser.add_argument("--write", type=Path, metavar="README", help="replace the block in this file")
    args = parser.parse_args(argv)

    report = ValidationReport.load(args.report)
    table = render_table(report, run_facts(args.report, run=args.run, date=args.date, machine=args.machine))
    if args.write is None:
        print(table)
        return 0
    args.write.write_text(replace_block(args.write.read_text(), render_block(table, args.note)))
    print(f"wrote the main job's table into {args.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
