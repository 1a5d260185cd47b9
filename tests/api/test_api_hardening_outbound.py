"""Issue 13, what leaves or escapes the process: webhook targets judged by what they resolve to (at
registration and at every delivery, connecting to the checked address), allowed roots compared after
resolving symlinks, and no secret in logs, events or problem bodies."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import httpx
import pytest
from api_harness import build_harness, make_settings
from test_api_webhooks import Receiver

import domain.egress as egress
from domain.deliveries import dispatch_due_webhooks
from domain.models import utcnow
from schemas.bounds import resolved_path_within_roots


def loopback_names_in_etc_hosts() -> list[str]:
    """Names the system resolver maps to loopback without DNS (e.g. the machine's own name), minus localhost."""
    names = []
    try:
        lines = Path("/etc/hosts").read_text().splitlines()
    except OSError:
        return names
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if len(fields) > 1 and (fields[0].startswith("127.") or fields[0] == "::1"):
            names += [n for n in fields[1:] if n != "localhost" and not n.endswith(".localhost")]
    return names[:2]


@pytest.fixture
def stub_dns(monkeypatch):
    """A resolver under the test's control; every lookup is recorded (to prove there is no second one)."""
    table: dict[str, list[str]] = {}
    lookups: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        lookups.append(host)
        if host not in table:
            raise OSError("no such host")
        return table[host]

    monkeypatch.setattr(egress, "resolver", resolve)
    return table, lookups


@pytest.fixture
def strict_harness(database_url, tmp_path):
    """Production default: private webhook targets refused."""
    yield from build_harness(make_settings(database_url, tmp_path / "storage", egress_allowed_networks=[]))


@pytest.mark.parametrize("url", ["http://hooks.rebind.example/x", "http://2130706433/x", "http://127.1/x",
                                 "http://[::ffff:127.0.0.1]/x", "http://0x7f000001/x", "http://[::1]:8080/x",
                                 "http://169.254.169.254/latest/meta-data", "http://metadata.example/x",
                                 "http://mixed.example/x", "http://nowhere.invalid/x",
                                 *(f"http://{name}:9/x" for name in loopback_names_in_etc_hosts())])
def test_registration_refuses_hosts_that_resolve_inward(strict_harness, stub_dns, monkeypatch, url):
    table, _ = stub_dns
    table.update({"hooks.rebind.example": ["127.0.0.1"], "metadata.example": ["169.254.169.254"],
                  "mixed.example": ["93.184.216.34", "10.1.2.3"]})
    real_names = set(loopback_names_in_etc_hosts()) | {"2130706433", "127.1", "0x7f000001"}
    if any(f"//{name}" in url for name in real_names):
        monkeypatch.setattr(egress, "resolver", egress.system_resolver)  # /etc/hosts, inet_aton forms
    org = strict_harness.new_org()
    before = strict_harness.row_counts()
    response = strict_harness.client.post("/v1/webhooks", headers=org.headers, json={"url": url})
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "url"
    assert any(word in response.json()["detail"] for word in ("loopback", "private", "metadata", "resolve", "IPv4")), url
    assert strict_harness.row_counts() == before


def test_delivery_rechecks_and_pins_the_address(strict_harness, stub_dns, receiver):
    """Registered while public, then the name is rebound to 127.0.0.1: the delivery is refused and nothing
    reaches the loopback receiver. Rebound back: the delivery goes to exactly the address that was checked."""
    table, lookups = stub_dns
    port = receiver.url.split(":")[2].split("/")[0]
    table["hooks.rebind.example"] = ["93.184.216.34"]
    org = strict_harness.new_org()
    created = strict_harness.client.post("/v1/webhooks", headers=org.headers, json={
        "url": f"http://hooks.rebind.example:{port}/hooks", "events": ["job.cancelled"]})
    assert created.status_code == 201, created.text
    table["hooks.rebind.example"] = ["127.0.0.1"]  # DNS rebinding
    job_id = strict_harness.create_job(org)["id"]
    strict_harness.client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers)
    factory, settings = strict_harness.services.session_factory, strict_harness.settings
    now = utcnow()
    assert dispatch_due_webhooks(factory, settings, now=now) >= 1  # (the database is shared with other tests)
    assert receiver.requests == []
    (delivery,) = strict_harness.client.get(f"/v1/webhooks/{created.json()['id']}/deliveries",
                                            headers=org.headers).json()["data"]
    assert delivery["status"] == "pending" and "loopback" in delivery["attempts"][0]["error"]

    # Pinning, shown where private targets are allowed: one lookup per attempt, the connection goes to the
    # checked address, and the URL's host travels in the Host header.
    allowed = settings.model_copy(update={"egress_allowed_networks": ["127.0.0.0/8"]})
    lookups.clear()
    assert dispatch_due_webhooks(factory, allowed, now=now + timedelta(seconds=60)) >= 1
    assert lookups.count("hooks.rebind.example") == 1
    (request,) = receiver.requests
    assert request["headers"]["host"] == f"hooks.rebind.example:{port}"
    strict_harness.client.delete(f"/v1/webhooks/{created.json()['id']}", headers=org.headers)


