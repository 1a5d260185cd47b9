"""What a target folder holds never decides what is opened or allocated: an adapter's named base is not followed,
absurd or mismatched sizes are refused from config.json and the safetensors headers before anything is built, and
every malformed file class gets its own error code (never internal_error)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from file_audit import make_adapter, opened_paths
from tiny_targets import make_tiny_target

from bench.hostile_checkpoints import MALFORMED
from trainer.errors import StageInterrupted, TargetError
from trainer.interruptible import stops_on_request
from trainer.targets import inspect_target_dir, load_target

ROOT = Path(__file__).resolve().parents[2]
@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("orgs")
    victim = make_tiny_target(root / "org-a" / "private-model", "llama")  # another organisation's cached model
    base = make_tiny_target(root / "org-b" / "base", "llama", seed=1)
    outside = make_tiny_target(root / "elsewhere" / "model", "llama", seed=2)
    (root / "org-b" / "link").symlink_to(victim)
    return {"root": root, "victim": victim, "base": base, "outside": outside, "link": root / "org-b" / "link"}


def test_an_adapter_s_named_base_is_never_opened_and_every_name_gets_one_message(folders, tmp_path):
    named = {"another organisation's model": str(folders["victim"]), "a folder outside the roots":
             str(folders["outside"]), "/etc": "/etc", "a relative path": "../org-a/private-model",
             "a symlink": str(folders["link"]), "a folder that does not exist": str(folders["root"] / "nothing")}
    messages = {}
    for what, name in named.items():
        adapter = make_adapter(folders["base"], tmp_path / f"adapter-{len(messages)}", name)
        with opened_paths() as opened:
            with pytest.raises(TargetError) as error:
                load_target(adapter)
        assert error.value.code == "target_base_required", what
        messages[what] = str(error.value)
        touched = [p for p in opened if p.startswith((str(folders["victim"]), str(folders["outside"]), "/etc"))]
        assert touched == [], f"{what}: opened {touched}"
    assert len(set(messages.values())) == 1, messages  # no existence oracle: the same words whatever it names
    assert "set target.base" in next(iter(messages.values()))


def test_with_a_base_named_by_the_job_only_that_base_is_opened(folders, tmp_path):
    adapter = make_adapter(folders["base"], tmp_path / "adapter", str(folders["victim"]))
    with opened_paths() as opened:
        target = load_target(adapter, base=folders["base"])
    assert target.path == folders["base"]
    assert not [p for p in opened if p.startswith(str(folders["victim"]))]


def test_a_tokenizer_config_naming_a_file_elsewhere_is_refused(folders, tmp_path):
    target = tmp_path / "t"
    shutil.copytree(folders["base"], target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps(
        {**config, "fast_tokenizer_files": {"4.0.0": f"../../{folders['victim'].name}/tokenizer.json"}}))
    with opened_paths() as opened, pytest.raises(TargetError) as error:
        load_target(target)
    assert error.value.code == "tokenizer_invalid" and "fast_tokenizer_files" in str(error.value)
    assert not [p for p in opened if p.startswith(str(folders["victim"]))]


# --- malformed weight files: each class its own code, before anything is allocated -------------------------------


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_each_malformed_file_class_is_a_target_error_with_its_own_code(folders, tmp_path, kind):
    spoil, code = MALFORMED[kind]
    folder = tmp_path / "target"
    shutil.copytree(folders["base"], folder)
    spoil(folder)
    with pytest.raises(TargetError) as error:
        load_target(folder)
    assert error.value.code == code, str(error.value)
    assert "\n" not in str(error.value) and str(error.value).startswith("target")


def test_a_duplicate_tensor_across_shards_is_refused(folders, tmp_path):
    folder = tmp_path / "target"
    shutil.copytree(folders["base"], folder)
    shutil.copy(folder / "model.safetensors", folder / "model-extra.safetensors")
    with pytest.raises(TargetError) as error:
        inspect_target_dir(folder)
    assert error.value.code == "weights_tensor_duplicate"


# --- absurd sizes: refused in seconds, at a bounded memory, for each family kind ----------------------------------


def test_absurd_and_mismatched_sizes_are_refused_in_seconds_at_a_bounded_memory(tmp_path):
    """bench/hostile_checkpoints.py in a fresh process: its peak memory is that of the refusals, not of an earlier
    test's models."""
    script = ("import json, sys; from bench.hostile_checkpoints import ABSURD, run, peak_rss_mb; from pathlib import "
              "Path; rows = [r for r in run(Path(sys.argv[1])) if r['case'] in ABSURD]; "
              "print(json.dumps({'rows': rows, 'peak_rss_mb': peak_rss_mb()}))")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {row["family"] for row in result["rows"]} == {"llama", "qwen3_moe", "qwen3_5", "gemma3", "gpt_oss"}
    for row in result["rows"]:
        assert row["code"] == row["expected"], row
        assert row["seconds"] < 60, row  # generous for a loaded machine: the attack it replaces ran for minutes
        assert row["peak_rss_rise_mb"] < 256, row  # an 8B model's weights would take 32 GB
    assert result["peak_rss_mb"] < 2048, result  # torch and transformers alone take ~0.6 GB here


# --- a load that never polls still stops on request -----------------------------------------------------------------


def test_a_loader_that_never_polls_stops_within_a_second_of_the_request():
    asked = threading.Event()
    threading.Timer(0.3, asked.set).start()
    started = time.monotonic()
    with pytest.raises(StageInterrupted):
        with stops_on_request(asked.is_set, poll_seconds=0.1):
            while time.monotonic() - started < 30:  # a loader's Python loop, between tensors: it asks nobody
                sum(range(1000))
    assert time.monotonic() - started < 3


def test_a_request_after_the_block_ended_interrupts_nothing():
    asked = threading.Event()
    with stops_on_request(asked.is_set, poll_seconds=0.05):
        sum(range(1000))
    asked.set()
    ran = 0
    for _ in range(20):  # 0.2 s of Python after the block: a late interruption would land here
        time.sleep(0.01)
        ran += 1
    assert ran == 20
