"""Two tenants on PostgreSQL and moto, the deployment's storage listening on every interface of this machine
(IPv4 and IPv6, link-local included): organisation B tries to reach organisation A's objects through the
endpoint of an S3 secret, and through the worker's cache of fetched sources.

The egress policy (domain/egress.py) judges an endpoint by the address it reaches. Each case below names an
address class, not a spelling: this machine's own link-local address (with its zone), the storage server's port
at loopback and at the machine's other addresses, IPv6 forms that carry an IPv4 address (mapped, SIIT, NAT64),
and each with the path tricks botocore would carry before the bucket (`/x/../bucket`, `/./bucket`, `%2F`, `//`,
no path). Three doors are tried in turn: PUT /v1/secrets refuses the secret; a secret stored anyway (as a hand-
edited row would be) is refused by the worker before use; and with that check taken away too (a name that
resolved elsewhere a moment before, say), the client's own connection is refused. A's objects stay byte for
byte what they were and nothing of A's reaches B. The customers' own servers are moto servers on loopback, a
network this test deployment allow-lists (tests/api/api_harness.py), as a deployment would its peered networks.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from api_harness import Harness, build_harness, make_settings
from services import fresh_postgres_database, moto_server

BUCKET, PRIVATE = "draftsmith-egress", "a-private"
KEYS = {"region_name": "us-east-1", "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def this_machines_link_local() -> tuple[str, str] | None:
    """(address, interface) of an IPv6 link-local address this machine has, or None."""
    for _, name in socket.if_nameindex():
        try:
            with open("/proc/net/if_inet6") as table:
                for line in table:
                    fields = line.split()
                    if fields[-1] == name and fields[0].startswith("fe80"):
                        return str(ipaddress.IPv6Address(int(fields[0], 16))), name
        except OSError:
            return None
    return None


def this_machines_ipv4_addresses() -> list[str]:
    """The IPv4 address of each interface but loopback (SIOCGIFADDR)."""
    import fcntl
    import struct

    found = []
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
        address = socket.inet_ntoa(packed[20:24])
        if not address.startswith("127."):
            found.append(address)
    return found


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple[Harness, str, str]]:
    """The deployment (storage on every interface), customer A's server and customer B's server."""
    from migrations.revisions import upgrade

    url, drop = fresh_postgres_database("draftsmith_worker_egress")
    upgrade(url)
    try:
        with moto_server(bind="::") as storage, moto_server() as a_server, moto_server() as b_server:
            boto3.client("s3", endpoint_url=storage, **KEYS).create_bucket(Bucket=BUCKET)
            for server, text in ((a_server, b"A's private prompt__"), (b_server, b"B's lookalike prompt")):
                s3 = boto3.client("s3", endpoint_url=server, **KEYS)
                s3.create_bucket(Bucket=PRIVATE)
                s3.put_object(Bucket=PRIVATE, Key="prompts.jsonl", Body=json.dumps({"prompt": text.decode()}).encode()
                              + b"\n")
            settings = make_settings(url, tmp_path_factory.mktemp("unused"), storage_url=f"s3://{BUCKET}/prod",
                                     s3_endpoint_url=storage, s3_access_key_id="testing",
                                     s3_secret_access_key="testing",
                                     worker_cache_dir=str(tmp_path_factory.mktemp("worker-cache")))
            for harness in build_harness(settings):
                yield harness, a_server, b_server
    finally:
        drop()


def storage_objects(harness: Harness) -> dict[str, str]:
    s3 = boto3.client("s3", endpoint_url=harness.settings.s3_endpoint_url, **KEYS)
    return {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])}


def hostile_endpoints(port: int) -> dict[str, str]:
    """Endpoints that reach the deployment's storage server, by address class (each with a path trick)."""
    endpoints = {
        "loopback, the storage port": f"http://127.0.0.1:{port}//",
        "loopback, another address of 127/8": f"http://127.0.0.2:{port}/x/../{BUCKET}",
        "IPv6 loopback": f"http://[::1]:{port}/./{BUCKET}",
        "IPv4-mapped IPv6": f"http://[::ffff:127.0.0.1]:{port}/{BUCKET}",
        "SIIT (IPv4-translated) IPv6": f"http://[::ffff:0:7f00:1]:{port}/%2F{BUCKET}",
        "NAT64 IPv6": f"http://[64:ff9b::7f00:1]:{port}/{BUCKET}",
        "IPv4-compatible IPv6": f"http://[::7f00:1]:{port}",
        "unspecified": f"http://0.0.0.0:{port}",
        "cloud metadata": "http://169.254.169.254",
    }
    for address in this_machines_ipv4_addresses():
        endpoints[f"this machine's interface address {address}"] = f"http://{address}:{port}/{BUCKET}"
    link_local = this_machines_link_local()
    if link_local:
        endpoints["this machine's own link-local address"] = f"http://[{link_local[0]}%25{link_local[1]}]:{port}"
    return endpoints


@pytest.fixture(scope="module")
def organisation_a(world):
    harness, _, _ = world
    a = harness.new_org()
    upload = harness.client.post("/v1/files", files={"file": ("p.jsonl", b'{"prompt": "A only"}\n' * 12)},
                                 headers=a.headers).json()
    job_id = harness.create_job(a)["id"]
    harness.runner.run_to_end(job_id)
    return a, upload["id"], job_id


def test_the_storage_really_answers_on_every_address_class_we_refuse(world):
    """The premise: without the policy, each hostile endpoint reaches our bucket (moto takes any key)."""
    harness, _, _ = world
    port = int(harness.settings.s3_endpoint_url.rsplit(":", 1)[1])
    link_local = this_machines_link_local()
    reachable = [("127.0.0.2", port), ("::1", port), *((a, port) for a in this_machines_ipv4_addresses())]
    reachable += [(f"{link_local[0]}%{link_local[1]}", port)] if link_local else []
    for host, port_ in reachable:
        with socket.create_connection((host, port_), timeout=5):
            pass


