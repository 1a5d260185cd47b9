"""The engine step of validation: the drafter measured in the engines users serve with, as exported.

For each engine found on this machine (trainer/validation/engine_paths.py; an absent one is skipped with a line
saying how to install it), a few held-out prompts are decoded greedily, batch 1, by the target alone, by the
engine's own training-free n-gram drafter (the baseline a drafter must beat) and with the drafter:
- llama.cpp (`llama-server`, trainer/validation/engine_llama_cpp.py), on the Q4_1 GGUF the bundled target ships as
  (when the target is a bundled one) and on an f16 GGUF of the target made by llama.cpp's own converter; the
  drafter as the d2t GGUF (its own head over the draft vocabulary) over a grid of `--spec-draft-n-max` and
  `--spec-draft-p-min`, and the full-head GGUF at the grid's best setting;
- vLLM's CPU build (offline `LLM`, trainer/validation/vllm_driver.py, in vLLM's own environment), which loads
  a DFlash (v1) drafter (`drafter-d2t/`, else `drafter/`); a DFlash 2 drafter is recorded as refused, with
  vLLM's reason (its V1 model runner, the only one without Triton, has no DFlash 2 candidate head).

Each row records τ as the engine counts it, tokens/s, the ratio to the same engine's target alone, whether
the greedy output equals the engine's own target-alone output token for token (speculation in that engine
is lossless) and our float32 target's (the engine computes the same model), and the exact command. The
step is bounded: ENGINE_PROMPTS prompts of ENGINE_MAX_NEW_TOKENS tokens, a small grid, per-run time limits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trainer.atomic import atomic_path
from trainer.errors import StageInterrupted
from trainer.validation import engine_paths
from trainer.validation.engine_llama_cpp import NGRAM_SIZE_M, NGRAM_SIZE_N, LlamaRun, run_server

ENGINES = ("llama.cpp", "vllm")
ENGINE_PROMPTS = 4
"""Held-out prompts each engine decodes (the first ones of validation's, one per category)."""
ENGINE_MAX_NEW_TOKENS = 64
DRAFT_LENGTHS = (2, 3, 7)
"""llama.cpp `--spec-draft-n-max` values tried (clipped to the drafter's block size - 1)."""
P_MINS = (0.0, 0.5)
"""llama.cpp `--spec-draft-p-min` values tried (its docs warn that 0 lets unlikely drafts through)."""
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
BUDGET_S = 900
"""Wall-clock bound of the whole engine step: runs not started by then are skipped, vLLM is stopped at it (about
4-5 minutes on an idle 2-core machine for a DFlash 2 job: 18 llama.cpp servers and 3 vLLM engines)."""
CONTEXT = 2048


def engine_threads() -> int:
    """Threads each engine gets: every core on an idle machine, one on a busy one. Both engines' CPU threads
    spin while they wait for each other, so more threads than free cores is ruinous (measured here at load 9
    on 2 cores: llama.cpp's Q4_1 target alone ran 0.66 tokens/s with 2 threads, 6.5 with 1)."""
    cores = os.cpu_count() or 1
    return cores if os.getloadavg()[0] < 0.5 else max(1, cores - round(os.getloadavg()[0]))


ADAPTER_SKIP = ("every engine: the target is a LoRA adapter merged into its base in memory, and the engines load a "
                "model folder (which holds the base alone); hand over the merged model to measure them")


def _adapter_skipped(target, section: dict) -> bool:
    """A LoRA adapter target's folder is its base: an engine loading it would measure the base, without the adapter."""
    if getattr(target, "adapter_path", None) is None:
        return False
    section["skipped"].append(ADAPTER_SKIP)
    return True


def first_difference(got: list[int], expected: list[int]) -> int | None:
    """First position where two greedy outputs differ (None: identical)."""
    if got == expected:
        return None
    return next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))


def normalise(tokens: list[int], stop: set[int], limit: int) -> list[int]:
    """An engine's output as comparable tokens: up to the first stop token (excluded), at most `limit`."""
    out = []
    for token in tokens[:limit]:
        if token in stop:
            break
        out.append(token)
    return out


