"""What a target folder holds never decides what is opened or allocated: an adapter's named base is not followed,
absurd or mismatched sizes are refused from config.json and the safetensors headers before anything is built, and
every malformed file class gets its own error code (never internal_error)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from tiny_targets import make_tiny_target

from trainer.errors import StageInterrupted, TargetError
from trainer.interruptible import stops_on_request
from trainer.targets import inspect_target_dir, load_target

ROOT = Path(__file__).resolve().parents[2]
_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, Path)):
        _OPENED.append(os.path.realpath(str(args[0])))


sys.addaudithook(_audit)  # a hook cannot be removed: it records only inside `opened_paths`


@contextmanager
def opened_paths():
    """Every path this process opens or lists inside the block (CPython's audit events: the file-access audit)."""
    global _OPENED
    _OPENED = []
    try:
        yield _OPENED
    finally:
        _OPENED = None


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("orgs")
    victim = make_tiny_target(root / "org-a" / "private-model", "llama")  # another organisation's cached model
    base = make_tiny_target(root / "org-b" / "base", "llama", seed=1)
    outside = make_tiny_target(root / "elsewhere" / "model", "llama", seed=2)
    (root / "org-b" / "link").symlink_to(victim)
    return {"root": root, "victim": victim, "base": base, "outside": outside, "link": root / "org-b" / "link"}


_ADAPTERS: dict[Path, Path] = {}


def make_adapter(base: Path, out: Path, names: str) -> Path:
    """A LoRA adapter over `base` whose adapter_config.json names `names` as its base (peft saves one adapter per
    base once; each call copies it and rewrites the name)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if base not in _ADAPTERS:
        saved = base.parent / f"{base.name}-lora"
        get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                       LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(saved)
        _ADAPTERS[base] = saved
    shutil.copytree(_ADAPTERS[base], out)
    config = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": names}))
    return out


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


def _write_safetensors(path: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _weights(folder: Path) -> Path:
    return folder / "model.safetensors"


def _header(folder: Path) -> tuple[dict, bytes]:
    raw = _weights(folder).read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def header_bomb(folder: Path) -> None:
    _weights(folder).write_bytes(struct.pack("<Q", 1 << 40) + b"{}" * 64)


def truncated_shard(folder: Path) -> None:
    raw = _weights(folder).read_bytes()
    _weights(folder).write_bytes(raw[: len(raw) // 2])


def unknown_dtype(folder: Path) -> None:
    header, data = _header(folder)
    name = next(k for k in header if k != "__metadata__")
    header[name]["dtype"] = "F33"
    _write_safetensors(_weights(folder), header, data)


def integer_weight(folder: Path) -> None:
    header, data = _header(folder)
    name = next(k for k in header if k.endswith("q_proj.weight"))
    header[name]["dtype"] = "I32"  # F32 and I32 are both 4 bytes: the offsets still agree
    _write_safetensors(_weights(folder), header, data)


def duplicate_tensor(folder: Path) -> None:
    header, data = _header(folder)
    name = next(k for k in header if k != "__metadata__")
    raw = json.dumps(header).encode()
    entry = json.dumps({name: header[name]})[1:-1].encode()
    raw = raw[:-1] + b", " + entry + b"}"  # the same key again: JSON parsers keep one silently
    _weights(folder).write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def config_mismatch(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] * 2}))


def broken_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "NoSuchModel"}}')


def failing_chat_template(folder: Path) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ raise_exception('this template refuses every conversation') }}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)


MALFORMED = {
    "header bomb": (header_bomb, "weights_header_invalid"),
    "truncated shard": (truncated_shard, "weights_shard_truncated"),
    "unknown dtype": (unknown_dtype, "weights_dtype_invalid"),
    "integer weight": (integer_weight, "weights_dtype_invalid"),
    "duplicate tensor": (duplicate_tensor, "weights_tensor_duplicate"),
    "config/weights mismatch": (config_mismatch, "target_shape_mismatch"),
    "tokenizer that does not parse": (broken_tokenizer, "tokenizer_invalid"),
    "chat template that fails to render": (failing_chat_template, "chat_template_invalid"),
}


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
    shutil.copy(_weights(folder), folder / "model-extra.safetensors")
    with pytest.raises(TargetError) as error:
        inspect_target_dir(folder)
    assert error.value.code == "weights_tensor_duplicate"


# --- absurd sizes: refused in seconds, at a bounded memory, for each family kind ----------------------------------

ABSURD_SCRIPT = """
import json, resource, sys, time
sys.path.insert(0, "tests")
from pathlib import Path
from tiny_targets import make_tiny_target
from trainer.errors import TargetError
from trainer.targets import load_target
root = Path(sys.argv[1])
rows = []
for family in ("llama", "qwen3_moe", "qwen3_5", "gemma3", "gpt_oss"):
    folder = make_tiny_target(root / family, family)
    config = json.loads((folder / "config.json").read_text())
    cases = {
        "hidden 10^7, 100,000 layers": {"hidden_size": 10**7, "num_hidden_layers": 100_000},
        "hidden 10^7": {"hidden_size": 10**7},
        "vocabulary 10^9": {"vocab_size": 10**9},
        "a string for a size": {"num_hidden_layers": "30"},
        "8B shapes over tiny weights": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32},
    }
    for case, change in cases.items():
        bad = root / f"{family}-{len(rows)}"
        bad.mkdir()
        for file in folder.iterdir():
            (bad / file.name).symlink_to(file)
        (bad / "config.json").unlink()
        changed = {**config, **change}
        if "num_hidden_layers" in change:  # a hybrid's layer pattern follows the depth it declares
            changed.pop("layer_types", None)
        (bad / "config.json").write_text(json.dumps(changed))
        started = time.monotonic()
        try:
            load_target(bad)
            code = "loaded"
        except TargetError as error:
            code = error.code
        rows.append({"family": family, "case": case, "code": code, "seconds": round(time.monotonic() - started, 2)})
print(json.dumps({"rows": rows, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
"""


def test_absurd_and_mismatched_sizes_are_refused_in_seconds_at_a_bounded_memory(tmp_path):
    done = subprocess.run([sys.executable, "-c", ABSURD_SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(result, indent=1))  # the figures of the closing note: seconds and peak memory per case
    expected = {"hidden 10^7, 100,000 layers": "target_too_large", "hidden 10^7": "target_too_large",
                "vocabulary 10^9": "target_too_large", "a string for a size": "target_config_invalid",
                "8B shapes over tiny weights": "target_shape_mismatch"}
    for row in result["rows"]:
        assert row["code"] == expected[row["case"]], row
        assert row["seconds"] < 60, row  # generous for a loaded machine: the attack it replaces ran for minutes
    # torch and transformers alone take ~0.6 GB here; an 8B model's weights would take 32 GB.
    assert result["peak_rss_mb"] < 2048, result


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