def test_no_secret_endpoint_reaches_our_storage_by_any_address_class(world, organisation_a, monkeypatch):
    import domain.secrets
    import worker.sources as sources
    from worker.sources import Caller, StorageNotAllowed, open_s3, resolve_prompts

    harness, _, _ = world
    a, a_file, a_job = organisation_a
    b = harness.new_org()
    port = int(harness.settings.s3_endpoint_url.rsplit(":", 1)[1])
    a_upload, a_artifacts = f"s3://prod/files/{a.org_id}/{a_file}.jsonl", f"s3://prod/jobs/{a_job}/artifacts/x"
    before = storage_objects(harness)
    caller = Caller(b.org_id, harness.services.session_factory)
    for what, endpoint in hostile_endpoints(port).items():
        value = json.dumps({"access_key_id": "b-key", "secret_access_key": "b-secret-0123456789",
                            "endpoint_url": endpoint})
        refused = harness.client.put("/v1/secrets/s3.prod", json={"value": value}, headers=b.headers)
        assert refused.status_code == 422, (what, refused.text)
        error = refused.json()["errors"][0]
        assert error["field"] == "value.endpoint_url" and "publicly reachable" in error["message"], (what, error)
        assert "b-secret-0123456789" not in refused.text

        with monkeypatch.context() as stored_anyway:  # a row written before the rule, or by hand
            stored_anyway.setattr(domain.secrets, "s3_secret_problems", lambda given, settings: [])
            assert harness.client.put("/v1/secrets/s3.prod", json={"value": value},
                                      headers=b.headers).status_code == 200
        with pytest.raises(StorageNotAllowed, match="publicly reachable"):
            resolve_prompts(a_upload, harness.settings, Path(harness.settings.worker_cache_dir), caller=caller)
        with pytest.raises(StorageNotAllowed, match="publicly reachable"):
            open_s3(a_artifacts, harness.settings, caller, what="publish[0]", write=True)

        with monkeypatch.context() as unchecked:  # the worker's check taken away: the client's connection refuses
            unchecked.setattr(sources, "s3_secret_problems", lambda given, settings: [])
            handle = open_s3(a_artifacts, harness.settings, caller, what="publish[0]", write=True)
            with pytest.raises(Exception, match="publicly reachable"):
                handle.client.put_object(Bucket=handle.bucket, Key=handle.key, Body=b"B was here")
            reader = open_s3(a_upload, harness.settings, caller, what="prompts")
            with pytest.raises(Exception, match="publicly reachable"):
                reader.client.get_object(Bucket=reader.bucket, Key=reader.key)
        assert harness.client.delete("/v1/secrets/s3.prod", headers=b.headers).status_code == 204
    assert storage_objects(harness) == before


def test_a_secret_without_an_endpoint_never_goes_to_our_storage(world, organisation_a):
    """No endpoint means AWS: an organisation's keys are never sent to the deployment's own server."""
    from worker.sources import Caller, open_s3

    harness, _, _ = world
    b = harness.new_org()
    value = json.dumps({"access_key_id": "b-key", "secret_access_key": "b-secret-0123456789"})
    assert harness.client.put("/v1/secrets/s3.prod", json={"value": value}, headers=b.headers).status_code == 200
    handle = open_s3("s3://prod/x.jsonl", harness.settings, Caller(b.org_id, harness.services.session_factory),
                     what="prompts")
    assert "amazonaws.com" in handle.client.meta.endpoint_url


def test_the_source_cache_never_hands_one_organisation_anothers_bytes(world):
    """A reads s3://a-private/prompts.jsonl from its server with its secret; B names the same URI with its own
    secret `s3.a-private`, whose endpoint is B's server holding an object of the same size: B gets B's bytes."""
    from worker.sources import Caller, resolve_prompts

    harness, a_server, b_server = world
    cache = Path(harness.settings.worker_cache_dir)
    a, b = harness.new_org(), harness.new_org()
    for org, server in ((a, a_server), (b, b_server)):
        value = json.dumps({"access_key_id": f"{org.name}-key", "secret_access_key": "secret-0123456789",
                            "endpoint_url": server})
        assert harness.client.put(f"/v1/secrets/s3.{PRIVATE}", json={"value": value},
                                  headers=org.headers).status_code == 200
    uri = f"s3://{PRIVATE}/prompts.jsonl"
    a_read = resolve_prompts(uri, harness.settings, cache, caller=Caller(a.org_id, harness.services.session_factory))
    b_read = resolve_prompts(uri, harness.settings, cache, caller=Caller(b.org_id, harness.services.session_factory))
    assert Path(a_read.path).stat().st_size == Path(b_read.path).stat().st_size  # the look-alike
    assert b"A's private" in Path(a_read.path).read_bytes()
    assert b"B's lookalike" in Path(b_read.path).read_bytes() and b"A's" not in Path(b_read.path).read_bytes()
    # A's object changes on A's server: A's next read is the new version (validated by ETag), not the cached one.
    boto3.client("s3", endpoint_url=a_server, **KEYS).put_object(
        Bucket=PRIVATE, Key="prompts.jsonl", Body=json.dumps({"prompt": "A's private prompt, v2"}).encode() + b"\n")
    again = resolve_prompts(uri, harness.settings, cache, caller=Caller(a.org_id, harness.services.session_factory))
    assert b"v2" in Path(again.path).read_bytes()
