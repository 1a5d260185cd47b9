"""bench/bootstrap_shift.py on a tiny input (2 data sets of 8 prompts, 200 draws): every statistic is measured and
printed, and the old loop at one seed is deterministic. Under a second."""

from __future__ import annotations

from bench.bootstrap_shift import main, plain_interval, plain_tau, shifts


def test_every_statistic_is_measured_on_a_tiny_input():
    found = shifts(sets=2, prompts=8, draws=200)
    assert len(found) == 5
    for row in found.values():
        assert row["shift"] >= 0 and row["old_seed_move"] >= 0
        assert 0 <= row["share"] < 1  # trainer/bootstrap.py lands inside the old interval's width


def test_the_old_loop_is_seeded():
    data = [(10, 4), (12, 6), (9, 3), (20, 7)]
    first = plain_interval(lambda p: plain_tau(data, p), len(data), draws=100, seed=0)
    assert first == plain_interval(lambda p: plain_tau(data, p), len(data), draws=100, seed=0)
    assert first[0] <= first[1]


def test_the_command_prints_a_row_per_statistic(capsys):
    main(["--sets", "1", "--prompts", "8", "--draws", "100"])
    out = capsys.readouterr().out
    assert "tau" in out and "seed-pooled ratio" in out and "speedup, 6 prompts" in out
