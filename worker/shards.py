"""One job's generate stage on several workers at once (DRAFTSMITH_WORKER_GENERATE_WORKERS > 1).

The worker that claims the stage (the lead) writes a row per shard (domain/shards.py), asks N - 1 other GPU-queue
workers to help (`draftsmith.generate_shards(job_id)` tasks), and then claims shards itself like any helper.
Every participant claims one shard at a time, generates it, uploads its files and marks it done; a claim keeps
beating while its shard runs, and a claim that stops beating (its worker died) is taken over by whoever asks
next. When nothing is left to claim, a helper returns; the lead waits for the shards others hold (taking over
any that go quiet), fetches them from object storage and completes the data set, and training starts.

The data equal one worker's: a shard is seeded by its index (trainer/data/regenerate.py), whoever writes it.
A helper task that arrives late (the stage already done, or nothing left to claim) does nothing.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from domain import shards as claims_db
from domain.jobs import job_by_id, load_stored_spec
from domain.states import JobStatus
from schemas.stages import Stage
from trainer.errors import DraftsmithError, StageInterrupted
from trainer.pipeline import StageHooks, run_stage
from worker.context import WorkerContext
from worker.job_files import JobFiles, job_run_config, launch_for
from worker.reporting import DRAINING, FLUSH_SECONDS, HeartbeatedWork, JobRecords, StageReporter, draining
from worker.usage import StageUsage

log = logging.getLogger("draftsmith.worker")


SendHelpers = Callable[[str, int], None]
"""Ask `count` other GPU-queue workers to help generate job `job_id` (worker/app.py send_generate_helpers)."""


class ShardClaims(HeartbeatedWork):
    """trainer.data.regenerate.ShardPlan over the database's claims, for the lead (`reporter` given: it reports
    the job's progress summed over every shard, asks for helpers with `send_helpers` and waits for the others) or
    a helper."""

    def __init__(self, ctx: WorkerContext, job_id: str, sync, reporter: StageReporter | None = None,
                 send_helpers: SendHelpers | None = None):
        super().__init__(ctx, f"shards-{job_id}")
        self.ctx, self.job_id, self.sync, self.reporter = ctx, job_id, sync, reporter
        self.send_helpers = send_helpers
        self.records = JobRecords(ctx, job_id, Stage.GENERATE, self.session)
        self.files: list[list[str]] = []  # per shard, its files relative to the job's work folder (begin)
        self._reported_at = 0.0
        self.max_new_tokens = 0  # every prompt's planned response tokens (begin)
        # (shard, prompts done, tokens, fraction of its planned tokens done) being generated here
        self.current: tuple[int, int, int, float] | None = None
        self.written: list[tuple[int, int, float]] = []  # (shard, tokens, seconds) written by this process
        self.stop_reason: str | None = None
        self._shown = 0.0  # the job's progress never goes back, even when a dead worker's partial shard is redone

    def finish(self) -> None:
        if self.current is not None:  # stopped before writing it: free it for another worker now
            try:
                claims_db.release_shard(self.session, self.job_id, self.current[0], self.ctx.worker_id)
            except Exception:
                log.warning("job %s: could not release shard %s", self.job_id, self.current[0], exc_info=True)

    @property
    def tokens_here(self) -> int:
        return sum(tokens for _, tokens, _ in self.written)

    def should_stop(self) -> bool:
        if self.reporter is not None and self.reporter.should_stop():
            return True
        return self.stop_reason is not None

    # --- the ShardPlan --------------------------------------------------------------------------------

    def begin(self, sizes: list[int], files: list[list[Path]], max_new_tokens: int) -> None:
        self.files = [[path.relative_to(self.sync.root).as_posix() for path in paths] for paths in files]
        self.max_new_tokens = max_new_tokens
        if self.reporter is None:
            return
        # The lead: a row per shard (a resumed stage keeps the rows it has), then N - 1 helpers asked to claim.
        claims_db.plan_shards(self.session, self.job_id, sizes)
        helpers = min(self.ctx.settings.worker_generate_workers, len(sizes)) - 1
        self.reporter.event(f"generate: {len(sizes)} shards of up to {max(sizes, default=0)} prompts over up to "
                            f"{helpers + 1} workers",
                            data={"shards": len(sizes), "shard_size": max(sizes, default=0), "workers": helpers + 1})
        if helpers > 0:
            if self.send_helpers is None:
                raise DraftsmithError("this generate stage was asked to lead helpers but was given no way to ask "
                                      "for them (ShardClaims' send_helpers)")
            self.send_helpers(self.job_id, helpers)

    def claims(self, missing: list[int]) -> Iterator[int]:
        stale = self.ctx.settings.worker_stale_after_seconds
        while True:
            if self.should_stop():
                raise StageInterrupted(f"generation stopped on request ({self.stop_reason or 'the stage ended'}); "
                                       "written shards are kept")
            claim = claims_db.claim_shard(self.session, self.job_id, self.ctx.worker_id, stale)
            if claim is not None:
                if claim.taken_from:
                    self._event(f"shard {claim.shard}: {claim.taken_from} went quiet; {self.ctx.worker_id} "
                                f"generates it again (attempt {claim.attempt})", level="warning",
                                data={"shard": claim.shard, "taken_from": claim.taken_from, "attempt": claim.attempt})
                if self._already_written(claim.shard, missing):
                    continue
                self.current = (claim.shard, 0, 0, 0.0)
                yield claim.shard
                continue
            rows = claims_db.shard_rows(self.session, self.job_id)
            if self.reporter is None or all(row.status == claims_db.DONE for row in rows):
                return
            self._report(rows)
            time.sleep(min(self.ctx.settings.worker_heartbeat_seconds, 2.0))

    def progress(self, shard: int, prompts: int, tokens: int, fraction: float) -> None:
        self.current = (shard, prompts, tokens, fraction)
        # The lead sums every shard's progress from the database: at most once per FLUSH_SECONDS (regenerate calls
        # this between decode steps too, so it moves while a long batch runs and as other workers finish shards).
        if self.reporter is not None and time.monotonic() - self._reported_at >= FLUSH_SECONDS:
            self._report(claims_db.shard_rows(self.session, self.job_id))

    def generated(self, shard: int, prompts: int, tokens: int, seconds: float) -> None:
        claims_db.finish_shard(self.session, self.job_id, shard, self.ctx.worker_id, prompts=prompts, tokens=tokens,
                               seconds=round(seconds, 3))
        self.current = None
        self.written.append((shard, tokens, seconds))
        rate = tokens / seconds if seconds > 0 else 0.0
        self._event(f"shard {shard} generated by {self.ctx.worker_id}: {prompts} prompts, {tokens} tokens in "
                    f"{seconds:.1f} s ({rate:.0f} tok/s)",
                    data={"shard": shard, "worker_id": self.ctx.worker_id, "prompts": prompts, "tokens": tokens,
                          "seconds": round(seconds, 3), "tokens_per_s": round(rate, 1)})

    def gather(self, missing: list[int]) -> bool:
        if self.reporter is None:
            return False
        self.sync.pull(*(name for shard in missing for name in self.files[shard]))
        return True

    # --- the lead's view ------------------------------------------------------------------------------

    def throughput_event(self) -> None:
        """Per-worker throughput over the whole stage, from the shards' rows."""
        per_worker: dict[str, dict] = defaultdict(lambda: {"shards": 0, "tokens": 0, "seconds": 0.0})
        for row in claims_db.shard_rows(self.session, self.job_id):
            if row.status == claims_db.DONE and row.worker_id:
                entry = per_worker[row.worker_id]
                entry["shards"] += 1
                entry["tokens"] += row.tokens
                entry["seconds"] += row.seconds or 0.0
        for entry in per_worker.values():
            entry["seconds"] = round(entry["seconds"], 3)
            entry["tokens_per_s"] = round(entry["tokens"] / entry["seconds"], 1) if entry["seconds"] else None
        summary = "; ".join(f"{worker}: {e['shards']} shards, {e['tokens']} tokens, {e['tokens_per_s']} tok/s"
                            for worker, e in sorted(per_worker.items()))
        self._event(f"generate: {len(per_worker)} workers wrote the shards ({summary})",
                    data={"workers": dict(per_worker)})

    def _report(self, rows: list[claims_db.ShardRow]) -> None:
        """The job's progress summed over its shards, each weighed by its prompts (every prompt plans the same
        tokens): a shard written (here or elsewhere) counts whole, the one generating here its exact fraction of
        planned tokens, one another worker holds what its heartbeat last wrote (finished batches' prompts, or
        its response tokens against the planned ones, whichever says more: both undercount, never overcount)."""
        total = sum(row.prompts for row in rows) or 1
        done = tokens = 0
        share = 0.0  # prompts' worth of planned tokens done
        current = self.current
        for row in rows:
            if row.status == claims_db.DONE:
                done, tokens, share = done + row.prompts, tokens + row.tokens, share + row.prompts
            elif current is not None and row.shard == current[0]:
                done, tokens, share = done + current[1], tokens + current[2], share + row.prompts * current[3]
            else:
                planned = row.prompts * self.max_new_tokens
                share += max(row.prompts_done, row.prompts * row.tokens / planned if planned else 0.0)
                done, tokens = done + row.prompts_done, tokens + row.tokens
        whole = sum(row.status == claims_db.DONE for row in rows)
        workers = len({row.worker_id for row in rows if row.worker_id and row.status != claims_db.PENDING})
        self._shown, self._reported_at = max(self._shown, min(share / total, 1.0)), time.monotonic()
        self.reporter.progress(Stage.GENERATE, self._shown, f"{done}/{total} prompts, {tokens} tokens; {whole} of "
                               f"{len(rows)} shards whole, {workers} workers")

    def _already_written(self, shard: int, missing: list[int]) -> bool:
        """A claimed shard whose files exist here or in storage (its writer died before marking it done)."""
        *_, marker = self.files[shard]
        if shard in missing and not self.sync.has(marker):
            return False
        if shard not in missing:  # whole on this machine: make sure storage has it too
            for name in self.files[shard]:
                if (self.sync.root / name).is_file():
                    self.sync.push(self.sync.root / name)
        row = next(r for r in claims_db.shard_rows(self.session, self.job_id) if r.shard == shard)
        claims_db.finish_shard(self.session, self.job_id, shard, self.ctx.worker_id, prompts=row.prompts,
                               tokens=row.tokens, seconds=row.seconds or 0.0)
        return True

    def _event(self, message: str, *, level: str = "info", data: dict | None = None) -> None:
        self.records.event(message, level=level, data=data)

    def beat(self, session) -> None:
        if draining(self.ctx):
            self.stop_reason = self.stop_reason or DRAINING
        if (current := self.current) is not None:  # a claim taken over meanwhile is finished anyway: same shard
            claims_db.shard_heartbeat(session, self.job_id, current[0], self.ctx.worker_id, current[1], current[2])
        if self.reporter is None and self.records.cancellation_requested(session):
            self.stop_reason = "cancellation requested"  # (the lead's reporter polls its own)


