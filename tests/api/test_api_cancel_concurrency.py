"""No request holds a database lock past its own life, on a real server over PostgreSQL.

Before: 20 concurrent cancels of one cancelled job hung the API process for every organisation. The no-op branch
returned with the job's row still locked (`SELECT ... FOR UPDATE`), and the route's session was rolled back only
after FastAPI had validated the answer on a second worker thread; the other cancels held every worker thread,
waiting for that lock, so the first never got the thread that would have released it. Its session sat `idle in
transaction`, `/readyz` said ready and not saturated, and SIGTERM did not stop the process.

Here: concurrent cancels answer at once and leave no transaction open; a locked row costs a cancel at most the
lock timeout; PostgreSQL itself ends idle transactions; `/readyz` reports stalled requests; a malformed process
board entry is ignored; SIGTERM stops `draftsmith api` within seconds while its requests are stuck."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from api_harness import Harness, build_harness, make_settings
from live_server import live_server
from services import POSTGRES_ADMIN_URL, inherited_env, start_api, wait_until
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InternalError

from api.deps import Services, release_session
from api.main import create_app
from api.problems import _database_unavailable
from domain.db import SessionTimeouts, create_db_engine, create_session_factory
from domain.models import JobEvent
from domain.settings import Settings

AUDIT = {"drafter": "hf://acme/drafter", "target": {"uri": "bundled:smollm2-135m"}}
BURST = 50


def serve(database_url: str, tmp_path: Path, **overrides) -> tuple[Harness, object]:  # noqa: ANN003
    harness = next(build_harness(make_settings(database_url, tmp_path / "storage", **overrides)))
    app = create_app(harness.settings)
    app.state.services = harness.services
    return harness, app


@pytest.fixture(scope="module")
def admin() -> Iterator[object]:
    engine = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def server(module_postgres_url, tmp_path_factory) -> Iterator[tuple[Harness, str]]:
    # Four worker threads: a burst of 50 outnumbers them many times over, as 20 outnumbered 16 in the report.
    harness, app = serve(module_postgres_url, tmp_path_factory.mktemp("cancels"), api_worker_threads=4,
                         api_queue_timeout_seconds=30, default_max_concurrent_jobs=100_000)
    with live_server(app) as base:
        yield harness, base


def idle_in_transaction(admin, database_url: str) -> list[str]:  # noqa: ANN001
    with admin.connect() as connection:
        return list(connection.scalars(text(
            "SELECT coalesce(query, '') FROM pg_stat_activity "
            "WHERE datname = :name AND state LIKE 'idle in transaction%'"), {"name": make_url(database_url).database}))


@contextmanager
def locked(database_url: str, statement: str) -> Iterator[None]:
    """Hold a lock (`statement`) in a transaction of another connection, as a stuck holder would."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            connection.execute(text(statement))
            try:
                yield
            finally:
                connection.rollback()
    finally:
        engine.dispose()


def create(harness: Harness, kind: str, org) -> str:  # noqa: ANN001
    if kind == "job":
        return harness.create_job(org)["id"]
    response = harness.client.post("/v1/audits", json=AUDIT, headers=org.headers)
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.mark.parametrize("kind", ["job", "audit"])
@pytest.mark.parametrize("already_cancelled", [True, False], ids=["cancelled", "queued"])
def test_concurrent_cancels_answer_at_once_and_leave_no_transaction_open(server, admin, module_postgres_url,
                                                                          kind, already_cancelled):
    harness, base = server
    org = harness.new_org()
    target = create(harness, kind, org)
    other = harness.create_job(org)["id"]
    path = f"/v1/{kind}s/{target}/cancel"
    if already_cancelled:
        assert harness.client.post(path, headers=org.headers).status_code == 200

    async def burst() -> tuple[list[httpx.Response], float, httpx.Response, httpx.Response]:
        limits = httpx.Limits(max_connections=BURST)
        async with httpx.AsyncClient(base_url=base, headers=org.headers, timeout=20, limits=limits) as client:
            started = time.monotonic()
            answers = list(await asyncio.gather(*(client.post(path) for _ in range(BURST))))
            took = time.monotonic() - started
            # The process answers everything else at once afterwards.
            after = await client.get(f"/v1/jobs/{other}", timeout=5)
            ready = await client.get("/readyz", timeout=5)
            return answers, took, after, ready

    answers, took, after, ready = asyncio.run(burst())
    assert [a.status_code for a in answers] == [200] * BURST, {a.status_code: a.text for a in answers}
    assert {a.json()["status"] for a in answers} == {"cancelled"}
    assert took < 15, took  # before: every request hung (read timeouts) behind one idle transaction
    assert after.status_code == 200 and ready.status_code == 200, (after.text, ready.text)
    assert not ready.json()["capacity"]["saturated"] and ready.json()["capacity"]["stalled"] == 0
    assert idle_in_transaction(admin, module_postgres_url) == []
    if kind == "job":  # the queued job was cancelled by exactly one of them
        with harness.services.session_factory() as session:
            changes = session.scalar(select(func.count()).select_from(JobEvent).where(
                JobEvent.job_id == target, JobEvent.type == "job.status_changed"))
        assert changes == 1


