"""Real servers for tests, started on free loopback ports and stopped afterwards: a fresh PostgreSQL database
(on the machine's server), a private `redis-server` (so a test may restart it), a `moto_server` S3, and
Draftsmith's own processes (`draftsmith api`, `draftsmith worker`) with their logs kept for assertions."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

POSTGRES_ADMIN_URL = os.environ.get("DRAFTSMITH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def inherited_env(*prefixes: str) -> dict[str, str]:
    """This process's environment for a child process (a worker, `draftsmith serve`), without the variables that
    start with `prefixes` (the project's own settings, so the child sees only those a test gives it), except
    the engines' folder: tests/conftest.py points it at an empty one so a job's validate stage finds no serving
    engine outside tests/engines/, on a machine that has them as on CI."""
    from trainer.validation.engine_paths import ENGINES_DIR_ENV

    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes) or k == ENGINES_DIR_ENV}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def fresh_postgres_database(prefix: str) -> tuple[str, Callable[[], None]]:
    """Create a uniquely named database; return its URL and a function that drops it."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{secrets.token_hex(6)}"
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001 - report any connection problem the same way
        admin.dispose()
        raise RuntimeError(
            f"PostgreSQL at {POSTGRES_ADMIN_URL} is not usable ({exc}); start it, point "
            "DRAFTSMITH_TEST_POSTGRES_URL elsewhere, or set DRAFTSMITH_TEST_SKIP_POSTGRES=1"
        ) from exc
    url = make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)

    def drop() -> None:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


@contextmanager
def moto_server(*, check_credentials: bool = False, bind: str = "127.0.0.1") -> Iterator[str]:
    """A `moto_server` (S3) on a free port; yields its endpoint URL (on 127.0.0.1). With `check_credentials` it
    authenticates every request (moto's IAM mode), so unknown keys are refused as real S3 refuses them. `bind`:
    the address it listens on; "::" is every interface, IPv4 and IPv6 (link-local included)."""
    port = free_port()
    env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if check_credentials else {})}
    # The pinned moto of this environment, not whatever `moto_server` happens to be first on PATH
    # (an older one there ignores response-content-disposition on presigned GETs).
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", bind, "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    endpoint = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError("moto_server exited")
        try:
            httpx.get(endpoint, timeout=1)
            return True
        except httpx.HTTPError:
            return False

    try:
        wait_until(answers, 20, "moto_server")
        yield endpoint
    finally:
        process.terminate()
        process.wait(timeout=10)


class RedisServer:
    """A private redis-server (never the machine's shared one), restartable on the same port."""

    def __init__(self, directory: Path):
        self.port, self.directory = free_port(), directory
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        wait_until(lambda: _pings(redis.Redis(port=self.port, socket_timeout=1)), 10, "redis-server")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001 - not up yet
        return False


class DraftsmithProcess:
    """`draftsmith <args>` in its own process group, output to a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log_file: Path):
        self.log_file = log_file
        self._log = log_file.open("ab")
        self.process = subprocess.Popen([sys.executable, "-m", "draftsmith.cli", *args], env=env,
                                        stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def wait_ready(self, url: str, timeout: float = 90) -> None:
        """Until the server at `url` answers /readyz with 200; fails with its log if the process dies first."""
        import httpx

        def ready() -> bool:
            assert self.alive(), self.log()[-3000:]
            try:
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout, f"draftsmith {self.process.args[3]}")

    def kill(self) -> None:
        """SIGKILL the whole process group: the worker and every process it started, with no chance to clean up."""
        self._signal(signal.SIGKILL)

    def terminate_main(self) -> None:
        """SIGTERM to the main process only, as Kubernetes and systemd stop a container or unit."""
        self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30) -> None:
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
        self._log.close()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL:
            self.process.wait(timeout=30)


def start_api(env: dict[str, str], log_file: Path) -> tuple[DraftsmithProcess, str]:
    port = free_port()
    api = DraftsmithProcess(["api", "--port", str(port)], env, log_file)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if not api.alive():
            raise RuntimeError(f"draftsmith api exited:\n{api.log()[-3000:]}")
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, 60, "draftsmith api")
    return api, url
