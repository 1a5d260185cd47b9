"""`execute_audit(ctx, audit_id)`: what the Celery task `draftsmith.run_audit` does, as a plain function.

    claim the audit (queued -> running; nothing to do if another worker has it or it is done)
    fetch the target, the drafter and the prompts (worker/sources.py, worker/drafters.py), with a heartbeat
    trainer.audit.run_audit: the function `draftsmith audit` runs locally
    succeeded with the report and recommendation | failed with the error's code and message

A cancellation (POST /v1/audits/{id}/cancel) is seen by the heartbeat; the next progress call of the measurement
(between prompts, batches and draws: seconds apart) raises StageInterrupted, the way a job's validate stage stops
(trainer/pipeline.py), and the audit ends cancelled. A fetch in progress runs to its end first.

A bad input (an unreachable checkpoint, an incompatible drafter, a bad prompts file) fails the audit with a
message naming it. An infrastructure error (database, broker, storage unreachable) leaves the audit running
without a heartbeat: the reaper queues it again (domain/audits.py take_over_stale_audits). The compute and tokens
spent count towards the organisation's usage however it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from domain.audits import (
    acknowledge_audit_cancellation,
    audit_heartbeat,
    claim_audit,
    fail_audit,
    finish_audit,
    record_audit_usage,
)
from domain.files import uploaded_prompts_key
from schemas.audit import AuditResult, AuditSpec
from trainer.errors import DraftsmithError, StageInterrupted
from trainer.targets.adapters import require_base
from worker.context import WorkerContext
from worker.drafters import resolve_drafter
from worker.errors import infrastructure_errors, storage_refusal
from worker.sources import Caller, resolve_prompts, resolve_target

log = logging.getLogger("draftsmith.worker")


class _Heartbeat(threading.Thread):
    """Beats every DRAFTSMITH_WORKER_HEARTBEAT_SECONDS; `stop_requested` once the audit was cancelled or is no
    longer this worker's, which the measurement's progress hook turns into StageInterrupted."""

    def __init__(self, ctx: WorkerContext, audit_id: str):
        super().__init__(name=f"heartbeat-{audit_id}", daemon=True)
        self.ctx, self.audit_id, self.done = ctx, audit_id, threading.Event()
        self.stop_requested = threading.Event()

    def run(self) -> None:
        with self.ctx.session_factory() as session:
            while not self.done.wait(self.ctx.settings.worker_heartbeat_seconds):
                try:
                    if not audit_heartbeat(session, self.audit_id, self.ctx.worker_id):
                        self.stop_requested.set()
                except Exception:  # a blip; the next beat tries again
                    session.rollback()
                    log.warning("heartbeat for audit %s failed", self.audit_id, exc_info=True)

    def check(self, done: int = 0, total: int = 0, detail: str = "") -> None:
        """The measurement's `on_progress`: called between units of work, it is where a cancellation stops it."""
        if self.stop_requested.is_set():
            raise StageInterrupted(f"audit {self.audit_id} stopped on request ({detail or 'between fetches'})")


def execute_audit(ctx: WorkerContext, audit_id: str) -> str:
    from trainer.audit import run_audit

    with ctx.session_factory() as session:
        row = claim_audit(session, audit_id, ctx.worker_id)
        if row is None:
            return "nothing_to_do"
        org_id, stored = row.org_id, row.spec
    spec = AuditSpec.model_validate(stored, context={"allowed_file_roots": ["/"]})  # admitted already
    heartbeat = _Heartbeat(ctx, audit_id)
    heartbeat.start()
    started, tokens, target_revision = time.monotonic(), 0, None
    outcome = "failed"
    try:
        caller = Caller(org_id, ctx.session_factory)  # every fetch is judged for this organisation
        target = resolve_target(spec.target.uri, ctx.settings, ctx.cache, caller=caller,
                                allow_pickle=spec.target.allow_pickle, trust_remote_code=spec.target.trust_remote_code)
        target_revision = target.revision
        require_base(Path(target.path), spec.target.base)  # the adapter's own pointer is never followed
        base = None if spec.target.base is None else resolve_target(  # an adapter target's base, as the target
            spec.target.base, ctx.settings, ctx.cache, caller=caller, allow_pickle=spec.target.allow_pickle,
            trust_remote_code=spec.target.trust_remote_code)
        drafter = resolve_drafter(spec.drafter, ctx, org_id)
        assert spec.data is not None
        with ctx.session_factory() as session:
            uploaded_key = uploaded_prompts_key(session, org_id, spec.data.source)
        prompts = resolve_prompts(spec.data.source, ctx.settings, ctx.cache, caller=caller, count=spec.data.count,
                                  uploaded_key=uploaded_key, storage=ctx.storage)
        heartbeat.check()  # cancelled while the inputs were fetched: load no model
        # An audit has no compute section: it runs where this worker's setting says (trainer/device.py decides).
        report = run_audit(spec, target=target.path, drafter=drafter.path, prompts=prompts.path,
                           on_progress=heartbeat.check, device=ctx.settings.worker_device,
                           base=base.path if base else None, limits=ctx.settings.target_limits)
        result = AuditResult.read(report)  # the measurement's result, or a stand-in's plain object
        result.drafter_revision = drafter.revision
        tokens = result.tokens_generated or 0
        with ctx.session_factory() as session:
            finished = finish_audit(session, audit_id, ctx.worker_id, result, target_revision=target_revision)
        outcome = f"succeeded: {result.action}" if finished else "cancelled or taken over"
    except StageInterrupted:
        with ctx.session_factory() as session:  # not cancelling: taken over by another worker, which goes on
            outcome = "cancelled" if acknowledge_audit_cancellation(session, audit_id, ctx.worker_id) else "busy"
    except DraftsmithError as error:
        _fail(ctx, audit_id, error.code, str(error), target_revision)
    except infrastructure_errors():
        outcome = "interrupted"
        raise  # no heartbeat from here on: the reaper queues the audit again
    except Exception as error:  # a bug, or storage refusing: shown on the audit, not retried
        refusal = storage_refusal(error)
        if refusal is None:
            log.exception("audit %s crashed", audit_id)
        _fail(ctx, audit_id, "storage_error" if refusal else "internal_error",
              refusal or f"{type(error).__name__}: {error}"[:2000], target_revision)
    finally:
        heartbeat.done.set()
        heartbeat.join(timeout=30)
        if outcome != "interrupted":
            try:
                with ctx.session_factory() as session:
                    record_audit_usage(session, audit_id, compute_seconds=round(time.monotonic() - started, 3),
                                       tokens_generated=tokens)
            except Exception:
                log.warning("audit %s: could not record its usage", audit_id, exc_info=True)
    return outcome


def _fail(ctx: WorkerContext, audit_id: str, code: str, message: str, target_revision: str | None) -> None:
    with ctx.session_factory() as session:
        fail_audit(session, audit_id, ctx.worker_id, code=code, message=message, target_revision=target_revision)
