"""Bench: every hostile target folder class, how it is refused, how fast and at what memory.

    python -m bench.hostile_checkpoints [--work DIR]

Each case starts from a tiny random target of one family (tests/tiny_targets.py) and spoils one file the way an
organisation's checkpoint could: a safetensors header bomb, a truncated shard, a dtype safetensors does not define or
an integer dtype for a float weight, the same tensor twice, a config that disagrees with its weights, absurd sizes
(hidden 10^7 over 100,000 layers, a 10^9 vocabulary), a string where a size goes, a tokenizer that does not parse, a
chat template that fails to render, a tokenizer file named outside the folder. It prints, per case: the error code,
the seconds to refusal and how far the process's peak resident memory rose (after a warm-up load of a valid
target, so imports are not counted). Numbers, not assertions: tests/trainer/test_hostile_checkpoints.py asserts
the codes and bounds.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

FAMILIES = ("llama", "qwen3_moe", "qwen3_5", "gemma3", "gpt_oss")


def _weights(folder: Path) -> Path:
    return folder / "model.safetensors"


def _header(folder: Path) -> tuple[dict, bytes]:
    raw = _weights(folder).read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def _write(folder: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    _weights(folder).write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def header_bomb(folder: Path) -> None:
    _weights(folder).write_bytes(struct.pack("<Q", 1 << 40) + b"{}" * 64)


def truncated_shard(folder: Path) -> None:
    raw = _weights(folder).read_bytes()
    _weights(folder).write_bytes(raw[: len(raw) // 2])


def unknown_dtype(folder: Path) -> None:
    header, data = _header(folder)
    header[next(k for k in header if k != "__metadata__")]["dtype"] = "F33"
    _write(folder, header, data)


def integer_weight(folder: Path) -> None:
    header, data = _header(folder)
    header[next(k for k in header if k.endswith("q_proj.weight"))]["dtype"] = "I32"  # 4 bytes, as F32: offsets agree
    _write(folder, header, data)


def duplicate_tensor(folder: Path) -> None:
    header, data = _header(folder)
    name = next(k for k in header if k != "__metadata__")
    raw = json.dumps(header).encode()
    raw = raw[:-1] + b", " + json.dumps({name: header[name]})[1:-1].encode() + b"}"  # the same key twice
    _weights(folder).write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _config_with(**change) -> Callable[[Path], None]:
    def spoil(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        if "num_hidden_layers" in change:  # a hybrid's layer pattern follows the depth it declares
            config.pop("layer_types", None)
        (folder / "config.json").write_text(json.dumps({**config, **change}))
    return spoil


def config_mismatch(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    _config_with(intermediate_size=config["intermediate_size"] * 2)(folder)


def broken_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "NoSuchModel"}}')


def failing_chat_template(folder: Path) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ raise_exception('this template refuses every conversation') }}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)


def tokenizer_file_elsewhere(folder: Path) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["fast_tokenizer_files"] = {"4.0.0": "../../other-organisation/tokenizer.json"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


MALFORMED: dict[str, tuple[Callable[[Path], None], str]] = {
    "header bomb": (header_bomb, "weights_header_invalid"),
    "truncated shard": (truncated_shard, "weights_shard_truncated"),
    "unknown dtype": (unknown_dtype, "weights_dtype_invalid"),
    "integer weight": (integer_weight, "weights_dtype_invalid"),
    "duplicate tensor": (duplicate_tensor, "weights_tensor_duplicate"),
    "config/weights mismatch": (config_mismatch, "target_shape_mismatch"),
    "tokenizer that does not parse": (broken_tokenizer, "tokenizer_invalid"),
    "chat template that fails to render": (failing_chat_template, "chat_template_invalid"),
    "tokenizer file named outside the folder": (tokenizer_file_elsewhere, "tokenizer_invalid"),
}
ABSURD: dict[str, tuple[Callable[[Path], None], str]] = {
    "hidden 10^7, 100,000 layers": (_config_with(hidden_size=10**7, num_hidden_layers=100_000), "target_too_large"),
    "hidden 10^7": (_config_with(hidden_size=10**7), "target_too_large"),
    "vocabulary 10^9": (_config_with(vocab_size=10**9), "target_too_large"),
    "a string for a size": (_config_with(num_hidden_layers="30"), "target_config_invalid"),
    "8B shapes over tiny weights": (_config_with(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32),
                                    "target_shape_mismatch"),
}


def peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM, which starts again at exec. (ru_maxrss does not on Linux: a
    process started by a 2 GB test runner would report the runner's peak as its own.)"""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def refusal(folder: Path) -> tuple[str, float]:
    """(the error code, or "loaded", and the seconds the load took)."""
    from trainer.errors import TargetError
    from trainer.targets import load_target

    started = time.monotonic()
    try:
        load_target(folder)
        code = "loaded"
    except TargetError as error:
        code = error.code
    return code, time.monotonic() - started


def run(work: Path) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_targets import make_tiny_target

    rows = []
    for family in FAMILIES:
        clean = make_tiny_target(work / family, family)
        refusal(clean)  # warm-up: imports and a valid load are not what a case costs
        cases = {**ABSURD, **(MALFORMED if family == FAMILIES[0] else {})}
        for case, (spoil, expected) in cases.items():
            folder = work / f"{family}-{len(rows)}"
            shutil.copytree(clean, folder)
            spoil(folder)
            before = peak_rss_mb()
            code, seconds = refusal(folder)
            rows.append({"family": family, "case": case, "code": code, "expected": expected,
                         "seconds": round(seconds, 3), "peak_rss_rise_mb": round(peak_rss_mb() - before, 1)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="hostile-"))
    rows = run(work)
    print(f"{'family':<10} {'case':<40} {'code':<26} {'s':>6} {'peak RSS +MB':>12}")
    for row in rows:
        flag = "" if row["code"] == row["expected"] else f"  (expected {row['expected']})"
        print(f"{row['family']:<10} {row['case']:<40} {row['code']:<26} {row['seconds']:>6.3f} "
              f"{row['peak_rss_rise_mb']:>12.1f}{flag}")
    print(json.dumps({"peak_rss_mb": round(peak_rss_mb()), "cases": len(rows)}))


if __name__ == "__main__":
    main()
