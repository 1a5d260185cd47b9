"""One progress display for `draftsmith run`: a bar for the whole run and one for the current stage, each stage
with an ETA from its own measured rate (time so far over the share done).

Bars redraw in place, which a log file or CI output never shows; there the same updates become plain
lines, one per stage start and per tenth of a stage."""

from __future__ import annotations

import time

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from schemas.stages import LOCAL_STAGES as STAGES

MIN_FRACTION_FOR_ETA = 0.02
MIN_SECONDS_FOR_ETA = 5.0


def eta_seconds(fraction: float, elapsed: float) -> float | None:
    """Seconds left at the rate so far, or None until enough of the stage has passed to say."""
    if fraction < MIN_FRACTION_FOR_ETA or elapsed < MIN_SECONDS_FOR_ETA or fraction >= 1.0:
        return None
    return elapsed * (1.0 - fraction) / fraction


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"eta {minutes}m{secs:02d}s" if minutes else f"eta {secs}s"


class RunProgress:
    def __init__(self, clock=time.monotonic):
        self._progress = Progress(TextColumn("{task.description:<10}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                                  TimeElapsedColumn(), TextColumn("{task.fields[eta]:>11}"),
                                  TextColumn("{task.fields[detail]}"))
        self._run = self._progress.add_task("run", total=len(STAGES), detail="", eta="")
        self._clock = clock
        self._stage = None
        self._stage_name = None
        self._stage_started = 0.0
        self._logged_tenths = -1

    def __enter__(self) -> RunProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def __call__(self, stage: str, fraction: float, detail: str) -> None:
        if stage != self._stage_name:
            self._stage_name = stage
            self._stage = self._progress.add_task(stage, total=1.0, detail="", eta="")
            self._stage_started = self._clock()
            self._logged_tenths = -1
        eta = format_eta(eta_seconds(fraction, self._clock() - self._stage_started))
        if not self._progress.console.is_terminal and int(fraction * 10) > self._logged_tenths:
            self._logged_tenths = int(fraction * 10)
            line = f"{stage:<10} {fraction:>4.0%}  {detail}" + (f"  ({eta})" if eta else "")
            self._progress.console.print(line, highlight=False)
        self._progress.update(self._stage, completed=fraction, detail=detail, eta=eta)
        self._progress.update(self._run, completed=STAGES.index(stage) + fraction, detail=stage)
