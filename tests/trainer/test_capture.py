"""Teacher-forced capture (trainer/data/capture.py) records what the built-in loop records while generating:
fed the loop's own responses, one padded forward gives the same taps, stop reasons and teacher signal, and a
data set regenerated through a `ResponseBackend` equals the built-in one."""

from __future__ import annotations

import json

import pytest
import torch
from regeneration_helpers import install_vllm_driver, write_ragged_prompts

from schemas.sampling import SamplingParams
from trainer.data.capture import capture_batch
from trainer.data.regenerate import DataError, generate_batch, regenerate, tokenize_prompts

TAPS = [1, 3]
TOP_K = 8


def stop_early(target, monkeypatch, prompt_ids, params, seed=None):
    """Make one response a lone stop token (the tiny random target almost never emits its eos): the first token
    the loop gives some prompt, chosen as the one fewest responses contain, so the others mostly run to length.
    The first step draws every row at once, so that prompt's first token is the same when generated again."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    responses = [r for r, *_ in generate_batch(target, prompt_ids, params, None, generator)]
    token = min((r[0] for r in responses), key=lambda t: sum(t in r for r in responses))
    stops = target.stop_token_ids() + [token]
    monkeypatch.setattr(target, "stop_token_ids", lambda: stops)


def assert_same_capture(expected, got):
    for (response, hidden, reason, teacher), (response2, hidden2, reason2, teacher2) in zip(expected, got, strict=True):
        assert response2 == response and reason2 == reason
        assert (hidden is None) == (hidden2 is None)
        if hidden is not None:
            assert hidden2.dtype == torch.bfloat16 and hidden2.shape == hidden.shape
            # Both sides round float32 states to bfloat16: at most one bfloat16 step (2**-7 relative) apart.
            torch.testing.assert_close(hidden2.float(), hidden.float(), rtol=2**-7, atol=1e-5)
        assert (teacher is None) == (teacher2 is None)
        if teacher is not None:
            assert teacher2.ids.dtype == torch.int32 and teacher2.ids.shape == (len(response), TOP_K)
            assert torch.equal(teacher2.ids, teacher.ids)
            torch.testing.assert_close(teacher2.logits, teacher.logits, rtol=1e-4, atol=1e-4)  # float32 both
            torch.testing.assert_close(teacher2.final_hidden.float(), teacher.final_hidden.float(), rtol=2**-7,
                                       atol=1e-5)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_capture_of_the_loops_responses_equals_what_the_loop_captured(tiny_qwen3, tmp_path, monkeypatch, sampled):
    prompts = write_ragged_prompts(tmp_path / "p.jsonl", 6)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12) if sampled \
        else SamplingParams(max_new_tokens=12)
    prompt_ids = tokenize_prompts(tiny_qwen3, prompts, params)
    stop_early(tiny_qwen3, monkeypatch, prompt_ids, params, 7 if sampled else None)
    generator = torch.Generator().manual_seed(7) if sampled else None
    expected = generate_batch(tiny_qwen3, prompt_ids, params, TAPS, generator, TOP_K)
    reasons = [reason for _, _, reason, _ in expected]
    assert "stop" in reasons and "length" in reasons  # ragged responses as well as ragged prompts
    assert min(len(r) for r, *_ in expected) == 1  # only its stop token: the taps are the prompt's alone
    got = capture_batch(tiny_qwen3, prompt_ids, [(r, reason) for r, _, reason, _ in expected], TAPS, TOP_K)
    assert_same_capture(expected, got)
    if sampled:  # the teacher signal is the raw prediction, not the sampled token's: nothing to do with params
        assert any(t.ids[:, 0].tolist() != r for r, _, _, t in got)


def test_capture_without_cached_taps_or_teacher(tiny_qwen3, tmp_path):
    prompts = write_ragged_prompts(tmp_path / "p.jsonl", 3)
    params = SamplingParams(max_new_tokens=5)
    prompt_ids = tokenize_prompts(tiny_qwen3, prompts, params)
    for taps, top_k in [(None, TOP_K), (TAPS, 0), (None, 0)]:  # online taps (over the cache budget), no teacher
        expected = generate_batch(tiny_qwen3, prompt_ids, params, taps, None, top_k)
        got = capture_batch(tiny_qwen3, prompt_ids, [(r, reason) for r, _, reason, _ in expected], taps, top_k)
        assert_same_capture(expected, got)


def test_capture_refuses_what_no_loop_could_have_written(tiny_qwen3):
    with pytest.raises(DataError, match="at least one token"):
        capture_batch(tiny_qwen3, [[1, 5, 6]], [([], "stop")], TAPS, TOP_K)
    with pytest.raises(DataError, match="2 prompts"):
        capture_batch(tiny_qwen3, [[1, 5], [1, 6]], [([7], "length")], TAPS, TOP_K)


class ReplayBackend:
    """Answers every prompt with the response the built-in loop gave it."""

    name = "replay"

    def __init__(self, answers: dict[tuple[int, ...], tuple[list[int], str]]):
        self.answers, self.calls = answers, []

    def respond(self, prompt_ids, params, seed, *, should_stop=None):
        self.calls.append((len(prompt_ids), params, seed))
        return [self.answers[tuple(ids)] for ids in prompt_ids]


def test_regeneration_through_a_backend_stores_what_the_builtin_loop_stores(tiny_qwen3, tmp_path, monkeypatch):
    prompts = write_ragged_prompts(tmp_path / "p.jsonl", 7)
    params = SamplingParams(max_new_tokens=10)
    stop_early(tiny_qwen3, monkeypatch, tokenize_prompts(tiny_qwen3, prompts, params), params)
    kwargs = dict(tap_layer_ids=TAPS, shard_size=4, batch_size=3, teacher_top_k=TOP_K)  # 2 shards, ragged batches
    builtin = regenerate(tiny_qwen3, prompts, params, tmp_path / "builtin", **kwargs).examples()
    backend = ReplayBackend({tuple(e.input_ids[:e.prompt_len]): (e.input_ids[e.prompt_len:], e.stop_reason)
                             for e in builtin})
    replayed = regenerate(tiny_qwen3, prompts, params, tmp_path / "replayed", backend=backend, **kwargs).examples()
    assert [(n, seed) for n, _, seed in backend.calls] == [(4, params.seed * 100_003), (3, params.seed * 100_003 + 1)]
    assert {"stop", "length"} == {e.stop_reason for e in builtin}
    assert [(e.id, e.input_ids, e.prompt_len, e.stop_reason) for e in replayed] == \
        [(e.id, e.input_ids, e.prompt_len, e.stop_reason) for e in builtin]
    assert_same_capture([(e.input_ids[e.prompt_len:], e.hidden, e.stop_reason, e.teacher) for e in builtin],
                        [(e.input_ids[e.prompt_len:], e.hidden, e.stop_reason, e.teacher) for e in replayed])


# --- the vLLM backend's process and protocol, with a stand-in driver (tests/engines/ runs the real one) ---------

FAKE_DRIVER = '''
import json, sys
config = json.loads(sys.argv[1])
print(json.dumps({"ready": True, "vllm_version": "fake", "config": config}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    if request["max_tokens"] == 13:
        sys.exit(3)
    with open(config["target"] + "/requests.jsonl", "a") as log:
        log.write(line)
    print(json.dumps({"tokens": [[len(p), request["stop_token_ids"][0]] for p in request["prompts"]],
                      "finish": ["stop"] * len(request["prompts"]), "seconds": 0.5}), flush=True)
'''


@pytest.fixture
def fake_vllm(tiny_qwen3, tmp_path, monkeypatch):
    return install_vllm_driver(tiny_qwen3, tmp_path, monkeypatch, FAKE_DRIVER)  # it logs requests into the target


def test_vllm_backend_speaks_one_line_each_way_and_adds_up_its_time(fake_vllm):
    from trainer.data.vllm_backend import VllmResponses

    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=9)
    with VllmResponses(fake_vllm) as backend:
        assert backend.vllm_version == "fake"
        first = backend.respond([[1, 5, 6], [1, 7]], params, seed=11)
        backend.respond([[1, 8]], params, seed=12)
        process, log = backend._process, backend.log_path
    stop = fake_vllm.stop_token_ids()[0]
    assert first == [([3, stop], "stop"), ([2, stop], "stop")]
    assert (backend.seconds, backend.tokens) == (1.0, 6)
    requests = [json.loads(line) for line in (fake_vllm.path / "requests.jsonl").read_text().splitlines()]
    assert requests[0]["prompts"] == [[1, 5, 6], [1, 7]] and requests[0]["stop_token_ids"] == fake_vllm.stop_token_ids()
    assert {k: requests[0][k] for k in ("temperature", "top_p", "top_k", "max_tokens")} == \
        {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "max_tokens": 9}
    seeds = [s for r in requests for s in r["seeds"]]
    assert len(set(seeds)) == 3  # every prompt its own random stream, across requests too
    assert process.poll() is not None and not log.exists()  # stopped; its log removed after a clean stage


def test_vllm_backend_names_the_failure_and_its_log(fake_vllm, monkeypatch, tmp_path):
    from trainer.data.vllm_backend import EngineFailed, EngineMissing, VllmResponses

    with pytest.raises(EngineFailed, match=r"exited \(status 3\) while generating; log .*driver.log") as error:
        with VllmResponses(fake_vllm, log_path=tmp_path / "driver.log") as backend:
            backend.respond([[1, 5]], SamplingParams(max_new_tokens=13), seed=0)
    assert error.value.code == "engine_failed"
    with pytest.raises(EngineFailed, match="exceeds the vLLM engine's max_model_len 16"):
        with VllmResponses(fake_vllm, max_model_len=16, log_path=tmp_path / "short.log") as backend:
            backend.respond([[1] * 10], SamplingParams(max_new_tokens=8), seed=0)
    monkeypatch.delenv("DRAFTSMITH_VLLM_PYTHON")  # and tests/conftest.py hides the engines folder
    with pytest.raises(EngineMissing, match="bench/setup/vllm_cpu.sh") as error:
        VllmResponses(fake_vllm).__enter__()
    assert error.value.code == "engine_missing"


def test_vllm_driver_keeps_the_stop_token_at_the_end_of_a_response():
    from types import SimpleNamespace

    from trainer.data.vllm_generate_driver import finished

    def output(tokens, finish, reason=None):
        return SimpleNamespace(token_ids=tokens, finish_reason=finish, stop_reason=reason)

    assert finished(output([5, 6], "length"), {2}) == ([5, 6], "length")
    assert finished(output([5, 2], "stop"), {2}) == ([5, 2], "stop")  # as vLLM 0.32 returns it
    assert finished(output([5], "stop", 7), {2, 7}) == ([5, 7], "stop")  # were a version to trim it
    with pytest.raises(RuntimeError, match="finish reason 'abort'"):
        finished(output([5], "abort"), {2})
