"""The one egress policy: every connection to a URL an organisation gave us, judged by the address it reaches.

Organisations hand us URLs: webhook endpoints, the `endpoint_url` of an S3 secret. Each is a way to make our
machines open a connection on someone's behalf, from inside our network, possibly with our credentials nearby.

Threat model. The organisation is hostile. It wants our processes to connect to (a) this deployment's own
services (the storage server that holds every organisation's objects, the database, the broker, the API), to
read or write another organisation's data through them; (b) anything else on our networks (private ranges,
the machine's own loopback and link-local addresses, a cloud metadata service that hands out credentials).
It controls the URL text and, through its own DNS, what a name resolves to and when (rebinding).

The rule judges *what an address is*, never how a URL spells it (earlier rounds refused spellings, and each
round found another spelling). `EgressPolicy.connect_address(host, port)` resolves the host once and refuses
the connection if *any* address it resolves to is:
- a cloud metadata endpoint: always;
- one of this deployment's own services, as (address, port): the storage endpoint, the database, the broker,
  and `egress_denied_endpoints`; a service on this machine counts at every address this machine has (a server
  bound to all interfaces answers on each): always, whatever the allow-list says;
- not a global unicast address (loopback, link-local, private, unique-local, shared/CGNAT, unspecified,
  multicast, reserved, documentation), or an IPv6 address that carries an IPv4 one (mapped, SIIT, NAT64,
  6to4, Teredo, IPv4-compatible): unless it lies in a network the deployment allow-lists
  (`egress_allowed_networks`; loopback and private ranges by default in development).
It returns the first address, and the caller connects to exactly that address (no second lookup a rebinding
DNS server could answer differently). Redirects are never followed by webhook deliveries, nor by S3 clients of a
custom endpoint (refused on the first hop as a storage error: `domain/storage.py` StorageRedirected); S3 clients
open every connection, a retried one included, through the same check (`domain/storage.py`'s pinned
connections).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from domain.settings import Settings

if TYPE_CHECKING:  # the HTTP client is loaded by the processes that deliver webhooks only
    import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# Instance metadata services hand out cloud credentials: refused even where private targets are allowed.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean...
    "169.254.170.2",  # AWS ECS task credentials
    "100.100.100.200",  # Alibaba Cloud
    "fd00:ec2::254",  # AWS over IPv6
))
# IPv6 ranges whose addresses carry an IPv4 address that some stack on the path may unwrap and connect to.
IPV4_CARRYING_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "::ffff:0:0/96",  # IPv4-mapped
    "::ffff:0:0:0/96",  # SIIT (IPv4-translated)
    "64:ff9b::/96", "64:ff9b:1::/48",  # NAT64, well-known and local-use prefixes
    "2002::/16",  # 6to4
    "2001::/32",  # Teredo
    "::/96",  # IPv4-compatible (deprecated; still routed by some stacks)
))

Resolver = Callable[[str, int], list[str]]


class EgressRefused(ValueError):
    """The URL may not be connected to; the message says why, fit for the client."""


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# Tests replace this (a stub resolver); production uses the system's.
resolver: Resolver = system_resolver


def _address(text: str) -> IPAddress:
    return ipaddress.ip_address(text.split("%", 1)[0])  # a zone (`fe80::1%eth0`) names an interface, not a host


@functools.lru_cache(maxsize=4096)
def is_this_machine(address: IPAddress) -> bool:
    """Whether `address` reaches this machine: loopback, unspecified, or an address one of its interfaces has
    (a socket can bind to it; no packet is sent). A link-local IPv6 address is tried on every interface."""
    if address.is_loopback or address.is_unspecified:
        return True
    if address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"):
        return False  # a UDP socket binds to these on any machine: they say nothing about whose they are
    scopes = [0]
    if address.version == 6 and address.is_link_local:
        scopes = [index for index, _name in socket.if_nameindex()]
    for scope in scopes:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        where = (str(address), 0, 0, scope) if address.version == 6 else (str(address), 0)
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.bind(where)
            return True
        except OSError:
            continue
    return False


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address of an IPv4-carrying range holds (6to4 and Teredo in their own places)."""
    if not isinstance(address, ipaddress.IPv6Address) or address.is_loopback or address.is_unspecified:
        return None
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in network for network in IPV4_CARRYING_NETWORKS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_class(address: IPAddress) -> str | None:
    """The class of address the policy refuses by default ("a loopback address"...), or None for global unicast."""
    if embedded_ipv4(address) is not None:
        return "an IPv6 address that carries an IPv4 address"
    checks = (("is_unspecified", "an unspecified address"), ("is_loopback", "a loopback address"),
              ("is_link_local", "a link-local address"), ("is_multicast", "a multicast address"),
              ("is_site_local", "a site-local address"), ("is_private", "a private address"),
              ("is_reserved", "a reserved address"))
    for attribute, name in checks:
        if getattr(address, attribute, False):
            return name
    if isinstance(address, ipaddress.IPv4Address) and address in ipaddress.ip_network("100.64.0.0/10"):
        return "a shared (carrier-grade NAT) address"
    return None if address.is_global else "a non-global address"


