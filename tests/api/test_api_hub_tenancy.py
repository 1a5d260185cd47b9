"""Issue 20, the Hub half, at the API: the deployment's Hub token is a confused deputy like its S3 credentials, so a
Hub request carries only the organisation's own token (the destination's token_secret, else its secrets
`hf.<namespace>`, else `hf`) unless the operator trusts the namespace (DRAFTSMITH_HF_TRUSTED_NAMESPACES). The order
itself, as pure functions; then, on PostgreSQL through the API, publish destinations the API can judge when the spec
is accepted (422 on publish.N.token_secret, naming the fix), while reads go through (the worker fetches them
anonymously or with the organisation's token: tests/worker/test_worker_hub_tenancy.py, where what is sent to the
Hub is recorded)."""

from __future__ import annotations

import pytest
from api_harness import TEST_SECRET_KEY, Harness, build_harness, make_settings
from pydantic import SecretStr

from domain.settings import Settings
from domain.storage_scope import CredentialsNeeded, choose_hub_access, hub_namespace

MINIMAL = {"target": {"uri": "bundled:smollm2-135m"}}
DEPLOYMENT_TOKEN = "hf_deployment_token_0123456789"


def settings(**overrides) -> Settings:
    values = {"env": "production", "secret_key": TEST_SECRET_KEY, "database_url": "sqlite://",
              "hf_token": DEPLOYMENT_TOKEN, "hf_trusted_namespaces": "draftsmith-models, Shared"}
    return Settings(**{**values, **overrides})


def test_whose_token_a_hub_request_carries():
    trusting = settings()
    assert trusting.hf_trusted_namespaces == ["draftsmith-models", "Shared"]
    assert (hub_namespace("Acme/llama"), hub_namespace("gpt2")) == ("acme", "")
    own = {"hf.orgb"}
    assert choose_hub_access("orgb/model", trusting, own).secret == "hf.orgb"
    assert choose_hub_access("OrgB/model", trusting, own).secret == "hf.orgb"  # the Hub's namespaces ignore case
    assert choose_hub_access("draftsmith-models/base", trusting, own).kind == "deployment"
    assert choose_hub_access("shared/base", trusting, own).kind == "deployment"
    assert choose_hub_access("victim/private", trusting, own).kind == "anonymous"  # a read: public repos only
    assert choose_hub_access("gpt2", trusting, own).kind == "anonymous"  # no namespace: only * trusts it
    assert choose_hub_access("victim/private", trusting, own | {"hf"}).secret == "hf"
    assert choose_hub_access("draftsmith-models/base", trusting, {"hf.draftsmith-models"}).secret == \
        "hf.draftsmith-models"  # the organisation's own token for a namespace wins over the deployment's
    assert choose_hub_access("x/y", trusting, set(), explicit_secret="named", write=True).secret == "named"
    with pytest.raises(CredentialsNeeded, match="needs a token with write access"):
        choose_hub_access("victim/drafter", trusting, own, write=True)  # never the deployment's
    untokened = settings(hf_token=None)
    assert choose_hub_access("draftsmith-models/base", untokened, set()).kind == "anonymous"
    with pytest.raises(CredentialsNeeded, match="DRAFTSMITH_HF_TOKEN"):
        choose_hub_access("draftsmith-models/base", untokened, set(), write=True)
    assert choose_hub_access("draftsmith-models/base", untokened, {"hf"}, write=True).secret == "hf"
    # Development is single-tenant (its one organisation is the operator): every namespace, unless set.
    development = Settings(env="development", hf_token=SecretStr(DEPLOYMENT_TOKEN))
    assert development.hf_trusted_namespaces == ["*"]
    assert choose_hub_access("gpt2", development, set()).kind == "deployment"
    assert Settings(env="development", hf_trusted_namespaces="").hf_trusted_namespaces == []
    assert Settings(env="production", secret_key=TEST_SECRET_KEY).hf_trusted_namespaces == []  # no namespace trusted


@pytest.fixture
def hub_harness(module_postgres_url, tmp_path):
    yield from build_harness(make_settings(module_postgres_url, tmp_path / "storage", hf_token=DEPLOYMENT_TOKEN,
                                           hf_trusted_namespaces=["draftsmith-models"]))


