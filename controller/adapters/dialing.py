"""The address a tenant's server is dialled at, checked when it is dialled (DNS rebinding, issue 27).

The operator judges a tenant's URL before its pass, names resolved included (entry/egress.py); a name may still
resolve to a public address then and to 127.0.0.1 a moment later, when the sender or the tracker connects. So a
connection made for a tenant resolves the host once, here, is refused when any address it resolves to is refused
(the same rule as the pass's check), and goes to an address that was checked — the URL's host name stays in the
Host header and in TLS's SNI and certificate check.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

from controller.api.urls import IP, address_problem, ip_of

AddressCheck = Callable[[IP], str]  # why the address may not be dialled ("" when it may)


class RefusedAddress(ConnectionError):
    """The host resolved, when dialled, to an address the operator's policy refuses."""


def dial_address(host: str, port: int, check: AddressCheck = address_problem) -> str:
    """The address to connect to for `host`: every address it resolves to now passes `check`, else
    RefusedAddress; OSError when it does not resolve."""
    written = ip_of(host)
    addresses = [str(written)] if written is not None else [
        str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
    for address in addresses:
        if problem := check(ipaddress.ip_address(address.partition("%")[0])):
            raise RefusedAddress(f"{host} {problem} when dialled (the operator's policy)")
    if not addresses:
        raise OSError(f"{host} has no address")
    return addresses[0]
