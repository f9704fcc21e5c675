"""Which of this host's addresses another host reaches it on.

A host name can resolve to 127.0.1.1 (Debian's /etc/hosts) or to nothing at all, so neither
``socket.gethostname()`` nor ``getfqdn()`` tells another host where to connect. The kernel's
routing table does: the source address of a route to the peer is the address the peer sees.
"""

from __future__ import annotations

import socket

# no packet is sent: connect() on a UDP socket only selects the route
_ANY_PORT = 9


def wildcard(host: str) -> bool:
    """``0.0.0.0``, ``::`` or empty: bound on every interface, so no address to hand out."""
    return host in ("", "0.0.0.0", "::")


def toward(peer: str) -> str | None:
    """The local address this host's packets to ``peer`` (a name or an address) leave from; None
    if it has no route."""
    try:
        infos = socket.getaddrinfo(peer, _ANY_PORT, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, _type, _proto, _name, sockaddr in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect(sockaddr)
            except OSError:
                continue
            return probe.getsockname()[0]
    return None


def route_source(peer: str) -> str:
    """``toward``, where a missing route is an error (``OSError``)."""
    local = toward(peer)
    if local is None:
        raise OSError(f"no route to {peer}")
    return local


def advertised(bound: str, peer: str) -> str:
    """The address to tell ``peer`` for a socket bound to ``bound``: itself, unless it is a
    wildcard, then the address the route to ``peer`` leaves from."""
    return route_source(peer) if wildcard(bound) else bound
