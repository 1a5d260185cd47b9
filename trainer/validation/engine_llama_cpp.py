"""llama.cpp as validation runs it: `llama-server` in a subprocess, one server per setting, greedy requests of
token ids, figures read from its own answers and log.

One run = one server (`-m TARGET [-md DRAFTER --spec-type draft-dflash --spec-draft-n-max N
--spec-draft-p-min P | --spec-type ngram-simple ...]`) decoding every prompt once, batch 1, after one untimed
warm-up request. The server's speculative settings are fixed at start (its per-request ones are compiled
out in this version), hence a server per setting. What is recorded, per run:
- tokens (`return_tokens`), decode tokens/s (`timings.predicted_n / predicted_ms`, prompt excluded);
- τ as llama.cpp counts it: the log line `draft acceptance = R ( A accepted / G generated), mean len = M`
  per request, where M = 1 + A / (verify steps with a draft); summed over requests as 1 + ΣA / Σsteps. With
  `--spec-draft-p-min` a cycle may draft nothing and run a plain step, which M leaves out, so
  `tokens_per_target_step` (= tokens / (tokens - accepted)) is recorded beside it.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ACCEPTANCE = re.compile(r"draft acceptance = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\), mean len =\s*([\d.]+)")
NGRAM_SIZE_N, NGRAM_SIZE_M = 2, 4
"""llama.cpp's n-gram drafter as close to vLLM's baseline (prompt_lookup_min 2, 4 tokens) as it goes."""


@dataclass(frozen=True)
class LlamaRun:
    name: str
    target_gguf: Path
    spec: str = "none"
    """none, draft-dflash or ngram-simple."""
    draft_gguf: Path | None = None
    n_max: int | None = None
    p_min: float | None = None

    def args(self, threads: int, ctx: int) -> list[str]:
        args = ["-m", str(self.target_gguf), "-t", str(threads), "-c", str(ctx), "-np", "1", "--temp", "0"]
        if self.spec == "draft-dflash":
            args += ["-md", str(self.draft_gguf), "--spec-type", "draft-dflash", "--spec-draft-n-max", str(self.n_max),
                     "--spec-draft-p-min", str(self.p_min), "-td", str(threads)]
        elif self.spec == "ngram-simple":
            args += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(NGRAM_SIZE_N),
                     "--spec-ngram-simple-size-m", str(NGRAM_SIZE_M)]
        return args

    def command(self, threads: int, ctx: int, names: dict[Path, str] | None = None) -> str:
        """The server command as a user types it (file names through `names`, e.g. relative to an export)."""
        names = names or {}
        return " ".join(["llama-server", *(names.get(Path(a), a) for a in self.args(threads, ctx))])


def parse_acceptance(log: str) -> tuple[int, int, int]:
    """(accepted, generated, verify steps with a draft) summed over the log's per-request acceptance lines."""
    accepted = generated = steps = 0
    for a, g, mean in ACCEPTANCE.findall(log):
        a, g, mean = int(a), int(g), float(mean)
        accepted, generated = accepted + a, generated + g
        steps += round(a / (mean - 1.0)) if mean > 1.0 else (1 if g else 0)
    return accepted, generated, steps


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def run_server(bin_dir: Path, run: LlamaRun, prompts: list[list[int]], max_tokens: int, *, threads: int = 2,
               ctx: int = 2048, log_dir: Path, timeout: float = 300.0) -> dict:
    """Decode `prompts` greedily with one llama-server; return the run's figures (or its `error`)."""
    port = _free_port()
    log_path = Path(log_dir) / f"{run.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    out = {"name": run.name, "spec": run.spec, "n_max": run.n_max, "p_min": run.p_min,
           "command": run.command(threads, ctx)}
    deadline = time.monotonic() + timeout
    with open(log_path, "wb") as log:
        server = subprocess.Popen([str(bin_dir / "llama-server"), *run.args(threads, ctx), "--host", "127.0.0.1",
                                   "--port", str(port), "--no-webui"], stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:  # ready when /health answers 200
                if server.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {server.returncode} before it was ready")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("llama-server was not ready in time")
                time.sleep(0.2)
            body = {"n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                    "return_tokens": True, "seed": 0}
            _post(port, {**body, "prompt": prompts[0], "n_predict": 8}, timeout)  # warm-up, untimed
            time.sleep(0.5)  # llama.cpp logs from its own thread: let the warm-up's lines land first
            warmup_log_end = log_path.stat().st_size
            tokens, predicted, predicted_ms = [], 0, 0.0
            for ids in prompts:
                answer = _post(port, {**body, "prompt": ids}, max(1.0, deadline - time.monotonic()))
                tokens.append(list(answer["tokens"]))
                predicted += answer["timings"]["predicted_n"]
                predicted_ms += answer["timings"]["predicted_ms"]
            time.sleep(0.5)
        except Exception as exc:  # the run is recorded as failed, with the server's own words
            out["error"] = f"{type(exc).__name__}: {exc}; log tail: " + log_path.read_text(errors="replace")[-1500:]
            return out
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    text = log_path.read_text(errors="replace")
    accepted, generated, steps = parse_acceptance(text[warmup_log_end:])
    out.update(tokens=tokens, tokens_per_s=round(predicted / (predicted_ms / 1000.0), 2) if predicted_ms else None,
               generated_tokens=predicted, draft_tokens=generated, accepted_tokens=accepted, verify_steps=steps,
               tau=round(1.0 + accepted / steps, 4) if steps else (1.0 if run.spec != "none" else None),
               tokens_per_target_step=round(predicted / max(1, predicted - accepted), 4) if run.spec != "none"
               else 1.0)
    return out
