"""The GPU check always reports: every finished step's figures are saved and printed when a later one fails, and
a rerun into the same folder keeps them and measures only what is missing (device minutes are too few to redo)."""

from __future__ import annotations

import json

import pytest

from bench.gpu_check import Findings


def out_of_memory():
    raise RuntimeError("CUDA out of memory")


def test_a_failed_step_leaves_what_finished_and_a_rerun_does_only_the_rest(tmp_path, capsys):
    path = tmp_path / "run" / "gpu_check.json"
    findings = Findings(path)
    assert findings.step("shaped_target_costs", lambda: {"verify_ms": {"1": 12.5}}) == {"verify_ms": {"1": 12.5}}
    with pytest.raises(RuntimeError, match="out of memory"):
        findings.step("job", out_of_memory)
    saved = json.loads(path.read_text())
    assert saved["shaped_target_costs"] == {"verify_ms": {"1": 12.5}}
    assert saved["failed"]["step"] == "job" and "CUDA out of memory" in saved["failed"]["error"]
    printed = capsys.readouterr().out
    assert "stopped at job: RuntimeError: CUDA out of memory" in printed and "finished: shaped_target_costs" in printed

    again = Findings(path)
    assert again.step("shaped_target_costs", lambda: pytest.fail("measured twice")) == {"verify_ms": {"1": 12.5}}
    assert again.step("job", lambda: {"seconds": 300.0}) == {"seconds": 300.0}
    assert json.loads(path.read_text()) == {"shaped_target_costs": {"verify_ms": {"1": 12.5}}, "job": {"seconds": 300.0}}