def compare(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    firsts = [first_difference(a, b) for a, b in zip(outputs, reference, strict=True)]
    return {"equal": sum(f is None for f in firsts), "of": len(firsts),
            "first_difference": next(({"prompt": i, "position": f} for i, f in enumerate(firsts) if f is not None),
                                     None)}


def bundled_gguf(target) -> Path | None:
    """The quantised GGUF a bundled target was materialised from (trainer/targets/bundled.py), else None."""
    from schemas.job_spec import BUNDLED_TABLE
    from trainer.targets.bundled import COMPLETE_MARKER, bundled_gguf_path

    marker = Path(target.path) / COMPLETE_MARKER if target.path else None
    if marker is None or not marker.is_file():
        return None
    name = marker.read_text().strip()
    for bundled, entry in BUNDLED_TABLE.items():
        if entry.filename == name:
            try:
                return bundled_gguf_path(bundled)
            except Exception:
                return None
    return None


def f16_target_gguf(target, out: Path) -> Path:
    """An f16 GGUF of the target, by llama.cpp's own converter (cached in `out`)."""
    if out.is_file():
        return out
    converter = engine_paths.llama_cpp_converter()
    if converter is None:
        raise FileNotFoundError("llama.cpp's convert_hf_to_gguf.py is not installed (bench/setup/llama_cpp.sh)")
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(converter / "gguf-py"), str(converter)])}
    with atomic_path(out) as partial:  # fsynced and renamed (trainer/atomic.py)
        subprocess.run([sys.executable, str(converter / "convert_hf_to_gguf.py"), str(target.path), "--outtype",
                        "f16", "--outfile", str(partial)], env=env, check=True, capture_output=True, timeout=600)
    return out


def llama_cpp_runs(bin_dir: Path, targets: dict[str, Path], drafters: dict[str, Path], block_size: int,
                   prompts: list[list[int]], max_tokens: int, log_dir: Path,
                   names: dict[Path, str] | None = None, threads: int = 1,
                   draft_lengths: tuple[int, ...] = DRAFT_LENGTHS, p_mins: tuple[float, ...] = P_MINS,
                   deadline: float = float("inf"), should_stop: Callable[[], bool] = lambda: False) -> list[dict]:
    """Per target GGUF: alone, n-gram, the first drafter over the grid, the others at the grid's best.
    `names`: how the commands name the files (e.g. relative to the export). `should_stop` is asked before
    every run (each is one short server life): True raises StageInterrupted."""
    lengths = sorted({min(n, block_size - 1) for n in draft_lengths})
    rows = []
    for target_name, target_gguf in targets.items():
        def run(name, **kw):
            spec = LlamaRun(f"{target_name}-{name}", target_gguf, **kw)
            if should_stop():
                raise StageInterrupted("validation stopped on request (the engine step, in llama.cpp)")
            if time.monotonic() > deadline:
                rows.append({"name": spec.name, "spec": spec.spec, "target": target_name, "n_max": spec.n_max,
                             "p_min": spec.p_min, "error": "not run: the engine step's time was spent"})
                return rows[-1]
            result = run_server(bin_dir, spec, prompts, max_tokens, threads=threads, ctx=CONTEXT, log_dir=log_dir)
            result.update(target=target_name, drafter=kw.get("draft_gguf") and kw["draft_gguf"].name,
                          command=spec.command(threads, CONTEXT, names))
            rows.append(result)
            return result

        run("alone")
        run(f"ngram-n{NGRAM_SIZE_N}-m{NGRAM_SIZE_M}", spec="ngram-simple")
        (first, first_gguf), *others = drafters.items()
        grid = [run(f"{first}-n{n}-p{p}", spec="draft-dflash", draft_gguf=first_gguf, n_max=n, p_min=p)
                for n in lengths for p in p_mins]
        scored = [r for r in grid if r.get("tokens_per_s")]
        if scored:
            best = max(scored, key=lambda r: r["tokens_per_s"])
            for name, gguf in others:
                run(f"{name}-n{best['n_max']}-p{best['p_min']}", spec="draft-dflash", draft_gguf=gguf,
                    n_max=best["n_max"], p_min=best["p_min"])
    return rows


