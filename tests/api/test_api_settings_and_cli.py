"""Settings (env, file, refusal of default secrets), development mode's local key, the `keys` and
`api` commands, and the import rule: `api` never loads torch, the trainer or the worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from api_harness import TEST_SECRET_KEY, make_settings
from click.testing import CliRunner
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api.main import create_app
from domain.settings import DEFAULT_DEV_API_KEY, Settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("DRAFTSMITH_"):
            monkeypatch.delenv(name)


def test_production_refuses_default_or_short_secret():
    with pytest.raises(ValidationError, match="DRAFTSMITH_SECRET_KEY"):
        Settings()
    with pytest.raises(ValidationError, match="at least 32 characters"):
        Settings(secret_key="short")
    assert Settings(env="development").development  # the embedded default is fine in development
    assert Settings(secret_key=TEST_SECRET_KEY).env == "production"


def test_environment_and_settings_file(tmp_path, monkeypatch):
    settings_file = tmp_path / "draftsmith.toml"
    settings_file.write_text(
        'env = "production"\n'
        f'secret_key = "{TEST_SECRET_KEY}"\n'
        'database_url = "postgresql://db.internal/draftsmith"\n'
        'queue_name = "from-file"\n'
    )
    monkeypatch.setenv("DRAFTSMITH_SETTINGS_FILE", str(settings_file))
    monkeypatch.setenv("DRAFTSMITH_QUEUE_NAME", "from-env")  # the environment beats the file
    monkeypatch.setenv("DRAFTSMITH_ALLOWED_FILE_ROOTS", "/srv/a, /srv/b")
    settings = Settings()
    assert settings.database_url == "postgresql://db.internal/draftsmith"
    assert settings.queue_name == "from-env" and settings.allowed_file_roots == ["/srv/a", "/srv/b"]
    assert settings.storage_url.startswith("file:///")

    monkeypatch.setenv("DRAFTSMITH_ALLOWED_FILE_ROOTS", "relative/dir")
    with pytest.raises(ValidationError, match="absolute"):
        Settings()
    monkeypatch.setenv("DRAFTSMITH_SETTINGS_FILE", str(tmp_path / "missing.toml"))
    with pytest.raises(ValueError, match="does not name a readable file"):
        Settings()


def test_development_mode_local_key(sqlite_url, tmp_path):
    settings = make_settings(sqlite_url, tmp_path, env="development", secret_key="dev")
    with TestClient(create_app(settings)) as client:
        headers = {"Authorization": f"Bearer {DEFAULT_DEV_API_KEY}"}
        created = client.post("/v1/jobs", json={"target": {"uri": "bundled:smollm2-135m"}}, headers=headers)
        assert created.status_code == 201
        # Admin scope too, and the same organisation on every request.
        assert client.post("/v1/webhooks", json={"url": "https://example.com/h"}, headers=headers).status_code == 201
        assert [j["id"] for j in client.get("/v1/jobs", headers=headers).json()["data"]] == [created.json()["id"]]


def test_keys_create_prints_a_working_key(sqlite_url, tmp_path, monkeypatch):
    from api.cli import keys

    monkeypatch.setenv("DRAFTSMITH_SECRET_KEY", TEST_SECRET_KEY)
    result = CliRunner().invoke(keys, ["create", "--org", "acme-cli", "--scope", "read", "--database-url", sqlite_url])
    assert result.exit_code == 0, result.output
    key = result.stdout.strip().splitlines()[-1]
    assert key.startswith("dsk_") and len(key) > 40
    settings = make_settings(sqlite_url, tmp_path)
    with TestClient(create_app(settings)) as client:
        headers = {"Authorization": f"Bearer {key}"}
        assert client.get("/v1/jobs", headers=headers).status_code == 200
        assert client.post("/v1/jobs", json={"target": {"uri": "bundled:smollm2-135m"}},
                           headers=headers).status_code == 403  # read scope only
    # The database holds only a hash of the key.
    from sqlalchemy import create_engine, text

    engine = create_engine(sqlite_url)
    with engine.connect() as connection:
        stored = [row[0] for row in connection.execute(text("SELECT key_hash FROM api_keys"))]
    engine.dispose()
    assert key not in stored and all(len(value) == 64 for value in stored)

    refused = CliRunner().invoke(keys, ["create", "--org", "x", "--database-url", sqlite_url],
                                 env={"DRAFTSMITH_SECRET_KEY": "short"})
    assert refused.exit_code != 0 and "DRAFTSMITH_SECRET_KEY" in refused.output


def test_api_command_refuses_an_unmigrated_database(tmp_path, monkeypatch):
    from api.cli import api

    monkeypatch.setenv("DRAFTSMITH_ENV", "development")
    monkeypatch.setenv("DRAFTSMITH_DATABASE_URL", f"sqlite:///{tmp_path / 'empty.db'}")
    result = CliRunner().invoke(api, ["--port", "8765"])
    assert result.exit_code != 0 and "draftsmith db upgrade" in result.output


def test_api_never_imports_torch_trainer_or_worker():
    code = (
        "import json, sys\n"
        "import api.main, api.cli, domain.runs, schemas.job_spec, schemas.prompts\n"
        "app = api.main.create_app()\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                            check=True, timeout=60)
    loaded = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert {"fastapi", "sqlalchemy", "api"} <= loaded  # the probe really imported the app
    assert not loaded & {"torch", "trainer", "worker", "transformers", "deepspeed"}, loaded & {"torch", "trainer",
                                                                                                "worker"}


def test_draftsmith_cli_registers_api_commands():
    from draftsmith.cli import LAZY_COMMANDS

    expected_registration = {"api": "api.cli:api", "db": "api.cli:db", "keys": "api.cli:keys"}
    registered = {name: LAZY_COMMANDS.get(name) for name in expected_registration}
    assert registered == expected_registration, "draftsmith/cli.py must register the api/db/keys commands"
    for command, expected in ((["db", "--help"], "downgrade"), (["keys", "--help"], "create"),
                              (["api", "--help"], "--workers")):
        result = subprocess.run([sys.executable, "-c", "from draftsmith.cli import main; main()", *command],
                                cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert expected in result.stdout


def test_secrets_can_come_from_mounted_files(tmp_path, monkeypatch):
    """Docker and Kubernetes mount secrets as files: one per setting, named like its variable."""
    (tmp_path / "DRAFTSMITH_SECRET_KEY").write_text("s" * 40)
    (tmp_path / "DRAFTSMITH_S3_SECRET_ACCESS_KEY").write_text("from-a-file")
    monkeypatch.setenv("DRAFTSMITH_SECRETS_DIR", str(tmp_path))
    monkeypatch.delenv("DRAFTSMITH_SECRET_KEY", raising=False)
    monkeypatch.setenv("DRAFTSMITH_ENV", "production")
    settings = Settings()
    assert settings.secret_key.get_secret_value() == "s" * 40
    assert settings.s3_secret_access_key.get_secret_value() == "from-a-file"
    monkeypatch.setenv("DRAFTSMITH_SECRETS_DIR", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="DRAFTSMITH_SECRETS_DIR"):
        Settings()
