"""Load bench for the control plane: latency percentiles and errors of the main read routes at 20, 50
and 100 concurrent clients, and of 50 open SSE streams, against a real server (`draftsmith api`, one
uvicorn process) on PostgreSQL.

    python -m bench.load_api                      # a fresh database on 127.0.0.1:5432, dropped afterwards
    python -m bench.load_api --duration 5 --clients 20,100 --routes job

Two kinds of client, both on their own keep-alive connection:
- *paced* (the service's real traffic: dashboards and CLIs polling a job): one request every
  `--period` seconds (default 1 s), started at random offsets; a request that takes longer than the
  period delays the next one, so a slow server is never hidden by queued-up sends;
- *closed loop* (`--saturate`, think time 0): the next request as soon as the previous answer
  arrives; its latency is concurrency / throughput, so it measures capacity, not responsiveness.

The load generator is a minimal asyncio HTTP/1.1 client so it costs the shared cores little. Errors
are 5xx answers, dropped connections and requests without an answer after `--timeout` seconds.
Prints a markdown table and the machine's load average; no assertions (benchmarks print numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ADMIN_URL = os.environ.get("DRAFTSMITH_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
ROUTES = {
    "job": "/v1/jobs/{job}",
    "list": "/v1/jobs?limit=20",
    "events": "/v1/jobs/{job}/events?limit=100",
    "metrics": "/v1/jobs/{job}/metrics",
}


# --------------------------------------------------------------------------- a minimal HTTP/1.1 client
class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def get(self, path: str, headers: dict[str, str]) -> int:
        """Send one GET and read the whole answer; returns the status. Raises on a dropped connection."""
        if self.writer is None:
            await self._open()
        assert self.reader is not None and self.writer is not None
        lines = [f"GET {path} HTTP/1.1", f"Host: {self.host}:{self.port}"] + [f"{k}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        status, response_headers = await read_head(self.reader)
        if response_headers.get("transfer-encoding") == "chunked":
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            await self.reader.readexactly(int(response_headers.get("content-length", "0")))
        if response_headers.get("connection") == "close":
            self.close()
        return status


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


# --------------------------------------------------------------------------- measurements
@dataclass
class Sample:
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def error_count(self) -> int:
        return sum(self.errors.values()) + sum(n for status, n in self.statuses.items() if status >= 500)


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def run_clients(host: str, port: int, path: str, headers: dict[str, str], clients: int, duration: float,
                      period: float, timeout: float) -> Sample:
    sample = Sample()
    start = time.perf_counter()
    stop_at = start + duration

    async def client() -> None:
        connection = Connection(host, port)
        next_at = start + (random.uniform(0, period) if period else 0)
        while True:
            now = time.perf_counter()
            if next_at > now:
                await asyncio.sleep(next_at - now)
            if time.perf_counter() >= stop_at:
                break
            sent = time.perf_counter()
            try:
                status = await asyncio.wait_for(connection.get(path, headers), timeout)
                sample.latencies.append(time.perf_counter() - sent)
                sample.statuses[status] = sample.statuses.get(status, 0) + 1
            except TimeoutError:
                sample.error("timeout")
                connection.close()
            except (OSError, asyncio.IncompleteReadError, ValueError):
                sample.error("dropped")
                connection.close()
            next_at = max(next_at + period, time.perf_counter()) if period else time.perf_counter()
        connection.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return sample


async def run_sse(host: str, port: int, path: str, headers: dict[str, str], streams: int, duration: float,
                  timeout: float) -> tuple[Sample, list[float], int]:
    """Open `streams` SSE streams; returns connect latencies, event lags (sent -> received) and events seen."""
    connects, lags, seen = Sample(), [], [0]
    stop_at = time.perf_counter() + duration

    async def stream() -> None:
        sent = time.perf_counter()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (OSError, TimeoutError):
            connects.error("connect")
            return
        request = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream"]
        request += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(request) + "\r\n\r\n").encode())
        try:
            status, _ = await asyncio.wait_for(read_head(reader), timeout)
            connects.latencies.append(time.perf_counter() - sent)
            connects.statuses[status] = connects.statuses.get(status, 0) + 1
            while time.perf_counter() < stop_at:
                line = await asyncio.wait_for(reader.readline(), max(0.1, stop_at - time.perf_counter()))
                if not line:
                    connects.error("stream dropped")
                    return
                if line.startswith(b"data: ") and b'"bench_sent"' in line:
                    payload = json.loads(line[6:])
                    lags.append(time.time() - payload["data"]["bench_sent"])
                    seen[0] += 1
        except TimeoutError:
            if time.perf_counter() < stop_at:
                connects.error("timeout")
        except (OSError, asyncio.IncompleteReadError, ValueError):
            connects.error("stream dropped")
        finally:
            writer.close()

    await asyncio.gather(*(stream() for _ in range(streams)))
    return connects, lags, seen[0]


# --------------------------------------------------------------------------- server and data
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_seconds(pid: int) -> float:
    """CPU time of the server: the process and its children (uvicorn's workers), user + system."""
    total, parents = 0.0, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    for candidate, (parent, seconds) in parents.items():
        if candidate == pid or parent == pid:
            total += seconds
    return total


def create_database() -> tuple[str, object]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"draftsmith_bench_{secrets.token_hex(4)}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False), drop


def seed(settings: object, jobs: int) -> tuple[str, str, str]:
    """An organisation with a key, `jobs` queued jobs, one finished job with events and metrics, and one
    job running in `train` (for the SSE streams). Returns (key, finished job id, running job id)."""
    from api.auth import create_api_key
    from domain import runs
    from domain.db import create_db_engine, create_session_factory
    from domain.models import Job, new_id
    from domain.states import STAGE_ORDER, JobStatus, Stage

    engine = create_db_engine(settings.database_url)  # type: ignore[attr-defined]
    factory = create_session_factory(engine)
    spec = {"target": {"uri": "bundled:smollm2-135m"}, "name": "bench", "labels": {"team": "bench"}}
    with factory() as session:
        issued = create_api_key(session, settings, org_name="bench", scopes=["read", "write", "admin"])  # type: ignore[arg-type]
        ids = [new_id("job_") for _ in range(jobs + 2)]
        for job_id in ids:
            session.add(Job(id=job_id, org_id=issued.org_id, status=str(JobStatus.QUEUED), name="bench", spec=spec))
        session.commit()
        finished, running = ids[0], ids[1]
        for stage in STAGE_ORDER:
            runs.claim_stage(session, finished, stage, worker_id="bench")
            for step in range(10):
                runs.record_event(session, finished, f"{stage}: step {step}", progress=step * 10.0)
            if stage is Stage.TRAIN:
                for step in range(300):
                    runs.record_metrics(session, finished, step, {"loss": 3.0 / (step + 1), "lr": 6e-4})
            runs.finish_stage(session, finished, stage)
        for stage in (Stage.PREPARE, Stage.GENERATE):
            runs.claim_stage(session, running, stage, worker_id="bench")
            runs.finish_stage(session, running, stage)
        runs.claim_stage(session, running, Stage.TRAIN, worker_id="bench")
    engine.dispose()
    return issued.plaintext, finished, running


def event_writer(settings: object, job_id: str, stop: threading.Event, interval: float) -> None:
    from domain import runs
    from domain.db import create_db_engine, create_session_factory

    engine = create_db_engine(settings.database_url)  # type: ignore[attr-defined]
    factory = create_session_factory(engine)
    while not stop.wait(interval):
        with factory() as session:
            runs.record_event(session, job_id, "bench tick", data={"bench_sent": time.time()})
    engine.dispose()


# --------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="20,50,100", help="Comma-separated client counts.")
    parser.add_argument("--routes", default=",".join(ROUTES), help=f"Comma-separated, of {', '.join(ROUTES)}.")
    parser.add_argument("--duration", type=float, default=10.0, help="Seconds per measurement.")
    parser.add_argument("--period", type=float, default=1.0, help="Seconds between a paced client's requests.")
    parser.add_argument("--saturate", default="job", help="Routes also run closed loop (think time 0); '' for none.")
    parser.add_argument("--sse-streams", type=int, default=50)
    parser.add_argument("--sse-readers", type=int, default=20, help="Paced GET /v1/jobs/{id} clients during SSE.")
    parser.add_argument("--timeout", type=float, default=40.0, help="A request without an answer by then is an error.")
    parser.add_argument("--database-url", default=None, help="Default: a fresh PostgreSQL database, dropped after.")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (draftsmith api --workers).")
    args = parser.parse_args()

    from domain.settings import Settings
    from migrations.revisions import upgrade

    drop = None
    database_url = args.database_url
    if database_url is None:
        database_url, drop = create_database()
    work = Path(tempfile.mkdtemp(prefix="draftsmith-bench-"))
    env = {
        **os.environ,
        "DRAFTSMITH_ENV": "production",
        "DRAFTSMITH_SECRET_KEY": secrets.token_urlsafe(48),
        "DRAFTSMITH_DATABASE_URL": database_url,
        "DRAFTSMITH_BROKER_URL": "disabled",
        "DRAFTSMITH_STORAGE_URL": (work / "storage").as_uri(),
    }
    settings = Settings(env="production", secret_key=env["DRAFTSMITH_SECRET_KEY"], database_url=database_url,
                        broker_url="disabled", storage_url=env["DRAFTSMITH_STORAGE_URL"])
    server = None
    try:
        upgrade(database_url)
        key, finished, running = seed(settings, jobs=30)
        port = free_port()
        log = (work / "server.log").open("wb")
        server = subprocess.Popen(
            [str(Path(sys.executable).with_name("draftsmith")), "api", "--port", str(port), "--workers", str(args.workers)],
            env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"server did not start; see {work / 'server.log'}") from None
                time.sleep(0.2)
        headers = {"Authorization": f"Bearer {key}"}
        asyncio.run(run_clients("127.0.0.1", port, "/healthz", headers, 5, 1.0, 0.05, args.timeout))  # warm up
        asyncio.run(run_clients("127.0.0.1", port, ROUTES["job"].format(job=finished), headers, 5, 1.0, 0.05,
                                args.timeout))
        print(f"# load bench: {args.workers} uvicorn worker(s), PostgreSQL, {os.cpu_count()} cores; "
              f"load average at start {load_average()}")
        print(f"# paced clients: one request every {args.period:g} s; closed loop: no think time; "
              f"{args.duration:g} s per row; errors = 5xx + dropped + timed out (> {args.timeout:g} s)\n")
        print("| route | clients | mode | requests | req/s | p50 ms | p95 ms | p99 ms | max ms | errors | "
              "non-2xx | server CPU ms/req | load avg |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        clients = [int(c) for c in args.clients.split(",") if c]
        saturate = {r for r in args.saturate.split(",") if r}
        for route in [r for r in args.routes.split(",") if r]:
            path = ROUTES[route].format(job=finished)
            for count in clients:
                for mode, period in [("paced", args.period)] + ([("closed", 0.0)] if route in saturate else []):
                    cpu = cpu_seconds(server.pid)
                    sample = asyncio.run(run_clients("127.0.0.1", port, path, headers, count, args.duration, period,
                                                     args.timeout))
                    print_row(f"GET {ROUTES[route]}", count, mode, sample, args.duration,
                              cpu_seconds(server.pid) - cpu, load_average())
        if args.sse_streams:
            stop = threading.Event()
            writer = threading.Thread(target=event_writer, args=(settings, running, stop, 0.5), daemon=True)
            writer.start()
            cpu = cpu_seconds(server.pid)

            async def both() -> tuple[tuple[Sample, list[float], int], Sample]:
                sse = run_sse("127.0.0.1", port, f"/v1/jobs/{running}/events", headers, args.sse_streams,
                              args.duration, args.timeout)
                readers = run_clients("127.0.0.1", port, ROUTES["job"].format(job=running), headers,
                                      args.sse_readers, args.duration, args.period, args.timeout)
                return await asyncio.gather(sse, readers)

            (connects, lags, seen), readers = asyncio.run(both())
            stop.set()
            writer.join()
            used = cpu_seconds(server.pid) - cpu
            print_row(f"SSE connect ({args.sse_streams} streams)", args.sse_streams, "stream", connects,
                      args.duration, float("nan"), load_average())
            lag = Sample(latencies=lags)
            print_row(f"SSE event lag ({seen} events received)", args.sse_streams, "stream", lag, args.duration,
                      float("nan"), load_average())
            # CPU per GET here includes the streams' polling: the whole phase's CPU over the GETs.
            print_row(f"GET /v1/jobs/{{job}} with {args.sse_streams} streams open", args.sse_readers, "paced",
                      readers, args.duration, used, load_average())
        print(f"\n# load average at end {load_average()}; server log {work / 'server.log'}")
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        if drop is not None:
            drop()  # type: ignore[operator]


def print_row(route: str, clients: int, mode: str, sample: Sample, duration: float, cpu: float, load: str) -> None:
    ms = [value * 1000 for value in sample.latencies]
    non_2xx = {status: n for status, n in sorted(sample.statuses.items()) if not 200 <= status < 300}
    errors = sample.error_count()
    detail = f"{errors} ({', '.join(f'{k} {v}' for k, v in sample.errors.items())})" if sample.errors else str(errors)
    print(f"| {route} | {clients} | {mode} | {len(ms)} | {len(ms) / duration:.0f} | {percentile(ms, 0.5):.1f} | "
          f"{percentile(ms, 0.95):.1f} | {percentile(ms, 0.99):.1f} | {max(ms, default=float('nan')):.1f} | "
          f"{detail} | {non_2xx or '-'} | {'-' if cpu != cpu else f'{cpu * 1000 / max(1, len(ms)):.1f}'} | {load} |",
          flush=True)


if __name__ == "__main__":
    main()