def refusal(harness: Harness, org, body: dict, path: str = "/v1/jobs") -> dict:
    response = harness.client.post(path, json=body, headers=org.headers)
    assert response.status_code == 422, response.text
    return response.json()


def test_a_hub_publish_needs_the_organisations_own_token_unless_the_namespace_is_trusted(hub_harness):
    harness = hub_harness
    b = harness.new_org()
    elsewhere = {**MINIMAL, "publish": [{"kind": "s3", "uri": "s3://b-releases/drafters"},
                                        {"kind": "hf", "repo": "victim/drafter"}]}
    rows_before = harness.row_counts()
    for path in ("/v1/jobs", "/v1/jobs/estimate"):
        errors = refusal(harness, b, elsewhere, path)["errors"]
        assert [e["field"] for e in errors] == ["publish.0.credentials_secret", "publish.1.token_secret"], errors
        assert "hf.<namespace> or hf" in errors[1]["message"] and "DRAFTSMITH_HF_TRUSTED_NAMESPACES" in errors[1]["message"]
    assert harness.row_counts() == rows_before  # nothing admitted, nothing queued

    # Reads need no token at admission: the API cannot tell a private repo, and a public one works anonymously.
    reads = {"target": {"uri": "hf://victim/private-model"}, "data": {"source": "hf://victim/prompts"},
             "init": {"from_drafter": "hf://victim/drafter"}}
    assert harness.client.post("/v1/jobs", json=reads, headers=b.headers).status_code == 201
    audit = {"drafter": "hf://victim/drafter", "target": {"uri": "hf://victim/private-model"}}
    assert harness.client.post("/v1/audits", json=audit, headers=b.headers).status_code == 201

    # The operator's trusted namespace takes the deployment's token (in any case, as the Hub compares them).
    for repo in ("draftsmith-models/b-drafter", "Draftsmith-Models/b-drafter"):
        trusted = {**MINIMAL, "publish": [{"kind": "hf", "repo": repo}]}
        assert harness.client.post("/v1/jobs", json=trusted, headers=b.headers).status_code == 201

    # The organisation's own secrets: hf.<namespace> opens that namespace only, hf every other one.
    only_victim = {**MINIMAL, "publish": [{"kind": "hf", "repo": "victim/drafter"}]}
    put = harness.client.put("/v1/secrets/hf.orgb", json={"value": "hf_orgb_own_token_0123"}, headers=b.headers)
    assert put.status_code == 200, put.text
    assert harness.client.post("/v1/jobs", json={**MINIMAL, "publish": [{"kind": "hf", "repo": "OrgB/drafter"}]},
                               headers=b.headers).status_code == 201
    assert refusal(harness, b, only_victim)["errors"][0]["field"] == "publish.0.token_secret"
    named = {**MINIMAL, "publish": [{"kind": "hf", "repo": "victim/drafter", "token_secret": "hf.orgb"}]}
    assert harness.client.post("/v1/jobs", json=named, headers=b.headers).status_code == 201
    assert harness.client.put("/v1/secrets/hf", json={"value": "hf_b_default_0123"}, headers=b.headers).status_code == 200
    assert harness.client.post("/v1/jobs", json=only_victim, headers=b.headers).status_code == 201
    # Another organisation's secrets are not B2's.
    assert refusal(harness, harness.new_org(), only_victim)["errors"][0]["field"] == "publish.0.token_secret"


def test_without_a_deployment_token_a_trusted_namespace_needs_the_organisations_own(module_postgres_url, tmp_path):
    for harness in build_harness(make_settings(module_postgres_url, tmp_path / "storage",
                                               hf_trusted_namespaces=["draftsmith-models"])):
        body = {**MINIMAL, "publish": [{"kind": "hf", "repo": "draftsmith-models/b-drafter"}]}
        error = refusal(harness, harness.new_org(), body)["errors"][0]
        assert error["field"] == "publish.0.token_secret" and "DRAFTSMITH_HF_TOKEN" in error["message"]
