"""Test harness for the control plane: settings for a test database, an app with a TestClient,
organisations with API keys, row counts (to prove a rejected request wrote nothing), and the
fake stage runner. Imported by conftest.py and by tests that build their own apps."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fake_stage_runner import FakeStageRunner
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.deps import Services, services_for
from api.main import create_app
from domain.keys import create_api_key
from domain.models import Base
from domain.settings import Settings

TEST_SECRET_KEY = "test-secret-key-" + "k" * 40


def make_settings(database_url: str, storage_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "env": "production",
        "secret_key": TEST_SECRET_KEY,
        "database_url": database_url,
        "broker_url": "disabled",
        "storage_url": storage_dir.resolve().as_uri(),
        "webhook_dispatch_interval_seconds": 0,
        # Receivers and customers' S3 servers in the tests listen on loopback (domain/egress.py).
        "egress_allowed_networks": ["127.0.0.0/8", "::1/128"],
        "sse_poll_interval_seconds": 0.05,
        "sse_max_stream_seconds": 20,
        "allowed_file_roots": ["/srv/models"],
        "max_upload_bytes": 64 * 1024,
        "default_max_concurrent_jobs": 50,
    }
    values.update(overrides)
    return Settings(**values)


@dataclass
class Org:
    name: str
    org_id: str
    key: str
    headers: dict[str, str]


@dataclass
class Harness:
    client: TestClient
    services: Services
    runner: FakeStageRunner
    orgs: list[Org] = field(default_factory=list)

    @property
    def settings(self) -> Settings:
        return self.services.settings

    def new_org(self, scopes: tuple[str, ...] = ("read", "write", "admin"), *, limit: int | None = None) -> Org:
        from domain.models import Organisation

        name = f"org-{secrets.token_hex(5)}"
        with self.services.session_factory() as session:
            issued = create_api_key(session, self.settings, org_name=name, scopes=scopes)
            if limit is not None:
                session.get(Organisation, issued.org_id).max_concurrent_jobs = limit  # type: ignore[union-attr]
            session.commit()
        org = Org(name, issued.org_id, issued.plaintext, {"Authorization": f"Bearer {issued.plaintext}"})
        self.orgs.append(org)
        return org

    def key_for(self, org: Org, scopes: tuple[str, ...]) -> dict[str, str]:
        with self.services.session_factory() as session:
            issued = create_api_key(session, self.settings, org_name=org.name, scopes=scopes)
            session.commit()
        return {"Authorization": f"Bearer {issued.plaintext}"}

    def row_counts(self) -> dict[str, int]:
        with self.services.engine.connect() as connection:
            return {
                table.name: connection.execute(select(func.count()).select_from(table)).scalar_one()
                for table in Base.metadata.sorted_tables
            }

    def create_job(self, org: Org, body: dict[str, Any] | None = None, **headers: str) -> dict[str, Any]:
        response = self.client.post("/v1/jobs", json=body or {"target": {"uri": "bundled:smollm2-135m"}},
                                    headers={**org.headers, **headers})
        assert response.status_code == 201, response.text
        return response.json()


def build_harness(settings: Settings) -> Iterator[Harness]:
    app = create_app(settings)
    with TestClient(app) as client:
        services = services_for(app)
        yield Harness(client=client, services=services, runner=FakeStageRunner(services.session_factory,
                                                                                services.storage))