def test_a_route_that_raises_with_the_row_locked_leaves_no_transaction_open(server, admin, module_postgres_url):
    """The error branch of a sync route on the session dependency: resume locks the job's row, then refuses a job
    queued moments ago (409). The session is rolled back before the problem is answered, every time."""
    harness, base = server
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base, headers=org.headers, timeout=20,
                                     limits=httpx.Limits(max_connections=BURST)) as client:
            return list(await asyncio.gather(*(client.post(f"/v1/jobs/{job_id}/resume") for _ in range(BURST))))

    started = time.monotonic()
    answers = asyncio.run(burst())
    assert [a.status_code for a in answers] == [409] * BURST, {a.status_code: a.text for a in answers}
    assert time.monotonic() - started < 15
    assert idle_in_transaction(admin, module_postgres_url) == []


@pytest.mark.parametrize("kind", ["job", "audit"])
def test_a_cancel_waits_for_a_locked_row_only_briefly(server, module_postgres_url, kind):
    """A row another transaction keeps locked costs a cancel at most the lock timeout (then 503 with Retry-After),
    and a cancel with nothing to change never waits for the lock at all."""
    harness, base = server
    org = harness.new_org()
    queued, cancelled = create(harness, kind, org), create(harness, kind, org)
    assert harness.client.post(f"/v1/{kind}s/{cancelled}/cancel", headers=org.headers).status_code == 200
    table = f"{kind}s"
    with locked(module_postgres_url, f"SELECT 1 FROM {table} WHERE id IN ('{queued}', '{cancelled}') FOR UPDATE"):
        with httpx.Client(base_url=base, headers=org.headers, timeout=20) as client:
            started = time.monotonic()
            noop = client.post(f"/v1/{kind}s/{cancelled}/cancel")
            noop_took = time.monotonic() - started
            started = time.monotonic()
            refused = client.post(f"/v1/{kind}s/{queued}/cancel")
            refused_took = time.monotonic() - started
    assert noop.status_code == 200 and noop.json()["status"] == "cancelled" and noop_took < 2, noop_took
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0, refused.text
    assert 2 < refused_took < 10, refused_took
    with httpx.Client(base_url=base, headers=org.headers, timeout=20) as client:
        assert client.post(f"/v1/{kind}s/{queued}/cancel").json()["status"] == "cancelled"


def test_readyz_reports_requests_stalled_on_the_database(module_postgres_url, tmp_path):
    harness, app = serve(module_postgres_url, tmp_path, api_worker_threads=2, api_queue_timeout_seconds=30,
                         api_stalled_request_seconds=0.5)
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]

    async def scenario(base: str) -> tuple[httpx.Response, list[int], httpx.Response]:
        async with httpx.AsyncClient(base_url=base, headers=org.headers, timeout=30) as client:
            with locked(module_postgres_url, "LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"):
                stuck = [asyncio.create_task(client.get(f"/v1/jobs/{job_id}")) for _ in range(4)]
                await asyncio.sleep(1.5)
                during = await client.get("/readyz", timeout=5)
            answers = [r.status_code for r in await asyncio.gather(*stuck)]
            return during, answers, await client.get("/readyz", timeout=5)

    with live_server(app) as base:
        during, answers, after = asyncio.run(scenario(base))
    assert during.status_code == 503 and during.json()["type"].endswith("not-ready"), during.text
    capacity = during.json()["capacity"]
    assert capacity["saturated"] and capacity["stalled"] >= 2 and capacity["oldest_in_progress_seconds"] > 0.5
    assert capacity["threads"] == 2 and capacity["threads_busy"] == 2 and capacity["threads_waiting"] >= 1
    assert capacity["database_connections"] == 4 and capacity["database_connections_in_use"] >= 2
    assert during.json()["checks"]["requests"].startswith("stalled: ")
    assert during.json()["checks"]["database"] == "ok"
    assert answers == [200] * 4  # the lock went, and so did the stall
    assert after.status_code == 200 and not after.json()["capacity"]["saturated"], after.text
    assert "requests" not in after.json()["checks"]


