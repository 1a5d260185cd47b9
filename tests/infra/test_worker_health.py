"""`python -m worker.health`, the worker containers' health check: healthy while a `draftsmith worker` on this host
consumes from the broker, unhealthy before it starts and after it stops. A real worker process, on the embedded
broker and database (no servers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from migrations.revisions import upgrade


def health(env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "worker.health", "--timeout", str(timeout)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_health_follows_the_worker_on_this_host(tmp_path):
    database = f"sqlite:///{tmp_path / 'draftsmith.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")} | {
        "DRAFTSMITH_ENV": "development",
        "DRAFTSMITH_DATABASE_URL": database,
        "DRAFTSMITH_BROKER_URL": "filesystem://",
        "DRAFTSMITH_BROKER_FOLDER": str(tmp_path / "broker"),
        "DRAFTSMITH_STORAGE_URL": (tmp_path / "storage").as_uri(),
        "DRAFTSMITH_WORKER_CACHE_DIR": str(tmp_path / "cache"),
    }
    upgrade(database)
    before = health(env, timeout=1)
    assert before.returncode == 1 and "no draftsmith worker" in before.stderr

    worker = subprocess.Popen([sys.executable, "-m", "draftsmith.cli", "worker", "--queues", "cpu"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            during = health(env, timeout=2)
            if during.returncode == 0 or time.monotonic() > deadline or worker.poll() is not None:
                break
            time.sleep(1)
        assert during.returncode == 0, during.stderr + (worker.stderr.read() if worker.poll() is not None else "")
        assert "answers" in during.stdout
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        worker.stderr.close()
    assert health(env, timeout=1).returncode == 1