def _service_endpoints(urls: Iterable[tuple[str | None, int]]) -> list[tuple[str, int]]:
    """(host, port) of each service URL given with its scheme's default port; SQLite and file brokers have none."""
    found = []
    for url, default_port in urls:
        if not url or "://" not in url:
            continue
        parts = urlsplit(url)
        try:
            port = parts.port or default_port
        except ValueError:
            continue
        if parts.hostname:
            found.append((parts.hostname, port))
    return found


@dataclass(frozen=True)
class EgressPolicy:
    """The deployment's rule for connections on an organisation's behalf (module docstring)."""

    allowed_networks: tuple[IPNetwork, ...] = ()
    own_services: tuple[tuple[str, int], ...] = ()
    """(host, port) of each service of this deployment; hosts are resolved when judged."""

    @classmethod
    def from_settings(cls, settings: Settings) -> EgressPolicy:
        s3_default = 443 if (settings.s3_endpoint_url or "https:").startswith("https:") else 80
        services = _service_endpoints([(settings.s3_endpoint_url, s3_default), (settings.database_url, 5432),
                                       (settings.broker_url, 6379)])
        for endpoint in settings.egress_denied_endpoints:
            host, _, port = endpoint.rpartition(":")
            services.append((host.strip("[]"), int(port)))
        return cls(tuple(ipaddress.ip_network(n, strict=False) for n in settings.egress_allowed_networks),
                   tuple(services))

    @functools.cached_property
    def _services(self) -> tuple[tuple[frozenset[IPAddress], int, bool], ...]:
        """Each own service's addresses, its port, and whether it runs on this machine: resolved once per policy,
        not at every connection it judges."""
        services = []
        for host, port in self.own_services:
            try:
                addresses = frozenset(_address(a) for a in resolver(host, port))
            except (OSError, UnicodeError, ValueError):
                continue  # a service name this machine cannot resolve cannot be reached through it either
            services.append((addresses, port, any(is_this_machine(a) for a in addresses)))
        return tuple(services)

    def _own_service_problem(self, address: IPAddress, port: int) -> str | None:
        for addresses, service_port, on_this_machine in self._services:
            if service_port == port and (address in addresses or (on_this_machine and is_this_machine(address))):
                return f"one of this deployment's own services (port {port})"
        return None

    def address_problem(self, address: IPAddress, port: int) -> str | None:
        """What (address, port) is, when the policy refuses it ("a loopback address"...), or None."""
        if address in METADATA_ADDRESSES or embedded_ipv4(address) in METADATA_ADDRESSES:
            return "a cloud metadata endpoint"
        own = self._own_service_problem(address, port)
        if own:
            return own
        if any(address in network for network in self.allowed_networks):
            return None
        return address_class(address)

    def connect_address(self, host: str, port: int) -> str:
        """Resolve `host` once, check every address it resolves to, and return the one to connect to.
        Raises EgressRefused naming the problem (including "does not resolve")."""
        host = host.strip("[]").rstrip(".")
        try:
            addresses = [_address(host)]
        except ValueError:
            try:
                addresses = [_address(a) for a in resolver(host, port)]
            except (OSError, UnicodeError, ValueError) as exc:
                raise EgressRefused(f"host {host!r} does not resolve ({type(exc).__name__})") from None
        if not addresses:
            raise EgressRefused(f"host {host!r} does not resolve")
        for address in addresses:  # every address: a name with one public and one private address is refused
            problem = self.address_problem(address, port)
            if problem:
                shown = str(address) if str(address) == host else f"host {host!r} resolves to {address}, which"
                raise EgressRefused(f"{shown} is {problem}; only publicly reachable endpoints are allowed")
        return str(addresses[0])

    def check_url(self, url: str) -> CheckedTarget:
        """`url`'s syntax, then `connect_address` for its host and port: the target pinned to the checked address."""
        problem = url_syntax_problem(url)
        if problem:
            raise EgressRefused(problem)
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return CheckedTarget(url=url, host=host, port=port, address=self.connect_address(host, port))


def url_syntax_problem(url: str) -> str | None:
    """Why `url` is unacceptable as written (scheme, host, port, embedded credentials), or None. Where it leads
    is judged by address (`EgressPolicy.connect_address`), not here."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "must include a host"
    if parts.username is not None or parts.password is not None:
        return "must not embed credentials in the URL"
    if port == 0:
        return "must not use port 0"
    return None


@dataclass(frozen=True)
class CheckedTarget:
    url: str
    host: str
    port: int
    address: str  # the one address that was checked and will be connected to


def outbound_client(timeout_seconds: float) -> httpx.Client:
    import httpx

    # trust_env=False: no proxy from the environment may stand between us and the checked address.
    return httpx.Client(timeout=timeout_seconds, follow_redirects=False, trust_env=False)


def send_pinned(client: httpx.Client, target: CheckedTarget, *, content: bytes,
                headers: dict[str, str]) -> httpx.Response:
    """POST to `target.address`, presenting the URL's host (Host header, TLS SNI and certificate check)."""
    import httpx

    url = httpx.URL(target.url)
    host_header = url.netloc.decode("ascii").rsplit("@", 1)[-1]
    pinned = url.copy_with(host=target.address)
    extensions = {"sni_hostname": target.host} if url.scheme == "https" else {}
    return client.post(pinned, content=content, headers={**headers, "host": host_header}, extensions=extensions)