def vllm_runs(python: Path, target, drafter_folder: Path, num_speculative_tokens: int, prompts: list[list[int]],
              max_tokens: int, work: Path, threads: int, baselines: bool = True, timeout: float = BUDGET_S,
              should_stop: Callable[[], bool] = lambda: False) -> dict:
    import json

    job = {"target": str(target.path), "prompts": prompts, "max_tokens": max_tokens, "dtype": "float32",
           "max_model_len": CONTEXT, "runs": [
               *([{"name": "alone", "speculative_config": None}, {"name": "ngram", "speculative_config": VLLM_NGRAM}]
                 if baselines else []),
               {"name": f"dflash-{drafter_folder.name}-k{num_speculative_tokens}", "speculative_config": {
                   "method": "dflash", "model": str(drafter_folder), "num_speculative_tokens": num_speculative_tokens}},
           ]}
    work.mkdir(parents=True, exist_ok=True)
    (work / "vllm-job.json").write_text(json.dumps(job))
    result_file = work / "vllm-result.json"
    result_file.unlink(missing_ok=True)
    # vLLM binds its worker's threads to cores and keeps one core free by default; unbound, with as many
    # threads as llama.cpp gets, it shares a busy machine instead of waiting on a core someone else holds.
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "OMP_NUM_THREADS": str(threads)}
    driver = Path(__file__).with_name("vllm_driver.py")
    with open(work / "vllm.log", "wb") as log:
        driver_process = subprocess.Popen([str(python), str(driver), str(work / "vllm-job.json"), str(result_file)],
                                          env=env, stdout=log, stderr=subprocess.STDOUT)
        ends = time.monotonic() + max(60.0, timeout)
        try:  # polled, so a cancel stops it within a second; past its time, what finished is in the result file
            while driver_process.poll() is None and time.monotonic() < ends:
                if should_stop():
                    raise StageInterrupted("validation stopped on request (the engine step, in vLLM)")
                time.sleep(1.0)
        finally:
            if driver_process.poll() is None:
                driver_process.kill()
                driver_process.wait()
    if not result_file.is_file():
        tail = (work / "vllm.log").read_text(errors="replace")[-1500:]
        return {"error": f"vLLM produced no result; log tail: {tail}", "runs": []}
    result = json.loads(result_file.read_text())
    done = {run["name"] for run in result["runs"]}
    result["runs"] += [{"name": run["name"], "speculative_config": run["speculative_config"], "command": "",
                        "error": f"not finished within the engine step's time ({timeout:.0f} s left for vLLM)"}
                       for run in job["runs"] if run["name"] not in done]
    return result


def _row(engine: str, run: dict, alone: dict | None, outputs, engine_reference, ours, reason: str | None) -> dict:
    """A summary row: what the engine measured, and whether its greedy output is the target's."""
    row = {key: run.get(key) for key in ("name", "target", "drafter", "spec", "n_max", "p_min", "tau",
                                         "tokens_per_target_step", "tokens_per_s", "command")}
    row["engine"] = engine
    if "refused" in run or "error" in run:
        row["refused" if "refused" in run else "error"] = run.get("refused") or run.get("error")
        return row
    if alone and alone.get("tokens_per_s") and run.get("tokens_per_s"):
        row["ratio"] = round(run["tokens_per_s"] / alone["tokens_per_s"], 3)
    row["greedy_equals_engine_target"] = compare(outputs, engine_reference) if engine_reference else None
    row["greedy_equals_reference_target"] = compare(outputs, ours)
    if row["greedy_equals_reference_target"]["equal"] < len(ours) and reason:
        row["why_not_reference"] = reason
    return row


def _export_for_engines(target, drafter_dir: Path, export_dir: Path, wanted: tuple[str, ...],
                        section: dict) -> tuple[str, ...]:
    """Exports the drafter as `draftsmith export` would; returns the engines still to run (llama.cpp needs a GGUF,
    which a family without one, or a tokenizer llama.cpp cannot name, does not get)."""
    from trainer.drafter.checkpoint import load_drafter
    from trainer.export.artifacts import write_engine_drafters

    drafter = load_drafter(drafter_dir)
    no_gguf = write_engine_drafters(drafter_dir, drafter.draft_vocab, target, export_dir, ggufs=("q8_0",))
    if no_gguf and "llama.cpp" in wanted:
        section["skipped"].append(f"llama.cpp: no GGUF of this drafter ({no_gguf})")
        return tuple(e for e in wanted if e != "llama.cpp")
    return wanted