def test_redirects_are_not_followed(harness):
    hits: list[str] = []

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            hits.append(self.path)
            self.send_response(307 if self.path == "/hook" else 204)
            self.send_header("location", "/inner")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        org = harness.new_org()
        hook = harness.client.post("/v1/webhooks", headers=org.headers, json={
            "url": f"http://127.0.0.1:{server.server_address[1]}/hook", "events": ["job.cancelled"]}).json()
        job_id = harness.create_job(org)["id"]
        harness.client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers)
        dispatch_due_webhooks(harness.services.session_factory, harness.settings, now=utcnow())
    finally:
        server.shutdown()
        server.server_close()
    assert hits == ["/hook"]  # the redirect target was never requested
    (delivery,) = harness.client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=org.headers).json()["data"]
    assert delivery["attempts"][0]["status_code"] == 307 and not delivery["attempts"][0]["succeeded"]
    harness.client.delete(f"/v1/webhooks/{hook['id']}", headers=org.headers)  # no retry left pending


def test_metadata_and_multicast_refused_even_where_private_targets_are_allowed():
    import ipaddress

    private = egress.EgressPolicy(allowed_networks=tuple(ipaddress.ip_network(n) for n in (
        "127.0.0.0/8", "10.0.0.0/8", "169.254.0.0/16", "fd00::/8", "fc00::/7")))
    for url in ("http://169.254.169.254/x", "http://[fd00:ec2::254]/x", "http://224.0.0.1/x", "http://0.0.0.0/x",
                "http://[::ffff:169.254.169.254]/x"):
        with pytest.raises(egress.EgressRefused):
            private.check_url(url)
    assert private.check_url("http://127.0.0.1:9/x").address == "127.0.0.1"


@pytest.fixture
def roots(tmp_path):
    root = tmp_path / "models"
    (root / "acme-8b").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside, target_is_directory=True)
    (root / "alias").symlink_to(root / "acme-8b", target_is_directory=True)
    return root, outside


def test_symlink_escaping_an_allowed_root_is_refused(database_url, tmp_path, roots):
    root, outside = roots
    for harness in build_harness(make_settings(database_url, tmp_path / "storage", allowed_file_roots=[str(root)])):
        org = harness.new_org()
        before = harness.row_counts()
        for body, field in (({"target": {"uri": f"file://{root}/escape/model"}}, "target.uri"),
                            ({"target": {"uri": f"file://{root}/acme-8b"}, "data": {"source": f"file://{root}/escape"}},
                             "data.source")):
            response = harness.client.post("/v1/jobs", json=body, headers=org.headers)
            assert response.status_code == 422, response.text
            error = response.json()["errors"][0]
            assert error["field"] == field and "symbolic link" in error["message"]
        assert harness.row_counts() == before
        inside = harness.client.post("/v1/jobs", json={"target": {"uri": f"file://{root}/alias"}}, headers=org.headers)
        assert inside.status_code == 201, inside.text  # a link that stays inside is fine


def test_resolved_path_within_roots(roots):
    root, outside = roots
    assert resolved_path_within_roots(f"{root}/acme-8b/config.json", [str(root)])
    assert resolved_path_within_roots(f"{root}/alias", [str(root)])
    assert resolved_path_within_roots(f"{root}/not-yet-created/x", [str(root)])
    assert not resolved_path_within_roots(f"{root}/escape", [str(root)])
    assert not resolved_path_within_roots(f"{root}/escape/x", [str(root)])
    assert not resolved_path_within_roots(f"{root}/../outside", [str(root)])
    assert not resolved_path_within_roots(f"{root}X", [str(root)])
    assert resolved_path_within_roots(f"{outside}/x", [f"{root}/escape"])  # a root that is itself a link


def test_local_storage_keys_cannot_escape_through_a_symlink(sqlite_harness, tmp_path):
    storage = sqlite_harness.services.storage
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    storage.root.mkdir(parents=True, exist_ok=True)
    (storage.root / "jobs").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match="escapes"):
        storage.put_bytes("jobs/job_X/artifacts/model.bin", b"x")
    assert list(outside.iterdir()) == []


