"""`python -m worker.health`: exit 0 when a `draftsmith worker` on this host answers a ping through the broker.

The health check of worker containers (docker-compose.yml, infra/k8s). It proves what a deployer wants to know,
that the worker process is up and consuming from the broker the settings name, and it stays cheap: a bare Celery
client configured exactly as the API's (domain/queue.py), never the task modules (torch). Workers name themselves
`draftsmith-<kinds>-<pid>@<hostname>` (worker/cli.py), so the check looks for a reply from this host's name.

Use it for readiness, not liveness: a broker outage fails it, and a worker must ride out a broker restart
without losing the training it is running (worker/app.py), not be restarted for it.
"""

from __future__ import annotations

import argparse
import socket
import sys

from celery import Celery

from domain.queue import celery_broker_options
from domain.settings import Settings, load_settings


def worker_answers(settings: Settings, hostname: str, timeout: float) -> bool:
    app = Celery("draftsmith-health", set_as_current=False)
    app.conf.update(celery_broker_options(settings))
    try:
        replies = app.control.ping(timeout=timeout)
    finally:
        app.close()
    return any(name.endswith(f"@{hostname}") for reply in replies for name in reply)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.health", description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=5.0, help="Seconds to wait for the reply.")
    args = parser.parse_args(argv)
    hostname = socket.gethostname()
    try:
        alive = worker_answers(load_settings(), hostname, args.timeout)
    except Exception as exc:  # broker unreachable, bad settings: unhealthy, with the reason in the probe's output
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    if not alive:
        print(f"unhealthy: no draftsmith worker on {hostname} answered within {args.timeout} s", file=sys.stderr)
        return 1
    print(f"a draftsmith worker on {hostname} answers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
