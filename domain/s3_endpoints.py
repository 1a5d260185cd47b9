"""How a host written in an s3:// URI is read: whether it names the deployment's own storage server.

The storage scoping rule (domain/storage_scope.py) reads a URI as the deployment's own S3 server would: a URI is
text our server interprets. (Where an organisation's *endpoint* leads is judged by address: domain/egress.py.)
A server has many spellings, and comparing strings lets all but one through. `host_key` folds them into one key:

- case, trailing dots, `[...]` brackets, a `:port`, user info (`x@host`), an IPv6 zone (`%eth0`), `%`-escapes and
  Unicode compatibility forms (fullwidth digits and dots, NFKC);
- IPv4 in every form the C library's `inet_aton` (and so curl, browsers, some HTTP stacks) accepts: `127.1`,
  `2130706433`, `0x7f000001`, `0177.0.0.1`, `0x7f.1`; IPv4-mapped and IPv4-compatible IPv6 (`::ffff:127.0.0.1`,
  `::ffff:7f00:1`, `::127.0.0.1`) as the IPv4 address they carry;
- every spelling of *this machine* as one key, `LOOPBACK`: `localhost` and `*.localhost`, all of 127.0.0.0/8, `::1`,
  the unspecified `0.0.0.0` / `::` (connecting to it reaches this machine on Linux), and any address assigned to
  one of this machine's interfaces (a server bound to all interfaces answers on each). A storage server on the
  same machine as the API or the worker is then recognised however a URI names it.

The deployment's endpoint host is also resolved (`endpoint_host_keys`): a DNS name that points at the storage
server is the storage server. Parts of a user's URI are never resolved: they are compared by key only.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
import unicodedata
from urllib.parse import unquote, urlsplit

from domain.egress import is_this_machine

AWS_S3_HOST_RE = re.compile(r"^(?:[a-z0-9-]+\.)*s3(?:[.-][a-z0-9-]+)*\.amazonaws\.com(?:\.cn)?$")
LOOPBACK = "<this machine>"
"""The one key of every spelling of the machine that makes the connection."""

_INET_ATON_PART_RE = re.compile(r"^(?:0x[0-9a-f]*|0[0-7]*|[1-9][0-9]*)$")
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_LABEL_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})  # IDNA's other label separators


def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """IPv4 as inet_aton reads it: 1 to 4 parts, each decimal, 0x-hex or 0-octal; the last part fills the bytes the
    others leave (`127.1` is 127.0.0.1, `2130706433` too)."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(_INET_ATON_PART_RE.match(part) for part in parts):
        return None
    values = [int(part, 16) if part.startswith("0x") else int(part, 8) if part.startswith("0") else int(part)
              for part in parts]
    head, last = values[:-1], values[-1]
    if any(value > 255 for value in head) or last >= 256 ** (5 - len(parts)):
        return None
    number = 0
    for value in head:
        number = number << 8 | value
    return ipaddress.IPv4Address(number << 8 * (5 - len(parts)) | last)


def ip_literal(text: str) -> _Address | None:
    """The address a host spelling denotes without any lookup, IPv4 carried in IPv6 unwrapped; None for a name."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return _inet_aton(text)
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if int(address) >> 32 == 0 and int(address) > 1:  # ::a.b.c.d, deprecated but still routed by some stacks
            return ipaddress.IPv4Address(int(address))
    return address


def canonical_host(name: str) -> str:
    """One spelling of a host as written in a URI, an endpoint URL's netloc, or a bucket position (see the module
    docstring); an address in its standard form."""
    text = unicodedata.normalize("NFKC", unquote(name)).strip().lower().rpartition("@")[2]
    text = text.translate(_LABEL_DOTS)
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # host:port (a bare IPv6 address has several colons)
        text = text.partition(":")[0]
    text = text.split("%", 1)[0].rstrip(".")
    address = ip_literal(text)
    return str(address) if address is not None else text


def host_key(name: str) -> str:
    """The key two spellings of one server share (module docstring). Never resolves a name."""
    host = canonical_host(name)
    if host == "localhost" or host.endswith(".localhost"):
        return LOOPBACK
    address = ip_literal(host)
    if address is not None and is_this_machine(address):
        return LOOPBACK
    return host


@functools.lru_cache(maxsize=256)
def endpoint_host_keys(host: str) -> frozenset[str]:
    """Every key an endpoint host is known by: its own and those of the addresses it resolves to. Only endpoints
    from settings and organisation secrets are resolved, never a part of a user's URI."""
    keys = {host_key(host)}
    try:
        infos = socket.getaddrinfo(canonical_host(host), None)
    except (OSError, UnicodeError):
        infos = []
    keys |= {host_key(str(info[4][0])) for info in infos}
    return frozenset(keys)


def is_aws_s3_host(host: str) -> bool:
    host = canonical_host(host)
    return bool(AWS_S3_HOST_RE.match(host)) or host.endswith((".amazonaws.com", ".amazonaws.com.cn"))


def host_port(endpoint_url: str | None) -> tuple[str, int] | None:
    """(canonical host, port) of an endpoint URL; None for AWS (no endpoint configured, or any amazonaws.com host)."""
    if not endpoint_url:
        return None
    parts = urlsplit(endpoint_url if "://" in endpoint_url else f"https://{endpoint_url}")
    host = canonical_host(parts.netloc)
    if is_aws_s3_host(host):
        return None
    try:
        port = parts.port or (80 if parts.scheme == "http" else 443)
    except ValueError:
        port = 443
    return host, port


def is_endpoint_host(name: str, endpoint_url: str | None) -> bool:
    """Whether `name` (a part of a URI, never resolved) spells the host of `endpoint_url`, or any AWS S3 host
    (S3-compatible servers that route by host take those too)."""
    if is_aws_s3_host(name):
        return True
    known = host_port(endpoint_url)
    return known is not None and host_key(name) in endpoint_host_keys(known[0])


def virtual_host_label(endpoint_url: str | None) -> str | None:
    """The bucket a virtual-host style endpoint (`http://<bucket>.<server>`) names in its host, if it could."""
    if not endpoint_url:
        return None
    host = canonical_host(urlsplit(endpoint_url if "://" in endpoint_url else f"https://{endpoint_url}").netloc)
    if ip_literal(host) is not None:
        return None
    label, dot, _ = host.partition(".")
    return label if dot and label else None


def endpoint_path(endpoint_url: str | None) -> list[str]:
    """The path segments of an endpoint URL. botocore keeps them and appends `/<bucket>/<key>` (path style), so an
    endpoint `http://server/<bucket>` turns `s3://x/key` into object `x/key` of `<bucket>`."""
    if not endpoint_url:
        return []
    path = urlsplit(endpoint_url if "://" in endpoint_url else f"https://{endpoint_url}").path
    return [unquote(segment) for segment in path.split("/") if segment]