def test_a_pool_without_a_free_connection_is_saturated():
    from api.admission import AdmissionState

    state = AdmissionState(capacity=8)
    state.database = lambda: {"in_use": 3, "limit": 4}
    assert not state.report()["saturated"]
    state.database = lambda: {"in_use": 4, "limit": 4}  # the next checkout waits (then 503 after the pool timeout)
    report = state.report()
    assert report["saturated"] and report["database_connections_in_use"] == report["database_connections"] == 4


def test_postgres_connections_carry_the_api_and_worker_timeouts(module_postgres_url, tmp_path):
    settings = make_settings(module_postgres_url, tmp_path, database_statement_timeout_seconds=30,
                             database_idle_in_transaction_timeout_seconds=15,
                             worker_database_statement_timeout_seconds=300)
    services = Services.from_settings(settings)
    # The URL's own options survive next to ours.
    worker = create_db_engine(f"{module_postgres_url}?options=-c%20application_name%3Dworker-test",
                              timeouts=SessionTimeouts.for_worker(settings))
    try:
        with services.engine.connect() as connection:
            assert connection.scalar(text("SHOW statement_timeout")) == "30s"
            assert connection.scalar(text("SHOW idle_in_transaction_session_timeout")) == "15s"
            assert len(services.in_use) == 1  # what the shutdown would interrupt
        assert services.in_use == set()
        with worker.connect() as connection:
            assert connection.scalar(text("SHOW statement_timeout")) == "5min"
            assert connection.scalar(text("SHOW idle_in_transaction_session_timeout")) == "0"  # off for the worker
            assert connection.scalar(text("SHOW application_name")) == "worker-test"
    finally:
        services.close()
        worker.dispose()
    assert SessionTimeouts(0, None).options() == ""


def test_the_database_ends_a_transaction_left_idle_and_the_session_still_closes_quietly(module_postgres_url, admin):
    engine = create_db_engine(module_postgres_url, timeouts=SessionTimeouts(idle_in_transaction_seconds=0.3))
    try:
        session = create_session_factory(engine)()
        session.execute(text("SELECT 1"))  # a transaction is open, and nobody comes back to it
        time.sleep(1.0)
        with pytest.raises(InternalError) as ended:
            session.execute(text("SELECT 1"))
        assert ended.value.orig.sqlstate == "25P03"  # idle_in_transaction_session_timeout
        assert _database_unavailable(ended.value)  # a route that met it answers 503 with Retry-After, not 500
        release_session(session)  # the rollback fails on the closed connection: discarded, no exception
        with engine.connect() as connection:  # the pool hands out working connections again
            assert connection.scalar(text("SELECT 2")) == 2
    finally:
        engine.dispose()


def test_readyz_ignores_process_board_entries_it_cannot_read(sqlite_harness, tmp_path):
    """One malformed file in the process board's folder turned every /readyz into a 500."""
    from api.observability import ProcessBoard

    board_dir = tmp_path / "processes"
    board_dir.mkdir()
    sqlite_harness.client.app.state.process_board = ProcessBoard(str(board_dir), 3)
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(7)]
    try:
        valid, *others = [p.pid for p in sleepers]
        good = {"pid": valid, "slots": 8, "in_progress": 1, "waiting": 0, "saturated": False, "refused_total": 2,
                "unauthenticated_total": 0, "body_timeouts_total": 0, "slow_clients": [], "published_at": time.time()}
        (board_dir / f"{valid}.json").write_text(json.dumps(good))
        malformed = ["{not json", "[1, 2, 3]", json.dumps({"pid": others[2]}),  # fields missing
                     json.dumps({**good, "pid": others[3], "in_progress": "many"}),
                     json.dumps({**good, "pid": 12345}),  # another pid than its name's
                     json.dumps({**good, "pid": others[5], "published_at": "yesterday"})]
        for pid, content in zip(others, malformed, strict=False):
            (board_dir / f"{pid}.json").write_text(content)
        for name in ("0.json", "-1.json", "notapid.json"):
            (board_dir / name).write_text(json.dumps(good))
        answers = [sqlite_harness.client.get("/readyz") for _ in range(2)]
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    for ready in answers:
        assert ready.status_code == 200, ready.text
        processes = ready.json()["processes"]
        assert sorted(p["pid"] for p in processes["reporting"]) == sorted([os.getpid(), valid])
        assert processes["totals"]["refused_total"] == 2 + ready.json()["capacity"]["refused_total"]