def help_generate(ctx: WorkerContext, job_id: str) -> str:
    """The `draftsmith.generate_shards(job_id)` task: claim and write the job's shards until none is left to claim."""
    with ctx.session_factory() as session:
        job = job_by_id(session, job_id, detach=True)  # read below, after the session closed
        rows = claims_db.shard_rows(session, job_id) if job is not None else []
        if job is None or job.status != JobStatus.GENERATING or all(r.status == claims_db.DONE for r in rows):
            return "nothing_to_do"
    files = JobFiles(ctx, job_id)
    files.sync.pull("sources.json", "prepare.json")
    spec = load_stored_spec(job.spec)
    with StageUsage(ctx, job, Stage.GENERATE) as usage, ShardClaims(ctx, job_id, files.sync) as shards:
        try:
            config = job_run_config(ctx, job, spec, files, None, pin=False, should_stop=shards.should_stop)
            hooks = StageHooks(should_stop=shards.should_stop, on_saved=files.sync.push, shards=shards)
            run_stage(Stage.GENERATE, config, files.layout, hooks, launch_for(ctx.settings))
        except StageInterrupted as stopped:
            log.info("job %s: helper stopped: %s", job_id, stopped)
            return "stopped"
        except DraftsmithError as error:  # the lead meets the same error and fails the job with it
            log.warning("job %s: helper gave up: %s", job_id, error)
            return "failed"
        finally:
            usage.tokens_from({"response_tokens": shards.tokens_here})
    return f"wrote {len(shards.written)} shards"
