"""Requests to user-given URLs (webhook endpoints) that cannot be turned against our own network (SSRF).

A URL is checked by what it *resolves to*, not by how it is spelled: `http://vm/`, `http://2130706433/`
and `http://127.1/` are all loopback. `check_outbound_url` resolves the host once, refuses it if *any*
address is loopback, private, link-local, multicast, reserved or a cloud metadata endpoint, and returns
the address it checked; `send_pinned` then connects to exactly that address (the URL's host goes in the
`Host` header and the TLS SNI, so virtual hosts and certificates still work). There is no second
lookup a rebinding DNS server could answer differently, and redirects are never followed (a 3xx is a
failed delivery), so a public endpoint cannot bounce a request inward either.

`allow_private=True` (DRAFTSMITH_WEBHOOK_ALLOW_PRIVATE_TARGETS, for development and tests) permits
loopback and private networks; metadata endpoints, multicast and unspecified addresses stay refused.
Used for webhook registration and for every delivery attempt. The worker fetches targets and data
only from deployment-configured object storage and Hub endpoints, not from user-given hosts.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# Instance metadata services hand out cloud credentials: refused even where private targets are allowed.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean...
    "169.254.170.2",  # AWS ECS task credentials
    "100.100.100.200",  # Alibaba Cloud
    "fd00:ec2::254",  # AWS over IPv6
))
INTERNAL_NAME_SUFFIXES = (".localhost", ".internal", ".local")

Resolver = Callable[[str, int], list[str]]


class OutboundRefused(ValueError):
    """The URL may not be requested; the message says why, fit for the client."""


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# Tests replace this (a stub resolver); production uses the system's.
resolver: Resolver = system_resolver


def _embedded_ipv4(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped ::ffff:a.b.c.d, 6to4, Teredo), judged as itself."""
    if isinstance(address, ipaddress.IPv6Address):
        for embedded in (address.ipv4_mapped, address.sixtofour, address.teredo[1] if address.teredo else None):
            if embedded is not None:
                return embedded
    return address


def address_problem(address: IPAddress, *, allow_private: bool) -> str | None:
    """Why connecting to `address` is refused, or None."""
    inner = _embedded_ipv4(address)
    if address in METADATA_ADDRESSES or inner in METADATA_ADDRESSES:
        return f"{address} is a cloud metadata endpoint"
    if inner.is_multicast or inner.is_unspecified:
        return f"{address} is a multicast or unspecified address"
    if allow_private:
        return None
    if inner.is_loopback:
        return f"{address} is a loopback address"
    if inner.is_link_local:
        return f"{address} is a link-local address"
    if inner.is_private or inner.is_reserved or not inner.is_global:
        return f"{address} is a private or reserved address"
    return None


def check_url_syntax(url: str, *, allow_private: bool) -> str | None:
    """Why `url` is unacceptable as written (scheme, host, credentials, internal names), or None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "must include a host"
    if parts.username or parts.password:
        return "must not embed credentials; authenticate receivers with the signature instead"
    if port == 0:
        return "must not use port 0"
    host = parts.hostname.rstrip(".")
    if not allow_private and (host == "localhost" or host.endswith(INTERNAL_NAME_SUFFIXES)):
        return f"host {host!r} is internal; webhooks go to publicly reachable endpoints"
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return None
    problem = address_problem(literal, allow_private=allow_private)
    return f"address {problem}; webhooks go to publicly reachable endpoints" if problem else None


@dataclass(frozen=True)
class CheckedTarget:
    url: str
    host: str
    port: int
    address: str  # the one address that was checked and will be connected to


def check_outbound_url(url: str, *, allow_private: bool) -> CheckedTarget:
    """Resolve `url`'s host, check every address it resolves to, and return the target pinned to one of them.

    Raises OutboundRefused naming the problem (including "does not resolve").
    """
    problem = check_url_syntax(url, allow_private=allow_private)
    if problem:
        raise OutboundRefused(problem)
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolver(host, port)]
        except (OSError, UnicodeError, ValueError) as exc:
            raise OutboundRefused(f"host {host!r} does not resolve ({type(exc).__name__})") from None
    if not addresses:
        raise OutboundRefused(f"host {host!r} does not resolve")
    for address in addresses:  # every address: a name with one public and one private address is refused
        problem = address_problem(address, allow_private=allow_private)
        if problem:
            raise OutboundRefused(f"host {host!r} resolves to {problem}; webhooks go to publicly reachable endpoints")
    return CheckedTarget(url=url, host=host, port=port, address=str(addresses[0]))


def outbound_client(timeout_seconds: float) -> httpx.Client:
    # trust_env=False: no proxy from the environment may stand between us and the checked address.
    return httpx.Client(timeout=timeout_seconds, follow_redirects=False, trust_env=False)


def send_pinned(client: httpx.Client, target: CheckedTarget, *, content: bytes,
                headers: dict[str, str]) -> httpx.Response:
    """POST to `target.address`, presenting the URL's host (Host header, TLS SNI and certificate check)."""
    url = httpx.URL(target.url)
    host_header = url.netloc.decode("ascii").rsplit("@", 1)[-1]
    pinned = url.copy_with(host=target.address)
    extensions = {"sni_hostname": target.host} if url.scheme == "https" else {}
    return client.post(pinned, content=content, headers={**headers, "host": host_header}, extensions=extensions)
