"""`draftsmith run` shows its progress in a log (no terminal) too: a line per stage start and per tenth."""

from __future__ import annotations

from trainer.run_progress import RunProgress


def test_progress_lines_without_a_terminal(capsys):
    with RunProgress() as progress:
        for step in range(101):
            progress("train", step / 100, f"step {step}")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train ")]
    assert [line.split()[1] for line in lines[:11]] == [f"{tenth * 10}%" for tenth in range(11)]
    assert "step 50" in lines[5]
