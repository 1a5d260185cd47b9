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


def test_each_stage_shows_an_eta_from_its_own_rate(capsys):
    now = [0.0]
    with RunProgress(clock=lambda: now[0]) as progress:
        progress("generate", 0.0, "starting")
        now[0] = 60.0
        progress("generate", 0.25, "a quarter")  # 60 s for 25 %: 180 s to go
        now[0] = 61.0
        progress("train", 0.0, "starting")  # a new stage has no rate yet
    lines = capsys.readouterr().out.splitlines()
    assert any("a quarter" in line and "eta 3m00s" in line for line in lines)
    assert not any("train" in line and "eta" in line for line in lines)