def run_engines(target, drafter_dir: Path, prompts: list[list[int]], reference_tokens: list[list[int]], *,
                work_dir: Path, engines: tuple[str, ...] | None = None, max_new_tokens: int = ENGINE_MAX_NEW_TOKENS,
                num_speculative_tokens: int | None = None, export_dir: Path | None = None,
                llama_targets: tuple[str, ...] = ("quantised", "f16"), draft_lengths: tuple[int, ...] = DRAFT_LENGTHS,
                p_mins: tuple[float, ...] = P_MINS, vllm_baselines: bool = True, budget_s: float = BUDGET_S,
                should_stop: Callable[[], bool] = lambda: False) -> dict:
    """The `engines` section of report.json. `prompts`: rendered token ids; `reference_tokens`: our float32
    target's greedy output for each (at `max_new_tokens`). `export_dir`: an export to run as is (else the drafter
    is exported into work_dir first, as `draftsmith export` would). `engines`: which to run (None: those found)."""
    from trainer.drafter.checkpoint import load_drafter
    from trainer.export.drafter_d2t import D2T_DIR, REFERENCE_DIR
    from trainer.export.model_card import D2T_GGUF

    started, load_before = time.perf_counter(), os.getloadavg()[0]
    deadline = time.monotonic() + budget_s
    wanted = ENGINES if engines is None else tuple(engines)
    threads = engine_threads()
    section: dict = {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "threads": threads,
                     "decoding": "greedy, batch 1, one untimed warm-up request per run", "skipped": [], "rows": []}
    if not wanted or _adapter_skipped(target, section):
        return section
    found = {"llama.cpp": engine_paths.llama_cpp_bin(), "vllm": engine_paths.vllm_python()}
    for engine in wanted:
        if found.get(engine) is None:
            section["skipped"].append(engine_paths.missing(engine))
    if all(found.get(e) is None for e in wanted):
        return section
    work_dir = Path(work_dir)
    if export_dir is None:
        export_dir = work_dir / "export"
        wanted = _export_for_engines(target, Path(drafter_dir), export_dir, wanted, section)
    config = load_drafter(export_dir / REFERENCE_DIR).config
    has_d2t = (export_dir / D2T_DIR / "config.json").is_file()
    stop = set(target.stop_token_ids())
    ours = [normalise(t, stop, max_new_tokens) for t in reference_tokens]
    block = config.block_size
    k = num_speculative_tokens or (config.recommended_block_size or block) - 1

    if "llama.cpp" in wanted and found["llama.cpp"] is not None:
        targets: dict[str, Path] = {}
        quantised = bundled_gguf(target) if "quantised" in llama_targets else None
        if quantised is not None:
            targets[quantised.stem.rsplit(".", 1)[-1].lower()] = quantised  # e.g. q4_1
        try:
            if "f16" in llama_targets:
                targets["f16"] = f16_target_gguf(target, work_dir / "target-f16.gguf")
        except (OSError, subprocess.SubprocessError) as exc:
            section["skipped"].append(f"llama.cpp f16 target: could not convert the target ({exc})")
        drafters = {"d2t": export_dir / D2T_GGUF} if has_d2t else {}
        drafters["full-head"] = export_dir / "gguf" / "drafter-q8_0.gguf"
        names = {path: f"./{path.relative_to(export_dir)}" for path in drafters.values()}
        names.update({path: f"target-{name}.gguf" for name, path in targets.items()})
        runs = llama_cpp_runs(found["llama.cpp"], targets, drafters, block, prompts, max_new_tokens,
                              work_dir / "llama-cpp-logs", names, threads, draft_lengths, p_mins, deadline,
                              should_stop)
        reasons = {"f16": "the engine's target is not the float32 reference: f16 weights, and llama.cpp's CPU "
                          "matmuls round activations to f16 for f16 weights",
                   "q4_1": "the engine's target is not the float32 reference: 4-bit (Q4_1) weights, and "
                           "llama.cpp's CPU matmuls quantise activations to 8 bits for them"}
        for target_name in targets:
            group = [r for r in runs if r["target"] == target_name]
            alone = next(r for r in group if r["spec"] == "none")
            alone_tokens = [normalise(t, stop, max_new_tokens) for t in alone.get("tokens", [])] or None
            for run in group:
                outputs = [normalise(t, stop, max_new_tokens) for t in run.get("tokens", [])]
                section["rows"].append(_row("llama.cpp", run, alone, outputs,
                                            alone_tokens if run is not alone else None, ours, reasons.get(target_name)))

    if "vllm" in wanted and found["vllm"] is not None:
        folder = export_dir / (D2T_DIR if has_d2t and config.variant == "dflash" else REFERENCE_DIR)
        result = vllm_runs(found["vllm"], target, folder, k, prompts, max_new_tokens, work_dir / "vllm", threads,
                           vllm_baselines, deadline - time.monotonic(), should_stop)
        section["vllm"] = {"version": result.get("vllm_version"), "folder": f"./{folder.name}",
                           "environment": f"VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS={threads} "
                                          "VLLM_CPU_KVCACHE_SPACE=1"}
        if result.get("error"):
            section["skipped"].append(f"vllm: {result['error']}")
        alone = next((r for r in result["runs"] if r["name"] == "alone" and "tokens" in r), None)
        for run in result["runs"]:
            run["spec"] = (run.get("speculative_config") or {}).get("method", "none")
            if "seconds" in run:
                run["tokens_per_s"] = round(sum(len(t) for t in run["tokens"]) / sum(run["seconds"]), 2)
                if run.get("drafts"):  # vLLM's mean acceptance length: over the steps that drafted
                    run["tau"] = round(1 + run["accepted_tokens"] / run["drafts"], 4)
                generated = sum(len(t) for t in run["tokens"])
                run["tokens_per_target_step"] = round(generated / max(1, generated - run.get("accepted_tokens", 0)), 4)
            run["target"] = "float32"
            run["drafter"] = folder.name if run["name"].startswith("dflash") else None
            run["command"] = run["command"].replace(str(folder), f"./{folder.name}").replace(
                str(target.path), "TARGET")
            outputs = [normalise(t, stop, max_new_tokens) for t in run.get("tokens", [])]
            alone_tokens = [normalise(t, stop, max_new_tokens) for t in alone["tokens"]] if alone else None
            section["rows"].append(_row("vllm", run, alone, outputs, alone_tokens if run is not alone else None, ours,
                                        "vLLM's CPU kernels (oneDNN matmuls, its own attention) sum in another "
                                        "order than torch's"))
    section["seconds"] = round(time.perf_counter() - started, 1)
    section["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return section


def engine_step(target, drafter_dir: Path, prompts: list, params, *, work_dir: Path | None = None,
                engines: tuple[str, ...] | None = None, num_prompts: int = ENGINE_PROMPTS,
                max_new_tokens: int = ENGINE_MAX_NEW_TOKENS, num_speculative_tokens: int | None = None,
                export_dir: Path | None = None, should_stop: Callable[[], bool] = lambda: False, **options) -> dict:
    """Validation's engine step on held-out `prompts` (trainer.data.prompts.Prompt): renders them with the job's
    chat template, decodes them with our float32 target as the reference, and runs `run_engines`."""
    from trainer.speculative import SpeculativeDecoder
    from trainer.validation import served_prompt_ids

    found = {"llama.cpp": engine_paths.llama_cpp_bin(), "vllm": engine_paths.vllm_python()}
    wanted = ENGINES if engines is None else tuple(engines)
    if not any(found.get(e) for e in wanted):
        return {"skipped": [engine_paths.missing(e) for e in wanted if e in found], "rows": []}
    if getattr(target, "adapter_path", None) is not None:  # its folder is the base (see `_adapter_skipped`)
        return {"skipped": [ADAPTER_SKIP], "rows": []}
    greedy = params.model_copy(update={"temperature": 0.0, "max_new_tokens": max_new_tokens})
    rendered = served_prompt_ids(target, prompts[:num_prompts], greedy)
    plain = SpeculativeDecoder(target)
    reference = [plain.generate(ids, greedy).tokens for ids in rendered]
    with tempfile.TemporaryDirectory(prefix="draftsmith-engines-") as scratch:
        section = run_engines(target, drafter_dir, rendered, reference, work_dir=Path(work_dir or scratch),
                              engines=engines, max_new_tokens=max_new_tokens,
                              num_speculative_tokens=num_speculative_tokens, export_dir=export_dir,
                              should_stop=should_stop, **options)
    section["prompt_ids"] = [p.id for p in prompts[:num_prompts]]
    return section