def test_draftsmith_api_sets_a_graceful_shutdown_timeout(tmp_path, monkeypatch):
    import uvicorn
    from click.testing import CliRunner

    import api.cli
    from api.observability import PROCESS_COUNT_ENV, PROCESS_DIR_ENV

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(kwargs))
    monkeypatch.setattr("migrations.revisions.require_current_schema", lambda url: None)
    monkeypatch.setenv("DRAFTSMITH_ENV", "development")
    monkeypatch.setenv("DRAFTSMITH_DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite'}")
    monkeypatch.setenv("DRAFTSMITH_API_GRACEFUL_SHUTDOWN_SECONDS", "3")
    for name in (PROCESS_DIR_ENV, PROCESS_COUNT_ENV):  # the command sets them for its workers; restore after
        monkeypatch.setenv(name, "")
    result = CliRunner().invoke(api.cli.api, ["--port", "8765"])
    assert result.exit_code == 0, result.output
    assert seen["timeout_graceful_shutdown"] == 3.0
    assert Settings.model_fields["api_graceful_shutdown_seconds"].default == 10.0


def test_sigterm_stops_draftsmith_api_within_seconds_while_its_requests_are_stuck(module_postgres_url, admin, tmp_path):
    env = {**inherited_env("DRAFTSMITH_"), "DRAFTSMITH_ENV": "development", "DRAFTSMITH_DEV_API_KEY": "dsk_dev_sigterm",
           "DRAFTSMITH_DATABASE_URL": module_postgres_url, "DRAFTSMITH_BROKER_URL": "disabled",
           "DRAFTSMITH_STORAGE_URL": (tmp_path / "storage").resolve().as_uri(),
           "DRAFTSMITH_WEBHOOK_DISPATCH_INTERVAL_SECONDS": "0", "DRAFTSMITH_API_WORKER_THREADS": "2",
           "DRAFTSMITH_API_GRACEFUL_SHUTDOWN_SECONDS": "1", "DRAFTSMITH_API_STALLED_REQUEST_SECONDS": "1",
           "DRAFTSMITH_DATABASE_STATEMENT_TIMEOUT_SECONDS": "120"}  # the stuck statements do not end by themselves
    api, url = start_api(env, tmp_path / "api.log")
    headers = {"Authorization": "Bearer dsk_dev_sigterm"}
    try:
        assert httpx.get(f"{url}/v1/jobs", headers=headers, timeout=10).status_code == 200  # the key exists
        with locked(module_postgres_url, "LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"):
            stuck = [threading.Thread(target=_get_quietly, args=(f"{url}/v1/jobs", headers), daemon=True)
                     for _ in range(4)]
            for thread in stuck:
                thread.start()
            ready = wait_until(lambda: _stalled(url), 15, "/readyz to report stalled requests")
            assert ready.json()["capacity"]["saturated"]
            started = time.monotonic()
            api.process.send_signal(signal.SIGTERM)
            try:
                api.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail(f"draftsmith api still runs 20 s after SIGTERM:\n{api.log()[-3000:]}")
            took = time.monotonic() - started
            assert took < 8, (took, api.log()[-3000:])  # 1 s of grace, then the stuck requests are cancelled
            # ...and their statements with them: none is left waiting for the lock in the database.
            wait_until(lambda: not _waiting_for_locks(admin, module_postgres_url), 5, "the orphaned statements to end")
    finally:
        api.stop(timeout=10)


def _waiting_for_locks(admin, database_url: str) -> list[str]:  # noqa: ANN001
    with admin.connect() as connection:
        return list(connection.scalars(text(
            "SELECT query FROM pg_stat_activity WHERE datname = :name AND wait_event_type = 'Lock'"),
            {"name": make_url(database_url).database}))


def _get_quietly(url: str, headers: dict[str, str]) -> None:
    try:
        httpx.get(url, headers=headers, timeout=30)
    except httpx.HTTPError:
        pass  # the server went away under it: what this test does


def _stalled(url: str) -> httpx.Response | None:
    ready = httpx.get(f"{url}/readyz", timeout=5)
    return ready if ready.status_code == 503 and ready.json()["capacity"]["stalled"] else None
