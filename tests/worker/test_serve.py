"""The embedded default: `draftsmith serve` runs the API and a worker on SQLite, local storage and a broker
that needs no server; `draftsmith submit --wait --download` drives a job to verified artifacts over HTTP."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from services import DraftsmithProcess, free_port, inherited_env, wait_until
from worker_harness import tiny_spec

from schemas.manifest import verify_manifest
from worker.cli import WORKER_STOP_SECONDS

pytestmark = pytest.mark.slow
KEY = "dsk_dev_embedded_test_key"


def _worker_processes_of(data_dir: Path) -> list[int]:
    """Pids of live processes whose environment names this data directory (the serve's worker)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if str(data_dir).encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


def test_serve_runs_a_submitted_job_to_verified_artifacts(tmp_path, models):
    data_dir, port = tmp_path / "data", free_port()
    env = {**inherited_env("DRAFTSMITH_"),
           "DRAFTSMITH_ALLOWED_FILE_ROOTS": str(models), "DRAFTSMITH_DEV_API_KEY": KEY}
    server = DraftsmithProcess(["serve", "--port", str(port), "--data-dir", str(data_dir)], env, tmp_path / "serve.log")
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(url)
        assert f"serving at {url}" in server.log() and f"API key (development): {KEY}" in server.log()
        assert f"try: draftsmith submit --url {url} --api-key {KEY} --target" in server.log()  # works as printed
        spec = tmp_path / "job.json"
        spec.write_text(json.dumps(tiny_spec(f"file://{models}/bpe")))
        submit = subprocess.run(
            [sys.executable, "-m", "draftsmith.cli", "submit", "--url", url, "--api-key", KEY, "--spec", str(spec),
             "--wait", "--download", str(tmp_path / "artifacts")],
            capture_output=True, text=True, timeout=600, env=env)
        assert submit.returncode == 0, submit.stderr[-3000:] + server.log()[-3000:]
        job_id = submit.stdout.strip().splitlines()[-1]
        assert re.fullmatch(r"job_[0-9A-Z]{26}", job_id)
        assert "train" in submit.stderr and "100.0%" in submit.stderr  # the progress fed by the event stream
        summary = json.loads(submit.stderr[submit.stderr.index('{\n  "id"'):].split("\n}\n")[0] + "\n}")
        assert summary["lossless_passed"] is True and summary["tau"] >= 1.0 and summary["speedup"] > 0
        assert verify_manifest(tmp_path / "artifacts") == []
        assert (tmp_path / "artifacts" / "gguf" / "drafter-q8_0.gguf").is_file()
        # Everything lives under the data directory: database, broker messages, storage, worker cache.
        assert (data_dir / "draftsmith.db").is_file()
        assert (data_dir / "storage" / "jobs" / job_id / "artifacts" / "manifest.json").is_file()

        failing = subprocess.run(
            [sys.executable, "-m", "draftsmith.cli", "submit", "--url", url, "--api-key", KEY,
             "--target", f"file://{models}/missing", "--wait"], capture_output=True, text=True, timeout=300, env=env)
        assert failing.returncode == 1 and "target_not_found" in failing.stderr
        failed_id = failing.stderr.split()[1]  # "job <id> queued"
        resumed = subprocess.run(  # `draftsmith resume` takes it up again (and it fails again: still no target)
            [sys.executable, "-m", "draftsmith.cli", "resume", failed_id, "--url", url, "--api-key", KEY, "--wait"],
            capture_output=True, text=True, timeout=300, env=env)
        assert resumed.returncode == 1 and f"job {failed_id}" in resumed.stderr, resumed.stderr[-2000:]
        assert "target_not_found" in resumed.stderr
    finally:
        # More than serve's own grace for its worker: killing serve inside it would orphan the worker.
        server.stop(timeout=WORKER_STOP_SECONDS + 30)
    try:
        wait_until(lambda: not _worker_processes_of(data_dir), 60, "the worker to exit with serve")
    except TimeoutError as exc:  # name what is still running, and what the worker last logged
        left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                for pid in _worker_processes_of(data_dir) if Path(f"/proc/{pid}").exists()}
        raise AssertionError(f"{exc}: still running {left}\n{server.log()[-3000:]}") from None


def test_submit_to_an_unreachable_server_says_so_in_one_line():
    import socket

    from click.testing import CliRunner

    from draftsmith.submit import submit

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = CliRunner().invoke(submit, ["--url", f"http://127.0.0.1:{port}", "--api-key", "dsk_x",
                                         "--target", "bundled:smollm2-135m"])
    assert result.exit_code == 1
    assert f"cannot reach the Draftsmith server at http://127.0.0.1:{port}" in result.output
    assert "draftsmith serve" in result.output and "Traceback" not in result.output


def test_serve_exits_on_sigterm_while_submit_wait_holds_its_event_stream(tmp_path, models):
    """`submit --wait` holds the job's event stream open until the job ends, and uvicorn waits on open responses
    when told to stop: serve ignored SIGTERM for as long as the job trained. Now the stream is cut after
    DRAFTSMITH_API_GRACEFUL_SHUTDOWN_SECONDS, serve stops its worker and exits, and submit says the server is gone."""
    data_dir, port = tmp_path / "data", free_port()
    env = {**inherited_env("DRAFTSMITH_"), "DRAFTSMITH_ALLOWED_FILE_ROOTS": str(models), "DRAFTSMITH_DEV_API_KEY": KEY,
           "DRAFTSMITH_API_GRACEFUL_SHUTDOWN_SECONDS": "1"}
    server = DraftsmithProcess(["serve", "--port", str(port), "--data-dir", str(data_dir)], env, tmp_path / "serve.log")
    url = f"http://127.0.0.1:{port}"
    spec = tmp_path / "job.json"
    # Far more training than the test lasts: the job, and so its stream, would outlive any wait below.
    spec.write_text(json.dumps(tiny_spec(f"file://{models}/bpe", training={"max_steps": 1_000_000})))
    submit = None
    try:
        server.wait_ready(url)
        with (tmp_path / "submit.log").open("wb") as submit_log:
            submit = subprocess.Popen(
                [sys.executable, "-m", "draftsmith.cli", "submit", "--url", url, "--api-key", KEY, "--spec", str(spec),
                 "--wait"], stdout=submit_log, stderr=subprocess.STDOUT, env=env)
        wait_until(lambda: re.search(r"GET /v1/jobs/job_\w+/events HTTP/1\.1\" 200", server.log()), 120,
                   "submit --wait to open the job's event stream")

        server.terminate_main()  # as systemd or a container runtime stops it: the main process only

        try:
            server.process.wait(timeout=WORKER_STOP_SECONDS + 60)  # the worker's grace and then some
        except subprocess.TimeoutExpired:
            raise AssertionError(f"serve ignored SIGTERM with a stream open:\n{server.log()[-3000:]}") from None
        assert submit.wait(timeout=60) == 1  # its stream was cut: it exits, it does not hang
        assert "cannot reach the Draftsmith server" in (tmp_path / "submit.log").read_text()
    finally:
        if submit is not None and submit.poll() is None:
            submit.kill()
        server.stop(timeout=WORKER_STOP_SECONDS + 30)
    wait_until(lambda: not _worker_processes_of(data_dir), 60, "the worker to exit with serve")
