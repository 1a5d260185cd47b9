"""The one scoping rule for storage URIs (domain/storage_scope.py), spelling by spelling: every way of writing a URI
into the deployment's own storage is judged as that storage, and there only the caller's own prefixes are
readable; nothing in it is writable; other buckets get the organisation's own credentials, never the
deployment's unless the bucket is trusted. Pure functions, no servers (the same rule at the API and in the worker
is tested end to end in test_api_tenancy.py and tests/worker/test_worker_tenancy.py)."""

from __future__ import annotations

import pytest
from api_harness import TEST_SECRET_KEY

from domain.settings import Settings
from domain.storage_scope import (
    StorageScopeError,
    Tenant,
    check_s3_endpoint,
    check_storage_uri,
    choose_s3_access,
    refuse_link_loops,
    s3_secret_problems,
)

A_JOB, B_JOB = "job_01J000000000000000000000AA", "job_01J000000000000000000000BB"
BASE = "s3://draftsmith-storage/service"


def settings(tmp_path, **overrides) -> Settings:
    values = {"env": "production", "secret_key": TEST_SECRET_KEY, "database_url": "sqlite://",
              "storage_url": f"{BASE}", "s3_endpoint_url": "http://127.0.0.1:9000",
              "worker_cache_dir": str(tmp_path / "cache")}
    return Settings(**{**values, **overrides})


B = Tenant("org_B", owns_job=lambda job_id: job_id == B_JOB, secret_names=lambda: {"s3.b-own-bucket"})


@pytest.mark.parametrize("uri", [
    f"{BASE}/jobs/{A_JOB}/work",  # another organisation's job, plainly
    f"{BASE}/files/org_A/file-AbC12345.jsonl",  # another organisation's upload
    f"{BASE}/jobs",  # everyone's jobs
    f"{BASE}",  # the whole storage
    "s3://draftsmith-storage/elsewhere/x",  # the deployment's bucket outside its prefix
    f"s3://Draftsmith-Storage/service/jobs/{B_JOB}/work",  # case
    f"{BASE}//jobs/{B_JOB}/work",  # '//'
    f"{BASE}/jobs%2F{B_JOB}/work",  # %2F
    f"{BASE}/jobs/{B_JOB}/../{A_JOB}",  # '..'
    f"{BASE}/JOBS/{B_JOB}/work",  # another case of the key (a case-insensitive store)
    f"s3://draftsmith-storage.s3.amazonaws.com/service/jobs/{A_JOB}",  # virtual-host spelling, AWS
    f"s3://draftsmith-storage.127.0.0.1/service/jobs/{A_JOB}",  # virtual-host spelling, the endpoint's address
    f"s3://draftsmith-storage.localhost/service/jobs/{A_JOB}",  # ... its alias
    f"s3://s3.amazonaws.com/draftsmith-storage/service/jobs/{A_JOB}",  # path style spelled into the URI
    f"s3://localhost/draftsmith-storage/service/jobs/{A_JOB}",
])
def test_every_spelling_into_the_deployments_storage_outside_the_callers_prefix_is_refused(uri, tmp_path):
    with pytest.raises(StorageScopeError, match="Draftsmith's own"):
        check_storage_uri(uri, settings(tmp_path), B)


@pytest.mark.parametrize("uri, key", [
    (f"{BASE}/jobs/{B_JOB}/artifacts/", f"jobs/{B_JOB}/artifacts"),
    (f"{BASE}/files/org_B/file-AbC12345.jsonl", "files/org_B/file-AbC12345.jsonl"),
])
def test_the_callers_own_prefixes_are_readable_but_never_writable(uri, key, tmp_path):
    assert check_storage_uri(uri, settings(tmp_path), B).key == key
    with pytest.raises(StorageScopeError, match="only the service writes"):
        check_storage_uri(uri, settings(tmp_path), B, write=True)


def test_other_buckets_are_not_the_deployments_storage(tmp_path):
    assert check_storage_uri("s3://b-own-bucket/models/x", settings(tmp_path), B) is None
    assert check_storage_uri("hf://acme/model", settings(tmp_path), B) is None


def test_a_deployment_on_aws_recognises_any_aws_spelling(tmp_path):
    on_aws = settings(tmp_path, s3_endpoint_url=None)
    for uri in (f"s3://draftsmith-storage.s3.us-east-1.amazonaws.com/service/jobs/{A_JOB}",
                f"s3://s3.dualstack.us-east-1.amazonaws.com/draftsmith-storage/service/jobs/{A_JOB}"):
        with pytest.raises(StorageScopeError):
            check_storage_uri(uri, on_aws, B)


def test_file_uris_into_the_local_storage_root_and_the_worker_cache(tmp_path):
    root = tmp_path / "storage"
    (root / "files" / "org_A").mkdir(parents=True)
    (root / "files" / "org_A" / "f.jsonl").write_text("{}\n")
    (root / "jobs" / B_JOB).mkdir(parents=True)
    local = settings(tmp_path, storage_url=root.as_uri())
    link = tmp_path / "innocent"
    link.symlink_to(root / "files" / "org_A")
    for uri in (f"file://{root}/files/org_A/f.jsonl", f"file://{link}/f.jsonl", f"file://localhost{root}/jobs",
                f"file://{str(root).upper()}/FILES/ORG_A/F.JSONL",  # as a case-insensitive filesystem reads it
                f"file://{root}/jobs/{B_JOB}/../../files/org_A/f.jsonl"):
        with pytest.raises(StorageScopeError):
            check_storage_uri(uri, local, B)
    assert check_storage_uri(f"file://{root}/jobs/{B_JOB}", local, B).key == f"jobs/{B_JOB}"
    with pytest.raises(StorageScopeError, match="worker's cache"):
        check_storage_uri(f"file://{tmp_path}/cache/jobs/{A_JOB}/work", local, B)
    with pytest.raises(StorageScopeError, match="this machine"):
        check_storage_uri(f"file://elsewhere{root}", local, B)
    assert check_storage_uri(f"file://{tmp_path}/models/x", local, B) is None


