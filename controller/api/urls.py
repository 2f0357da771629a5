"""Where a URL a tenant wrote would make the operator connect (issue 27): only public http(s) servers.

The operator dials a tenant's tracking URI and webhooks from inside the cluster, where loopback services, the
cloud's metadata endpoint, the API server and every private address are reachable, and an answer comes back in
the tenant's status: a read-SSRF. So a tenant's URL must name a public host, by a name or an address in any
spelling a client accepts (`2130706433`, `0x7f.1`, `[::ffff:127.0.0.1]`, `LOCALHOST.`, fullwidth digits), unless
the admin allowed its prefix. Pure: the addresses a name resolves to are judged by `address_problem`, given them.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Sequence
from urllib.parse import SplitResult, urlsplit

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
WEB_SCHEMES = ("http", "https")
# Names that are the cluster's own or the cloud's: the API server, Services (a resolver's search list turns
# `mlflow.team-b` into one too, which only the resolved address shows), metadata endpoints, mDNS and .internal.
INTERNAL_NAMES = ("localhost", "*.localhost", "metadata", "metadata.google.internal", "*.internal", "kubernetes",
                  "kubernetes.default", "kubernetes.default.svc*", "*.svc", "*.cluster.local", "*.local")
METADATA = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200"))
SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: many clusters' pod and service ranges
NAT64 = ipaddress.ip_network("64:ff9b::/96")


def is_url(value: str) -> bool:
    """What the run-dir and report adapters hand to fsspec instead of the local disk."""
    return "://" in value


def url_problem(url: str, denied_hosts: Sequence[str] = ()) -> str:
    """Why the operator must not dial `url` for a tenant ("" when it names a public http(s) host), judged on the
    text alone; `denied_hosts` adds names or addresses (the API server's in-cluster address)."""
    if any(char.isspace() or char in "\\%" or ord(char) < 32 for char in url):
        return "holds whitespace, a backslash or %-escapes, which clients read differently"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if parts.scheme.lower() not in WEB_SCHEMES:
        return f"has the scheme {parts.scheme or '(none)'}:, not http(s)"
    if "@" in parts.netloc:
        return "carries a login (user@host): credentials go in a Secret, never in the URL"
    host = host_of(parts)
    if not host:
        return "names no valid host"
    if host in {name.lower().rstrip(".") for name in denied_hosts}:
        return f"names {host}, the Kubernetes API server"
    if any(fnmatch.fnmatchcase(host, pattern) for pattern in INTERNAL_NAMES):
        return f"names {host}, a name of the cluster, the cloud or this host"
    if "." not in host and ip_of(host) is None:
        return f"names {host}, a single-label name the resolver's search list completes to a Service"
    if looks_numeric(host) and ip_of(host) is None:
        return f"names {host}, which is neither a host name nor an address"
    address = ip_of(host)
    return "" if address is None else address_problem(address)


def host_of(parts: SplitResult) -> str:
    """The host as a client connects to it: lowercase, IDNA-mapped (fullwidth digits become digits), no trailing
    dot, no brackets; "" when it is not a valid host."""
    host = parts.hostname or ""
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            return ""
    host = host.lower().removesuffix(".")
    return host if host and all(host.split(".")) else ""


def looks_numeric(host: str) -> bool:
    """A last label of digits or 0x… makes a client read the whole host as an IPv4 address (WHATWG URL)."""
    last = host.rsplit(".", 1)[-1]
    return last.isdigit() or last.startswith("0x")


def ip_of(host: str) -> IP | None:
    """The address a host literal means, in every IPv4 form `inet_aton` and browsers accept: 1 to 4 parts, each
    decimal, octal (leading 0) or hex (0x), the last filling the remaining bytes; None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    numbers = []
    for part in parts:
        try:
            numbers.append(int(part[2:] or "0", 16) if part.startswith("0x") else
                           int(part, 8) if part.startswith("0") and len(part) > 1 else int(part, 10))
        except ValueError:
            return None
    *leading, last = numbers
    if any(n > 255 for n in leading) or last >= 256 ** (5 - len(numbers)):
        return None
    value = last
    for index, byte in enumerate(leading):
        value += byte << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def address_problem(address: IP) -> str:
    """Why the operator must not connect to `address` ("" for a public unicast address). An IPv6 address that
    carries an IPv4 one (mapped, 6to4, NAT64) is judged by that."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour or (
            ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) if address in NAT64 else None)
        if inner is not None:
            return address_problem(inner)
    kind = ("a cloud metadata address" if address in METADATA else
            "the unspecified address" if address.is_unspecified else
            "a loopback address" if address.is_loopback else
            "a link-local address" if address.is_link_local else
            "a multicast address" if address.is_multicast else
            "a private address" if address.is_private or address in SHARED else
            "a reserved address" if address.is_reserved or not address.is_global else "")
    return f"reaches {address}, {kind}" if kind else ""


def under_prefix(url: str, prefixes: Sequence[str]) -> bool:
    """Is `url` at or below one of the admin's `prefixes`: the same scheme, host and port, and a path below the
    prefix's at a '/' boundary (`http://h/a` never admits `http://h/ab` nor `http://h.evil`)."""
    try:
        parts = urlsplit(url)
        target = _origin(parts)
    except ValueError:
        return False
    if "@" in parts.netloc:
        return False
    for prefix in prefixes:
        try:
            allowed = urlsplit(prefix)
            if _origin(allowed) != target:
                continue
        except ValueError:
            continue
        base = allowed.path.rstrip("/")
        if parts.path == base or parts.path.startswith(base + "/") or not base:
            return True
    return False


def _origin(parts: SplitResult) -> tuple[str, str, int | None]:
    scheme = parts.scheme.lower()
    return scheme, host_of(parts), parts.port or {"http": 80, "https": 443}.get(scheme)
