"""One progress display for `draftsmith run`: a bar for the whole run and one for the current stage.

Bars redraw in place, which a log file or CI output never shows; there the same updates become plain
lines, one per stage start and per tenth of a stage."""

from __future__ import annotations

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from schemas.stages import LOCAL_STAGES as STAGES


class RunProgress:
    def __init__(self):
        self._progress = Progress(TextColumn("{task.description:<10}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                                  TimeElapsedColumn(), TextColumn("{task.fields[detail]}"))
        self._run = self._progress.add_task("run", total=len(STAGES), detail="")
        self._stage = None
        self._stage_name = None
        self._logged_tenths = -1

    def __enter__(self) -> RunProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def __call__(self, stage: str, fraction: float, detail: str) -> None:
        if stage != self._stage_name:
            self._stage_name = stage
            self._stage = self._progress.add_task(stage, total=1.0, detail="")
            self._logged_tenths = -1
        if not self._progress.console.is_terminal and int(fraction * 10) > self._logged_tenths:
            self._logged_tenths = int(fraction * 10)
            self._progress.console.print(f"{stage:<10} {fraction:>4.0%}  {detail}", highlight=False)
        self._progress.update(self._stage, completed=fraction, detail=detail)
        self._progress.update(self._run, completed=STAGES.index(stage) + fraction, detail=stage)
