"""``Egress``: which hosts a sandboxed job may reach through its parent's proxy, and the rules.

``Sandbox(network=Egress(allow=[...]))`` gives the job a network namespace of its own with only
loopback; its one way out is a proxy in the parent (``zett_agent.process._host._proxy``), which
asks ``EgressRules.decide`` about every connection. Everything here is pure: parsing the
patterns, normalising what a job asks for, classifying addresses; no I/O.

Patterns (``allow=``):

- ``"api.github.com"``: that name, port 443; ``"api.github.com:8443"``: port 8443;
- ``"*.example.org"``: any name below ``example.org`` (not ``example.org`` itself), port 443;
- ``"203.0.113.7:80"``, ``"[2001:db8::1]:443"``, ``"127.0.0.1:8080"``: an address, with its
  port (443 when none is given). An address listed here may be reached even when it is a
  loopback, private or link-local one.

A name is compared after normalisation (case folded, a trailing dot dropped, non-ASCII labels
encoded with IDNA). What a job asks for is an address when it is an IP literal in any notation
the C library accepts (``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``::ffff:127.0.0.1``), and
then it must match an address pattern: an address is never matched against names. A name the
proxy resolves itself is refused at a loopback, private, link-local, multicast, reserved or
unspecified address unless that address is listed. ``hosts=`` maps names to addresses the
proxy uses as they are (a name there is trusted at its address: for tests and pinning).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..._checks import check_int

__all__ = ["Egress", "EgressRules", "Target", "normalise_name", "parse_target"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_DEFAULT_PORT = 443
#: a DNS label after IDNA: letters, digits, hyphens (and underscores, which some hosts use)
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
#: what the C library's inet_aton may read as an IPv4 address (decimal, octal, hex parts)
_LEGACY_IPV4 = re.compile(r"^(?:0[xX][0-9a-fA-F]+|[0-9]+)(?:\.(?:0[xX][0-9a-fA-F]+|[0-9]+)){0,3}$")


def normalise_name(name: str) -> str:
    """A DNS name as rules compare it: case folded, no trailing dot, IDNA-encoded labels.

    Raises ``ValueError`` for a name that is no valid host name.
    """
    text = name.strip().rstrip(".").lower()
    if not text or len(text) > 253:
        raise ValueError(f"{name!r:.80} is not a host name")
    labels = []
    for label in text.split("."):
        if not label.isascii():
            try:
                label = label.encode("idna").decode("ascii")
            except UnicodeError:
                raise ValueError(f"{name!r:.80} is not a valid internationalised name") from None
        if not _LABEL.match(label):
            raise ValueError(f"{name!r:.80} is not a host name (label {label!r:.40})")
        labels.append(label)
    return ".".join(labels)


def _address(text: str) -> IPAddress | None:
    """``text`` as an IP address when it is an IP literal in any notation, else ``None``."""
    candidate = text.strip()
    if candidate.startswith("[") and candidate.endswith("]"):
        candidate = candidate[1:-1]
    if "%" in candidate:  # a zone id: never a host of the outside
        raise ValueError(f"{text!r:.80}: scoped addresses are not allowed")
    try:
        address = ipaddress.ip_address(candidate)
    except ValueError:
        if not _LEGACY_IPV4.match(candidate):
            return None
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(candidate))
        except OSError:
            raise ValueError(f"{text!r:.80} is no address") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:a.b.c.d is a.b.c.d
    return address


def _split_port(text: str, what: str) -> tuple[str, int]:
    """``host[:port]`` (``[v6]:port`` for IPv6) into the host and its port (443 when none)."""
    host, port = text, None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"{what} {text!r:.80}: an IPv6 address needs its closing ']'")
        host, rest = text[: end + 1], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{what} {text!r:.80}: write [address]:port")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    if port is None:
        return host, _DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} {text!r:.80}: the port must be a number from 1 to 65535")
    return host, int(port)


@dataclass(frozen=True)
class _Rule:
    kind: Literal["name", "suffix", "address"]
    value: str | IPAddress
    port: int
    text: str


def _parse_pattern(pattern: object) -> _Rule:
    if not isinstance(pattern, str):
        raise TypeError(
            f"Egress(allow=...) takes host patterns as str, got {type(pattern).__name__} "
            f"{pattern!r:.40}; write allow=['api.example.com', '*.example.org:443']"
        )
    host, port = _split_port(pattern.strip(), "Egress(allow=...) pattern")
    address = _address(host)
    if address is not None:
        return _Rule("address", address, port, pattern)
    if host.startswith("*."):
        return _Rule("suffix", normalise_name(host[2:]), port, pattern)
    if "*" in host:
        raise ValueError(
            f"Egress(allow=...) pattern {pattern!r:.80}: a wildcard may only open a name "
            "('*.example.com')"
        )
    return _Rule("name", normalise_name(host), port, pattern)


def _is_public(address: IPAddress) -> bool:
    return not (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or (isinstance(address, ipaddress.IPv4Address) and address in _SHARED)
    )


_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT: not the internet either


@dataclass(frozen=True)
class Target:
    """What a job asked for, normalised: a name or an address, and a port."""

    name: str | None
    address: IPAddress | None
    port: int

    @property
    def host(self) -> str:
        """The host as events and errors show it."""
        return self.name if self.name is not None else str(self.address)


def parse_target(host: str, port: int) -> Target:
    """What a job asked for (a CONNECT's authority, a URL's host, a SOCKS5 address).

    Raises ``ValueError`` for a host that is neither a valid name nor an address, or a port out
    of range.
    """
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range")
    address = _address(host)
    if address is not None:
        return Target(None, address, port)
    return Target(normalise_name(host), None, port)


@dataclass(frozen=True)
class Egress:
    """The hosts a sandboxed job may reach, through its parent (``Sandbox(network=Egress())``).

    - ``allow``: host patterns (see the module: ``"api.github.com"``, ``"*.example.org"``, an
      optional ``:port``, default 443; addresses as ``"203.0.113.7:80"`` or
      ``"[2001:db8::1]:443"``). Nothing else is reachable.
    - ``hosts``: a static name map, ``{"api.test": "127.0.0.1"}``: these names resolve to these
      addresses (and are reached there, loopback included), not through DNS; for tests and
      pinning. A name here must still match an ``allow`` pattern.
    - ``max_bytes``: bytes a task may move through the proxy, both ways together; a transfer
      under way is cut when it would go past it (default: no bound).
    - ``max_connections``: connections a task may have open through the proxy at once
      (default 32); beyond it a new one is refused.

    Raises ``TypeError`` and ``ValueError`` at construction for a bad field, naming it.
    """

    allow: Sequence[str] = ()
    hosts: Mapping[str, str] | None = None
    max_bytes: int | None = None
    max_connections: int = 32
    _rules: tuple[_Rule, ...] = field(default=(), init=False, repr=False, compare=False)
    _hosts: tuple[tuple[str, IPAddress], ...] = field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if isinstance(self.allow, str) or not isinstance(self.allow, Iterable):
            raise TypeError(
                f"Egress(allow=...) must be a list of host patterns, got "
                f"{type(self.allow).__name__} {self.allow!r:.60}; write allow=[{self.allow!r:.40}]"
            )
        allow = tuple(self.allow)
        object.__setattr__(self, "allow", allow)
        object.__setattr__(self, "_rules", tuple(_parse_pattern(p) for p in allow))
        pinned: list[tuple[str, IPAddress]] = []
        if self.hosts is not None:
            if not isinstance(self.hosts, Mapping):
                raise TypeError(
                    f"Egress(hosts=...) must map names to addresses, got "
                    f"{type(self.hosts).__name__}; write hosts={{'api.test': '127.0.0.1'}}"
                )
            for name, value in self.hosts.items():
                if not isinstance(name, str) or not isinstance(value, str):
                    raise TypeError("Egress(hosts=...) maps str names to str addresses")
                address = _address(value)
                if address is None:
                    raise ValueError(f"Egress(hosts=...): {value!r:.80} is not an address")
                pinned.append((normalise_name(name), address))
            object.__setattr__(self, "hosts", dict(self.hosts))
        object.__setattr__(self, "_hosts", tuple(pinned))
        if self.max_bytes is not None:
            check_int("Egress(max_bytes=...)", self.max_bytes, 1)
        check_int("Egress(max_connections=...)", self.max_connections, 1, 1 << 16)

    def rules(self) -> EgressRules:
        """What the proxy asks (``EgressRules.decide``, ``pinned``)."""
        return EgressRules(self._rules, dict(self._hosts))


@dataclass(frozen=True)
class EgressRules:
    """The parsed rules of an ``Egress``: what the proxy decides each connection by."""

    rules: tuple[_Rule, ...]
    hosts: dict[str, IPAddress]

    def decide(self, target: Target) -> str | None:
        """``None`` when ``target`` is allowed by a pattern, else why not (for the 403)."""
        for rule in self.rules:
            if rule.port != target.port:
                continue
            if target.address is not None:
                if rule.kind == "address" and rule.value == target.address:
                    return None
            elif (rule.kind == "name" and rule.value == target.name) or (
                rule.kind == "suffix" and str(target.name).endswith("." + str(rule.value))
            ):
                return None
        shown = ", ".join(repr(rule.text) for rule in self.rules) or "nothing"
        if target.address is not None:
            return (
                f"the address {target.address} port {target.port} is not allowed: an address "
                f"is reached only when listed as one (Egress(allow=[...]) allows {shown})"
            )
        return f"{target.name} port {target.port} is not in Egress(allow=[...]) ({shown})"

    def pinned(self, name: str) -> IPAddress | None:
        """The address ``hosts=`` maps ``name`` to, if any."""
        return self.hosts.get(name)

    def reachable(self, address: IPAddress, port: int) -> bool:
        """Whether a name's resolved ``address`` may be connected to.

        Public addresses may; loopback, private, link-local, multicast, reserved and unspecified
        ones only when listed as addresses with this port.
        """
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if _is_public(address):
            return True
        return any(
            r.kind == "address" and r.value == address and r.port == port for r in self.rules
        )
