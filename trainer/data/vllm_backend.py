"""vLLM as the generate stage's response backend (`--backend vllm`, DRAFTSMITH_WORKER_GENERATE_BACKEND=vllm).

vLLM's CPU build lives in its own environment (bench/setup/vllm_cpu.sh, found by
trainer/validation/engine_paths.py), so it runs as one persistent driver process for the whole stage
(trainer/data/vllm_generate_driver.py): the model loads once, then every shard is one JSON request on the
driver's stdin and one JSON line of results on its stdout. vLLM only writes the responses; the target then
reads each prompt + response once, teacher-forced (trainer/data/capture.py), for the stored hidden states and
teacher signal, so the data set has the same form whichever engine answered.

A request is one shard, answered by one `LLM.generate`, which nothing can interrupt from outside. So while it
runs, `respond` waits on the driver's reply in short slices and asks its `should_stop` between them: a
cancellation kills the driver (and the engine it forked) within a second or so and raises StageInterrupted;
the shards already written are kept. The requests themselves are what they always were (a whole shard, its
per-prompt seeds), so the responses do not depend on whether anyone asked.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from schemas.sampling import SamplingParams
from trainer.errors import DraftsmithError, StageInterrupted
from trainer.validation import engine_paths

MAX_MODEL_LEN = 8192
"""vLLM reserves KV cache for max_model_len up front: the target's context, capped here (a long-context target
would otherwise need tens of GiB for one sequence). Longer prompts are refused by name in `respond`."""
KV_CACHE_GIB = 4
"""VLLM_CPU_KVCACHE_SPACE unless the environment sets it: room for many sequences at once on a small target."""
SEED_MODULUS = 2**63
DRIVER = Path(__file__).with_name("vllm_generate_driver.py")
WAIT_SLICE_SECONDS = 0.25
"""While the engine answers, how long `respond` waits on it between two `should_stop` calls (which rate-limit
themselves, trainer/data/regenerate.py StopPoll)."""


class EngineMissing(DraftsmithError):
    code = "engine_missing"


class EngineFailed(DraftsmithError):
    code = "engine_failed"


def prompt_seeds(seed: int, count: int) -> list[int]:
    """One seed per prompt of a request: a shard's seed alone would give every prompt the same random stream."""
    return [(seed * 1_000_003 + i) % SEED_MODULUS for i in range(count)]


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for `max_lora_rank` (its LoRAConfig): an adapter of rank r needs the smallest above it."""


def lora_max_rank(adapter_dir: Path) -> int:
    """vLLM's `max_lora_rank` for the peft adapter in `adapter_dir` (its adapter_config.json's `r`)."""
    from trainer.targets.adapters import ADAPTER_CONFIG

    rank = int(json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text())["r"])
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise EngineFailed(f"the adapter's LoRA rank r={rank} exceeds the largest vLLM serves "
                       f"({VLLM_LORA_RANKS[-1]}); use the builtin generate backend")


class VllmResponses:
    """A `ResponseBackend` (trainer/data/regenerate.py): the target's responses, sampled by vLLM.

    `seconds` and `tokens` add up vLLM's generation time (as the driver times `LLM.generate`, prompt processing
    included) and the response tokens it wrote, for benches and stage summaries."""

    name = "vllm"

    def __init__(self, target, *, max_model_len: int | None = None, threads: int | None = None,
                 log_path: str | Path | None = None, tensor_parallel_size: int = 1):
        if target.path is None:
            raise EngineFailed("vLLM loads the target from its folder; this target was built in memory")
        self.target = target
        self.max_model_len = max_model_len or min(target.config.max_position_embeddings, MAX_MODEL_LEN)
        # The built-in loop's thread count: both engines run one at a time (regenerate waits on vLLM, then
        # captures), so vLLM gets what the target would have used, and the bench compares like with like.
        if threads is None:
            import torch

            threads = torch.get_num_threads()
        self.threads = threads
        self.log_path = Path(log_path) if log_path else None
        # GPUs vLLM shards the target's heads over: trainer/targets/placement.py tensor_parallel_size, from the
        # same plan that splits a target too large for one GPU; 1 on the CPU.
        self.tensor_parallel_size = tensor_parallel_size
        self.stop_token_ids = list(target.stop_token_ids())
        self.seconds, self.tokens, self.vllm_version = 0.0, 0, None
        self._process: subprocess.Popen | None = None
        self._log = None
        self._own_log = False

    def __enter__(self) -> VllmResponses:
        python = engine_paths.vllm_python()
        if python is None:
            raise EngineMissing(f"the vllm generate backend needs vLLM, which is not installed here: install it with "
                                f"`{engine_paths.SETUP['vllm']}` or set {engine_paths.VLLM_PYTHON_ENV}, or use the "
                                "builtin backend")
        if self.log_path is None:  # a log of our own, removed after a clean stage; kept (and named) on failure
            handle, name = tempfile.mkstemp(prefix="draftsmith-vllm-", suffix=".log")
            os.close(handle)
            self.log_path, self._own_log = Path(name), True
        self._log = open(self.log_path, "wb")
        # Unbound threads (as validation's engine step): bound, vLLM keeps a core free and waits on a core that
        # someone else may hold on a shared machine.
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_GIB)),
               "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(self.threads)}
        config = self.driver_config()
        # A session of its own: vLLM forks an engine process, and a kill on exit must reach it too.
        self._process = subprocess.Popen([str(python), str(DRIVER), json.dumps(config)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._log, env=env, text=True,
                                         start_new_session=True)
        try:
            ready = self._receive("starting")
        except BaseException:
            self._stop(timeout=0)
            raise
        self.vllm_version = ready.get("vllm_version")
        return self

    def driver_config(self) -> dict:
        """What the driver builds its `LLM` from (trainer/data/vllm_generate_driver.py CONFIG). A target handed
        over as a LoRA adapter is served unmerged, as vLLM serves adapters: the base's folder plus the adapter's,
        applied to every request."""
        config = {"target": str(self.target.path), "dtype": "float32", "max_model_len": self.max_model_len,
                  "tensor_parallel_size": self.tensor_parallel_size}
        adapter = getattr(self.target, "adapter_path", None)
        if adapter is not None:
            config["lora"] = {"path": str(adapter), "max_rank": lora_max_rank(adapter)}
        return config

    def __exit__(self, exc_type, *exc) -> None:
        self._stop(timeout=60)
        stopped = exc_type is not None and issubclass(exc_type, StageInterrupted)  # a cancel: nothing to look into
        if (exc_type is None or stopped) and self._own_log:
            self.log_path.unlink(missing_ok=True)

    def respond(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int, *,
                should_stop: Callable[[], bool] | None = None) -> list[tuple[list[int], str]]:
        if self._process is None:
            raise EngineFailed("VllmResponses is used outside its `with` block")
        if not prompt_ids:
            return []
        longest = max(len(ids) for ids in prompt_ids)
        if longest + params.max_new_tokens > self.max_model_len:
            raise EngineFailed(f"a prompt of {longest} tokens with max_new_tokens {params.max_new_tokens} exceeds the "
                               f"vLLM engine's max_model_len {self.max_model_len}; lower max_new_tokens or use the "
                               "builtin generate backend")
        request = {"prompts": prompt_ids, "seeds": prompt_seeds(seed, len(prompt_ids)),
                   "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
                   "max_tokens": params.max_new_tokens, "stop_token_ids": self.stop_token_ids}
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            pass  # the driver is gone; _receive reports why
        self._wait_for_reply(should_stop)
        result = self._receive("generating")
        tokens, finish = result["tokens"], result["finish"]
        if len(tokens) != len(prompt_ids) or len(finish) != len(prompt_ids):
            raise EngineFailed(f"vLLM answered {len(tokens)} of {len(prompt_ids)} prompts")
        self.seconds += result["seconds"]
        self.tokens += sum(len(t) for t in tokens)
        return list(zip(tokens, finish, strict=True))

    def _wait_for_reply(self, should_stop: Callable[[], bool] | None) -> None:
        """Until the driver's reply (or its end) can be read, ask `should_stop` every WAIT_SLICE_SECONDS; True
        kills the driver mid-request and raises StageInterrupted."""
        if should_stop is None:
            return
        started = time.monotonic()
        while not select.select([self._process.stdout], [], [], WAIT_SLICE_SECONDS)[0]:
            if should_stop():
                self._stop(timeout=0)
                raise StageInterrupted(f"generation stopped on request while vLLM answered (after "
                                       f"{time.monotonic() - started:.1f} s); finished shards are kept and the "
                                       "stage resumes from them")

    def _receive(self, doing: str) -> dict:
        line = self._process.stdout.readline()
        if not line:
            self._process.wait()
            raise EngineFailed(f"vLLM's driver exited (status {self._process.returncode}) while {doing}; "
                               f"log {self.log_path}: {self._log_tail()}")
        message = json.loads(line)
        if "error" in message:
            raise EngineFailed(f"vLLM failed while {doing}: {message['error'][-1500:]} (log {self.log_path})")
        return message

    def _log_tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-1500:]

    def _stop(self, timeout: float) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.stdin.close()  # end of requests: the driver shuts its engine down and exits
        except BrokenPipeError:
            pass
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        # The engine process the driver forked may outlive it; the driver's own session holds only those two.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        process.stdout.close()
        self._log.close()
