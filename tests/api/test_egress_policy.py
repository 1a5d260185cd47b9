"""The egress policy (domain/egress.py) by address class: what each class is, that the allow-list lifts only the
classes it covers, that metadata endpoints and the deployment's own services stay refused whatever it says, and
that a name is judged by every address it resolves to (rebinding: judged again at each connection)."""

from __future__ import annotations

import ipaddress

import pytest

import domain.egress as egress
from domain.egress import EgressPolicy, EgressRefused

CLASSES = {
    "a loopback address": ["127.0.0.1", "127.255.0.9", "::1"],
    "a link-local address": ["169.254.10.1", "fe80::1"],
    "a private address": ["10.1.2.3", "172.16.0.1", "192.168.1.1", "fd12::1", "192.0.2.2"],
    "an unspecified address": ["0.0.0.0", "::"],
    "a multicast address": ["224.0.0.1", "ff02::1"],
    "a shared (carrier-grade NAT) address": ["100.64.0.1"],
    "an IPv6 address that carries an IPv4 address": [
        "::ffff:127.0.0.1", "::ffff:0:7f00:1", "64:ff9b::7f00:1", "64:ff9b:1::a00:1", "2002:7f00:1::",
        "2001:0:4136:e378:8000:63bf:80ff:fffe", "::7f00:1", "::ffff:8.8.8.8"],
    "a cloud metadata endpoint": ["169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254"],
}


@pytest.mark.parametrize("kind, address", [(kind, a) for kind, addresses in CLASSES.items() for a in addresses])
def test_each_address_class_is_refused_by_default(kind, address):
    with pytest.raises(EgressRefused, match="publicly reachable") as refused:
        EgressPolicy().connect_address(address, 443)
    assert kind in str(refused.value)


def test_global_unicast_passes_and_is_the_address_connected_to():
    for address in ("93.184.216.34", "8.8.8.8", "2606:4700::1111"):
        assert EgressPolicy().connect_address(address, 443) == address


def test_the_allow_list_lifts_only_what_it_covers_and_never_metadata_or_our_services():
    policy = EgressPolicy(allowed_networks=(ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("169.254.0.0/16")),
                          own_services=(("10.9.9.9", 9000),))
    assert policy.connect_address("10.1.2.3", 9000) == "10.1.2.3"
    with pytest.raises(EgressRefused, match="private"):
        policy.connect_address("192.168.1.1", 9000)
    with pytest.raises(EgressRefused, match="metadata"):
        policy.connect_address("169.254.169.254", 80)
    with pytest.raises(EgressRefused, match="own services"):
        policy.connect_address("10.9.9.9", 9000)
    assert policy.connect_address("10.9.9.9", 9001) == "10.9.9.9"  # another service of that host, allowed network


def test_a_service_on_this_machine_is_refused_at_every_address_the_machine_has():
    policy = EgressPolicy(allowed_networks=(ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")),
                          own_services=(("localhost", 5432),))
    for address in ("127.0.0.1", "127.0.0.53", "::1"):
        with pytest.raises(EgressRefused, match="own services"):
            policy.connect_address(address, 5432)
    assert policy.connect_address("127.0.0.1", 5433) == "127.0.0.1"


def test_a_name_is_refused_when_any_address_it_resolves_to_is(monkeypatch):
    table = {"mixed.example": ["93.184.216.34", "10.1.2.3"], "public.example": ["93.184.216.34"]}
    monkeypatch.setattr(egress, "resolver", lambda host, port: table[host])
    with pytest.raises(EgressRefused, match="resolves to 10.1.2.3, which is a private address"):
        EgressPolicy().connect_address("mixed.example", 443)
    assert EgressPolicy().check_url("https://public.example/hook").address == "93.184.216.34"
    table["public.example"] = ["127.0.0.1"]  # rebound: the next connection is judged again
    with pytest.raises(EgressRefused, match="loopback"):
        EgressPolicy().check_url("https://public.example/hook")


def test_settings_name_the_deployments_own_services(tmp_path):
    from domain.settings import Settings

    settings = Settings(env="development", database_url="postgresql+psycopg://u@127.0.0.1:5433/db",
                        broker_url="redis://127.0.0.1:6380/0", storage_url="s3://bucket/prefix",
                        s3_endpoint_url="http://127.0.0.1:9000", egress_denied_endpoints=["[::1]:8000", "api:8443"])
    policy = EgressPolicy.from_settings(settings)
    assert set(policy.own_services) == {("127.0.0.1", 9000), ("127.0.0.1", 5433), ("127.0.0.1", 6380), ("::1", 8000),
                                        ("api", 8443)}
    assert ipaddress.ip_network("127.0.0.0/8") in policy.allowed_networks  # development: loopback allowed...
    for port in (9000, 5433, 6380, 8000):
        with pytest.raises(EgressRefused, match="own services"):  # ...but never our own services on it
            policy.connect_address("127.0.0.1", port)
    with pytest.raises(ValueError, match="CIDR"):
        Settings(env="development", egress_allowed_networks="10.0.0.0/33")
