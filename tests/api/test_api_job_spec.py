"""The pure schemas the API shares with the trainer: the job spec and the prompt-file validator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas import recipe
from schemas.job_spec import JobSpec, path_is_within_roots
from schemas.prompts import iter_prompt_records, parse_prompt_line, validate_prompt_bytes

ROOTS = {"allowed_file_roots": ["/srv/models", "/data"]}


def errors_of(body: dict, context: dict | None = None) -> dict[str, str]:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(body, context=context)
    return {".".join(str(p) for p in e["loc"]): e["msg"] for e in caught.value.errors()}


def test_smallest_body_gets_every_default():
    spec = JobSpec.model_validate({"target": {"uri": "bundled:smollm2-135m"}})
    assert spec.target.allow_pickle is False and spec.target.trust_remote_code is False
    assert (spec.drafter.variant, spec.drafter.block_size, spec.drafter.num_layers) == ("dflash2", 8, 2)
    assert (spec.data.source, spec.data.count, spec.data.holdout_share) == ("builtin", None, recipe.HOLDOUT_SHARE)
    assert spec.training.zero_stage == 2 and spec.publish == [] and spec.labels == {}
    # The one recipe `draftsmith run` also trains with (schemas/recipe.py).
    assert (spec.training.max_steps, spec.training.learning_rate, spec.training.anchors_per_sequence) == (
        recipe.TRAIN_STEPS, recipe.LEARNING_RATE, recipe.ANCHORS_PER_SEQUENCE)
    assert spec.validation.prompts == recipe.VALIDATION_PROMPTS
    assert spec.sampling.greedy  # reuses schemas.sampling.SamplingParams


@pytest.mark.parametrize("uri", [
    "hf://acme/llama-8b-support", "hf://acme/llama-8b-support@v1.2", "hf://gpt2", "hf://org/name@refs/pr/1",
    "s3://my-bucket/models/x", "s3://my.bucket", "file:///srv/models/acme", "file:///data", "bundled:smollm2-135m",
])
def test_valid_target_uris(uri):
    assert JobSpec.model_validate({"target": {"uri": uri}}, context=ROOTS).target.uri == uri


@pytest.mark.parametrize(("uri", "fragment"), [
    ("file:///srv/models/../etc", "'..'"),
    ("file:///srv/models/..%2F..%2Fetc", "'..'"),
    ("file:///srv/models-evil/x", "outside the allowed roots"),
    ("file:///etc/shadow", "outside the allowed roots"),
    ("ftp://host/x", "unsupported URI scheme 'ftp'"),
    ("hf://acme/", "Hugging Face repo id"),
    ("hf://-bad/name", "Hugging Face repo id"),
    ("s3://ab/x", "S3 bucket"),
    ("bundled:llama", "unknown bundled target"),
    ("", "non-empty"),
    ("hf://a/b\n", "whitespace"),
])
def test_invalid_target_uris(uri, fragment):
    errors = errors_of({"target": {"uri": uri}}, ROOTS)
    assert fragment in errors["target.uri"]


def test_file_uris_need_configured_roots():
    assert "disabled" in errors_of({"target": {"uri": "file:///srv/models/x"}})["target.uri"]
    assert path_is_within_roots("/srv/models/x", ["/srv/models/"])
    assert not path_is_within_roots("/srv/modelsX", ["/srv/models"])


def test_data_publish_and_labels():
    spec = JobSpec.model_validate({
        "target": {"uri": "bundled:smollm2-135m"},
        "data": {"source": "file-01J0000000000000000000000", "count": 20, "holdout_share": 0.05},
        "publish": [{"kind": "s3", "uri": "s3://out-bucket/drafters"}, {"kind": "hf", "repo": "acme/drafter"}],
        "labels": {"team": "search", "cost-centre.id": "42"},
    })
    assert [d.kind for d in spec.publish] == ["s3", "hf"] and spec.publish[1].private
    errors = errors_of({"target": {"uri": "bundled:smollm2-135m"}, "data": {"source": "http://x/p.jsonl"},
                        "publish": [{"kind": "hf", "repo": "no-namespace"}],
                        "labels": {f"k{i}": "v" for i in range(17)}})
    assert "unsupported URI scheme" in errors["data.source"]
    assert "org/name" in errors["publish.0.hf.repo"]
    assert "at most 16" in errors["labels"]
    assert "printable" in errors_of({"target": {"uri": "bundled:smollm2-135m"},
                                     "labels": {"team": "a\u0000b"}})["labels"]


def test_canonical_json_ignores_key_order_and_explicit_defaults():
    a = JobSpec.model_validate({"target": {"uri": "bundled:smollm2-135m"}, "labels": {"a": "1", "b": "2"}})
    b = JobSpec.model_validate({"labels": {"b": "2", "a": "1"}, "drafter": {"block_size": 8},
                                "target": {"uri": "bundled:smollm2-135m", "allow_pickle": False}})
    assert a.canonical_json() == b.canonical_json()
    c = JobSpec.model_validate({"target": {"uri": "bundled:smollm2-135m"}, "drafter": {"block_size": 9}})
    assert c.canonical_json() != a.canonical_json()


def test_prompt_validator_reports_line_numbers():
    data = (b'{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}\n'
            b'{"prompt": "Write a haiku"}\n'
            b'not json\n'
            b'\n'
            b'{"prompt": ""}\n'
            b'{"messages": [{"role": "user", "content": "x", "nickname": "bob"}]}\n')  # (`name` is OpenAI's)
    report = validate_prompt_bytes(data)
    assert not report.valid and report.prompt_count == 2 and report.line_count == 6
    assert [(e.line, e.message.split(":")[0]) for e in report.errors] == [
        (3, "malformed JSON"), (5, "prompt"), (6, "messages.0.nickname")]
    assert validate_prompt_bytes(b"\xef\xbb\xbf" + b'{"prompt": "bom"}').valid
    many = validate_prompt_bytes(b"x\n" * 50, max_errors=5)
    assert len(many.errors) == 5 and many.truncated
    assert parse_prompt_line('{"prompt": "p"}').as_messages()[0].role == "user"


def test_iter_prompt_records_names_file_and_line(tmp_path: Path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": 3}\n')
    records = iter_prompt_records(str(path))
    assert next(records).prompt == "a"
    with pytest.raises(ValueError, match=r"p\.jsonl: line 3: prompt"):
        next(records)


def test_schemas_import_without_fastapi_sqlalchemy_or_torch():
    code = ("import json, sys, schemas.job_spec, schemas.prompts\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                            capture_output=True, text=True, check=True, timeout=60)
    loaded = set(json.loads(result.stdout))
    assert "pydantic" in loaded and not loaded & {"fastapi", "sqlalchemy", "torch", "starlette", "api"}
