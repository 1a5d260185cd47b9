"""Organisation secrets for publishing: stored encrypted, write-only, per organisation, referenced by name
from a job; a job body never carries a credential, and a job naming an unknown secret is refused up front."""

from __future__ import annotations

from sqlalchemy import select

from domain.models import OrgSecret
from domain.secrets import SecretUnavailable, secret_value

TOKEN = "hf_secret_value_0123456789abcdef"
MINIMAL = {"target": {"uri": "bundled:smollm2-135m"}}


def test_secrets_are_write_only_encrypted_and_per_organisation(harness):
    org, other = harness.new_org(), harness.new_org()
    stored = harness.client.put("/v1/secrets/hub-token", json={"value": TOKEN}, headers=org.headers)
    assert stored.status_code == 200 and TOKEN not in stored.text
    listed = harness.client.get("/v1/secrets", headers=org.headers)
    assert [s["name"] for s in listed.json()["data"]] == ["hub-token"] and TOKEN not in listed.text
    assert harness.client.get("/v1/secrets", headers=other.headers).json()["data"] == []
    with harness.services.session_factory() as session:
        row = session.scalar(select(OrgSecret).where(OrgSecret.org_id == org.org_id))
        assert TOKEN not in row.ciphertext  # encrypted at rest
        assert secret_value(session, harness.settings, org.org_id, "hub-token") == TOKEN  # what the worker reads
        try:
            secret_value(session, harness.settings, other.org_id, "hub-token")
            raise AssertionError("another organisation read the secret")
        except SecretUnavailable as error:
            assert "does not exist" in str(error)
    # Replacing keeps one row; writing needs admin; deleting makes it unknown to jobs.
    assert harness.client.put("/v1/secrets/hub-token", json={"value": TOKEN + "2"}, headers=org.headers).status_code == 200
    writer = harness.key_for(org, ("read", "write"))
    assert harness.client.put("/v1/secrets/x", json={"value": "v"}, headers=writer).status_code == 403
    assert harness.client.put("/v1/secrets/Bad Name", json={"value": "v"}, headers=org.headers).status_code == 422
    assert harness.client.delete("/v1/secrets/hub-token", headers=org.headers).status_code == 204
    assert harness.client.delete("/v1/secrets/hub-token", headers=org.headers).status_code == 404


def test_jobs_name_secrets_and_never_carry_them(harness):
    org = harness.new_org()
    destination = {"kind": "hf", "repo": "acme/drafter", "token_secret": "hub-token"}
    refused = harness.client.post("/v1/jobs", json={**MINIMAL, "publish": [destination]}, headers=org.headers)
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"] == "publish.0.token_secret"
    assert "PUT /v1/secrets/hub-token" in refused.json()["errors"][0]["message"]
    harness.client.put("/v1/secrets/hub-token", json={"value": TOKEN}, headers=org.headers)
    job = harness.create_job(org, {**MINIMAL, "publish": [destination]})
    assert job["spec"]["publish"][0]["token_secret"] == "hub-token"
    # A credential in the body itself is an unknown field, refused, and not echoed back.
    inline = {**MINIMAL, "publish": [{"kind": "hf", "repo": "acme/drafter", "token": TOKEN}]}
    response = harness.client.post("/v1/jobs", json=inline, headers=org.headers)
    assert response.status_code == 422 and TOKEN not in response.text


def test_the_estimate_checks_secret_references_as_job_creation_does(harness):
    """Issue 32 item 6's neighbour: one check (domain/jobs.py check_job_spec) for both, so an estimate is never given
    for a job that would be refused for naming a secret the organisation has not stored."""
    org = harness.new_org()
    for destination, field in (({"kind": "hf", "repo": "acme/drafter", "token_secret": "hub-token"}, "token_secret"),
                               ({"kind": "s3", "uri": "s3://b-releases/d", "credentials_secret": "b-bucket"},
                                "credentials_secret")):
        body = {**MINIMAL, "publish": [destination]}
        answers = [harness.client.post(path, json=body, headers=org.headers) for path in ("/v1/jobs/estimate",
                                                                                           "/v1/jobs")]
        for answer in answers:
            assert answer.status_code == 422, answer.text
            assert answer.json()["errors"][0]["field"] == f"publish.0.{field}"
            assert f"PUT /v1/secrets/{destination[field]}" in answer.json()["errors"][0]["message"]
    harness.client.put("/v1/secrets/hub-token", json={"value": TOKEN}, headers=org.headers)
    stored = {**MINIMAL, "publish": [{"kind": "hf", "repo": "acme/drafter", "token_secret": "hub-token"}]}
    assert harness.client.post("/v1/jobs/estimate", json=stored, headers=org.headers).status_code == 200