def test_credentials_for_other_buckets(tmp_path):
    trusting = settings(tmp_path, s3_trusted_buckets="shared-models,other")
    assert trusting.s3_trusted_buckets == ["shared-models", "other"]
    names = {"s3.b-own-bucket"}
    assert choose_s3_access("b-own-bucket", trusting, names).secret == "s3.b-own-bucket"
    assert choose_s3_access("shared-models", trusting, names).kind == "deployment"
    assert choose_s3_access("someone-elses", trusting, names).kind == "anonymous"  # a read: public data only
    assert choose_s3_access("someone-elses", trusting, names | {"s3"}).secret == "s3"
    assert choose_s3_access("x-bucket", trusting, set(), explicit_secret="named", write=True).secret == "named"
    with pytest.raises(StorageScopeError, match="needs your own credentials"):
        choose_s3_access("someone-elses", trusting, names, write=True)  # never the deployment's


def test_symbolic_link_loops_are_refused(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(StorageScopeError, match="loop"):
        refuse_link_loops(f"file://{tmp_path}/a")
    model = tmp_path / "model"
    model.mkdir()
    (model / "again").symlink_to(tmp_path)
    with pytest.raises(StorageScopeError, match="links back"):
        refuse_link_loops(f"file://{model}")
    refuse_link_loops(f"file://{tmp_path}/not-here")  # the worker judges paths this machine does not have


# --- issue 32 item 1: every spelling of the storage host, and a secret's endpoint path ------------------------------

NUMERIC_LOOPBACK = ["127.1", "2130706433", "0x7f000001", "0177.0.0.1", "0x7f.1", "[::ffff:127.0.0.1]",
                    "[::ffff:7f00:1]", "[::1]", "LOCALHOST.", "127.0.0.1.", "localhost:9000", "0.0.0.0", "127.0.0.2"]


@pytest.mark.parametrize("host", NUMERIC_LOOPBACK)
def test_every_spelling_of_the_storage_host_in_a_uri_is_the_storage_host(host, tmp_path):
    # The deployment's endpoint is http://127.0.0.1:9000: each of these is that machine.
    with pytest.raises(StorageScopeError, match="Draftsmith's own"):
        check_storage_uri(f"s3://{host}/draftsmith-storage/service/files/org_A/f.jsonl", settings(tmp_path), B)
    with pytest.raises(StorageScopeError, match="Draftsmith's own"):
        check_storage_uri(f"s3://draftsmith-storage.{host.strip('[]')}/service/files/org_A/f.jsonl",
                          settings(tmp_path), B)


@pytest.mark.parametrize("endpoint", [
    *(f"http://{host}/draftsmith-storage" for host in NUMERIC_LOOPBACK),  # every spelling of this machine
    "http://127.0.0.1:9000/draftsmith-storage/",
    "http://127.0.0.1:9001/draftsmith-storage",
    "http://2130706433:9000/%64raftsmith-storage",
    "http://draftsmith-storage.localhost:9000",
    "http://[fe80::1%25eth0]:9000/x/../draftsmith-storage",  # link-local, with a zone
    "http://[64:ff9b::7f00:1]:9000", "http://[::ffff:0:7f00:1]:9000",  # NAT64 and SIIT forms of 127.0.0.1
    "http://10.1.2.3:9000", "http://169.254.169.254",
])
def test_a_secret_endpoint_is_judged_by_the_address_it_reaches(endpoint, tmp_path):
    problems = s3_secret_problems({"access_key_id": "k", "secret_access_key": "s", "endpoint_url": endpoint},
                                  settings(tmp_path))
    assert [field for field, _ in problems] == ["endpoint_url"], problems
    assert "only publicly reachable endpoints" in problems[0][1] or "does not resolve" in problems[0][1]


def test_the_storage_servers_own_address_stays_refused_where_loopback_is_allowed(tmp_path):
    """A deployment that allow-lists loopback (its customers' test servers run there) still refuses every address
    of this machine at the storage server's port: the server may listen on all of them."""
    local = settings(tmp_path, egress_allowed_networks=["127.0.0.0/8", "::1/128", "fe80::/10"])
    for endpoint in ("http://127.0.0.1:9000", "http://localhost:9000/", "http://127.0.0.2:9000", "http://[::1]:9000"):
        with pytest.raises(StorageScopeError, match="own services"):
            check_s3_endpoint(endpoint, local)
    check_s3_endpoint("http://127.0.0.1:9001", local)  # another server on an allowed network


def test_usable_secret_endpoints_and_malformed_ones(tmp_path):
    local = settings(tmp_path)
    for endpoint in ("https://minio.b.example:9000", "https://project.supabase.example/storage/v1/s3"):
        check_s3_endpoint(endpoint, local)  # public servers (tests/conftest.py resolves *.example publicly)
    for endpoint in ("ftp://127.0.0.1/x", "http://user:pw@minio.b.example", "https://minio.b.example?x=1",
                     "http://minio.b.example:99999", "minio.b.example"):
        with pytest.raises(StorageScopeError, match="https://host"):
            check_s3_endpoint(endpoint, local)
    problems = s3_secret_problems({"access_key_id": "", "endpoint_url": 5, "region": "eu/west"}, local)
    assert [f for f, _ in problems] == ["access_key_id", "secret_access_key", "endpoint_url", "region"]