def test_no_secret_in_logs_events_or_problems(database_url, tmp_path, caplog, receiver):
    """Keys, webhook secrets, organisation secrets and a broker password go through a real server (the access
    log included), a failed insert of a webhook secret, failed deliveries and a dead broker; none of them is
    in any log record, event or problem body afterwards."""
    from fastapi.testclient import TestClient
    from live_server import live_server
    from sqlalchemy import create_engine, text

    from api.main import create_app
    from domain.models import JobEvent

    caplog.set_level(logging.DEBUG)
    broker_password = "brokerpw-" + os.urandom(8).hex()
    settings = make_settings(database_url, tmp_path / "storage",
                             broker_url=f"redis://:{broker_password}@127.0.0.1:1/0")
    app = create_app(settings)
    secrets_seen: list[str] = [broker_password]
    bodies: list[str] = []
    with TestClient(app) as setup, live_server(app) as base:
        from api_harness import Harness

        from api.deps import services_for

        harness = Harness(client=setup, services=services_for(app), runner=None)  # type: ignore[arg-type]
        org = harness.new_org()
        secrets_seen.append(org.key)
        with httpx.Client(base_url=base, headers=org.headers, timeout=30) as client:
            bodies.append(client.get("/v1/jobs", params={"api_key": org.key, "token": org.key}).text)
            hook = client.post("/v1/webhooks", json={"url": receiver.url}).json()
            secrets_seen.append(hook["secret"])
            stored = "hf_" + os.urandom(16).hex()
            secrets_seen.append(stored)
            bodies.append(client.put("/v1/secrets/hub-token", json={"value": stored}).text)
            bodies.append(client.get("/readyz").text)  # the dead broker: its URL has the password
            created = client.post("/v1/jobs", json={"target": {"uri": "bundled:smollm2-135m"}})
            bodies.append(created.text)
            # A failed insert whose bound parameters include a fresh webhook secret.
            engine = create_engine(settings.database_url)
            trigger = _refuse_webhook_inserts(engine, text)
            try:
                failed = client.post("/v1/webhooks", json={"url": receiver.url + "/second"})
            finally:
                trigger()
                engine.dispose()
            assert failed.status_code == 500
            bodies.append(failed.text)
            bad_key = client.get("/v1/jobs", headers={"Authorization": f"Bearer {org.key}x"})
            bodies.append(bad_key.text)
        receiver.responses = [500] * 10
        dispatch_due_webhooks(harness.services.session_factory, settings, now=utcnow())
        with harness.services.session_factory() as session:
            bodies += [f"{e.message} {e.data}" for e in session.query(JobEvent).all()]
        setup.delete(f"/v1/webhooks/{hook['id']}", headers=org.headers)  # no retry left pending
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "GET /v1/jobs?api_key=" in logged  # the access log was captured, with the key redacted
    assert "could not enqueue" in logged or "broker" in " ".join(bodies)
    for secret in secrets_seen:
        assert secret not in logged, f"a secret ({secret[:8]}...) is in the logs"
        for body in bodies:
            assert secret not in body, f"a secret ({secret[:8]}...) is in a response or event: {body[:300]}"


def _refuse_webhook_inserts(engine, text):  # noqa: ANN001, ANN202
    """Make the database refuse new webhook rows; returns the undo."""
    with engine.begin() as connection:
        if engine.dialect.name == "sqlite":
            connection.execute(text("CREATE TRIGGER refuse_hooks BEFORE INSERT ON webhooks "
                                    "BEGIN SELECT RAISE(ABORT, 'refused for the test'); END"))
        else:
            connection.execute(text("CREATE FUNCTION refuse_hooks() RETURNS trigger AS $$ BEGIN "
                                    "RAISE EXCEPTION 'refused for the test'; END $$ LANGUAGE plpgsql"))
            connection.execute(text("CREATE TRIGGER refuse_hooks BEFORE INSERT ON webhooks "
                                    "FOR EACH ROW EXECUTE FUNCTION refuse_hooks()"))

    def undo() -> None:
        with engine.begin() as connection:
            connection.execute(text("DROP TRIGGER refuse_hooks" + ("" if engine.dialect.name == "sqlite"
                                                                   else " ON webhooks")))
            if engine.dialect.name != "sqlite":
                connection.execute(text("DROP FUNCTION refuse_hooks()"))

    return undo


@pytest.fixture
def receiver():
    with Receiver() as running:
        yield running


def test_log_records_are_redacted_whatever_the_logger():
    from domain.redaction import install_log_redaction, redact_record, register_secret_values

    install_log_redaction()
    storage_secret = "s3-secret-" + os.urandom(10).hex()
    register_secret_values(storage_secret)
    key = "dsk_" + "K" * 43
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5000", "GET", f"/v1/jobs?limit=2&api_key={key}&x-amz-signature=abc",
                                "1.1", 200), None)
    redact_record(record)
    line = record.getMessage()
    assert key not in line and "abc" not in line and "limit=2" in line and "api_key=[redacted]" in line
    forged = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '"%s %s"', ("GET", "/v1/x\nFAKE 200"), None)
    redact_record(forged)
    assert "\n" not in forged.getMessage() and "\\x0a" in forged.getMessage()  # no forged log lines
    for text in (f"Authorization: Bearer {key}", f"secret whsec_{'Q' * 44}", "redis://:hunter2hunter2@10.0.0.1:6379",
                 f"S3 error for credential {storage_secret}"):
        logger = logging.getLogger("some.library.deep.inside")  # any logger: redacted at record creation
        made = logger.makeRecord(logger.name, logging.ERROR, __file__, 1, "failed: %s", (text,), None)
        assert all(s not in made.getMessage() for s in (key, "whsec_Q", "hunter2", storage_secret)), made.getMessage()
