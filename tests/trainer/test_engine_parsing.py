"""What the engine step reads from the engines, and how it judges their output (cheap; no engine needed).

The log lines are llama-server's own (llama-cpp-python 0.3.36's vendored llama.cpp, `print_timings` in
tools/server/server-context.cpp), copied from a run on this machine; vLLM's counters are the names its
`LLM.get_metrics()` returns (vllm/v1/spec_decode/metrics.py), fed here as plain objects."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

from report.engine_figures import engine_markdown, headline_rows
from trainer.validation import engine_paths
from trainer.validation.engine_llama_cpp import LlamaRun, parse_acceptance
from trainer.validation.engines import compare, first_difference, normalise

LOG = """\
0.09.881.121 I slot print_timing: id  0 | task 0 | draft acceptance = 0.00000 (    0 accepted /    15 generated), mean len =  1.00
0.14.653.836 I slot print_timing: id  0 | task 9 | draft acceptance = 0.64706 (   11 accepted /    17 generated), mean len =  3.20
0.15.100.001 I slot print_timing: id  0 | task 12 | draft acceptance = 0.25000 (   20 accepted /    80 generated), mean len =  1.50
"""


def test_llama_cpp_acceptance_lines_sum_to_its_mean_length():
    accepted, generated, steps = parse_acceptance(LOG)
    # 11 accepted over 5 drafted steps (mean 3.2), 20 over 40 (mean 1.5), and a request that accepted nothing.
    assert (accepted, generated) == (31, 112)
    assert steps == 1 + 5 + 40
    assert parse_acceptance("no speculative decoding here\n") == (0, 0, 0)


def test_llama_cpp_command_names_the_exported_files():
    run = LlamaRun("x", Path("/w/target-f16.gguf"), "draft-dflash", Path("/out/gguf/drafter-q8_0-d2t.gguf"), 3, 0.5)
    command = run.command(2, 2048, {Path("/out/gguf/drafter-q8_0-d2t.gguf"): "./gguf/drafter-q8_0-d2t.gguf",
                                    Path("/w/target-f16.gguf"): "target.gguf"})
    assert command == ("llama-server -m target.gguf -t 2 -c 2048 -np 1 --temp 0 -md ./gguf/drafter-q8_0-d2t.gguf "
                       "--spec-type draft-dflash --spec-draft-n-max 3 --spec-draft-p-min 0.5 -td 2")


def test_outputs_compare_up_to_the_stop_token():
    assert normalise([5, 6, 2, 9], {2}, 10) == [5, 6] and normalise([5, 6, 7], {2}, 2) == [5, 6]
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 4], [1, 2, 3]) == 2 and first_difference([1, 2], [1, 2, 3]) == 2
    assert compare([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == {"equal": 1, "of": 2,
                                                           "first_difference": {"prompt": 1, "position": 1}}


def test_vllm_counters_are_read_as_differences():
    spec = importlib.util.spec_from_file_location("vllm_driver", Path(engine_paths.__file__).with_name("vllm_driver.py"))
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)  # imports no vLLM at module level
    llm = SimpleNamespace(get_metrics=lambda: [
        SimpleNamespace(name="vllm:spec_decode_num_drafts", value=7),
        SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=28),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=14),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[5, 4, 3, 2]),
        SimpleNamespace(name="vllm:num_requests_running", value=0),
    ])
    assert driver.counters(llm) == {"drafts": 7, "draft_tokens": 28, "accepted_tokens": 14,
                                    "accepted_per_position": [5, 4, 3, 2]}


def test_engine_table_keeps_baselines_the_best_setting_and_refusals():
    rows = [
        {"engine": "llama.cpp", "target": "f16", "spec": "none", "tokens_per_s": 20.0, "ratio": 1.0, "name": "a",
         "command": "llama-server -m target-f16.gguf"},
        {"engine": "llama.cpp", "target": "f16", "spec": "ngram-simple", "tokens_per_s": 22.0, "ratio": 1.1,
         "tau": 2.0, "name": "b", "greedy_equals_engine_target": {"equal": 4, "of": 4}},
        {"engine": "llama.cpp", "target": "f16", "spec": "draft-dflash", "drafter": "d2t.gguf", "n_max": 2,
         "p_min": 0.5, "tokens_per_s": 25.0, "tau": 1.6, "name": "c"},
        {"engine": "llama.cpp", "target": "f16", "spec": "draft-dflash", "drafter": "d2t.gguf", "n_max": 7,
         "p_min": 0.0, "tokens_per_s": 9.0, "tau": 1.4, "name": "d"},
        {"engine": "llama.cpp", "target": "f16", "spec": "draft-dflash", "drafter": "full.gguf", "n_max": 2,
         "p_min": 0.5, "tokens_per_s": 21.0, "tau": 1.6, "name": "e"},
        {"engine": "vllm", "target": "float32", "spec": "dflash", "name": "f",
         "refused": "ValueError: Model Runner V1 does not support: DFlash candidate-head drafts"},
    ]
    section = {"rows": rows, "prompts": 4, "max_new_tokens": 64, "skipped": ["vllm is not installed: skipped"]}
    assert [r["name"] for r in headline_rows(section)] == ["a", "b", "c", "e", "f"]
    table = engine_markdown(section)
    assert "DFlash candidate-head drafts" in table and "d2t.gguf, n-max 2, p-min 0.5" in table
    assert "llama-server -m target-f16.gguf" in table and "vllm is not installed: skipped" in table
    assert "n-max 7" not in table and "n-max 7" in engine_markdown(section, full=True)
