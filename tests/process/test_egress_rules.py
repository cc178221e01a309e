"""The rules of ``Egress``, one at a time: patterns, normalisation, literals, private addresses.

The whole, with a real job in its own network namespace and the parent's proxy, is in
tests/reliability/test_egress.py.
"""

from __future__ import annotations

import ipaddress

import pytest

from zett_agent.process import Egress
from zett_agent.process._sandbox._egress import normalise_name, parse_target


def decide(egress: Egress, host: str, port: int = 443) -> str | None:
    return egress.rules().decide(parse_target(host, port))


@pytest.mark.parametrize(
    ("name", "normal"),
    [
        ("API.GitHub.com", "api.github.com"),
        ("api.github.com.", "api.github.com"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.example.", "xn--bcher-kva.example"),
    ],
)
def test_names_are_compared_normalised(name: str, normal: str) -> None:
    assert normalise_name(name) == normal
    assert decide(Egress(allow=[normal]), name) is None


@pytest.mark.parametrize("bad", ["", ".", "a..b", "-a.test", "a b.test", "a/b", "x" * 64 + ".test"])
def test_a_name_that_is_no_host_name_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        normalise_name(bad)


def test_ports_default_to_443_and_must_match() -> None:
    egress = Egress(allow=["api.test", "plain.test:80"])
    assert decide(egress, "api.test", 443) is None
    assert decide(egress, "api.test", 8443) is not None
    assert decide(egress, "plain.test", 80) is None
    assert decide(egress, "plain.test", 443) is not None


def test_a_wildcard_opens_the_names_below_only() -> None:
    egress = Egress(allow=["*.example.org"])
    assert decide(egress, "files.example.org") is None
    assert decide(egress, "a.b.example.org") is None
    assert decide(egress, "example.org") is not None
    assert decide(egress, "evilexample.org") is not None
    assert decide(egress, "example.org.evil.test") is not None


@pytest.mark.parametrize(
    "literal",
    ["127.0.0.1", "2130706433", "0177.0.0.1", "0x7f.1", "127.1", "0x7f000001", "::ffff:127.0.0.1"],
)
def test_every_notation_of_an_address_is_an_address(literal: str) -> None:
    target = parse_target(literal, 443)
    assert target.name is None and target.address == ipaddress.ip_address("127.0.0.1")
    # never matched against a name, even one that maps to it
    egress = Egress(allow=["api.test"], hosts={"api.test": "127.0.0.1"})
    assert decide(egress, literal) is not None
    assert decide(Egress(allow=["127.0.0.1:443"]), literal) is None


@pytest.mark.parametrize(
    "bad", ["127.0.0.1 evil", "fe80::1%eth0", "[::1", "256.1.1.1", "99999999999"]
)
def test_a_host_that_is_neither_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_target(bad, 443)


def test_a_resolved_address_is_refused_in_private_ranges_unless_listed() -> None:
    rules = Egress(allow=["api.test", "10.1.2.3:443"]).rules()
    for address, port, reachable in [
        ("93.184.215.14", 443, True),
        ("8.8.8.8", 443, True),
        ("203.0.113.9", 443, False),  # a documentation range: private to the ipaddress module
        ("127.0.0.1", 443, False),
        ("10.0.0.1", 443, False),
        ("10.1.2.3", 443, True),  # listed as an address
        ("10.1.2.3", 80, False),  # ... with its port
        ("169.254.169.254", 443, False),  # link-local: a cloud's metadata service
        ("100.64.0.1", 443, False),  # shared address space
        ("224.0.0.1", 443, False),
        ("::1", 443, False),
        ("fd00::1", 443, False),
        ("::ffff:10.0.0.1", 443, False),
        ("0.0.0.0", 443, False),
    ]:
        assert rules.reachable(ipaddress.ip_address(address), port) is reachable, address


def test_pinned_names_are_trusted_at_their_address() -> None:
    rules = Egress(allow=["api.test"], hosts={"API.test.": "127.0.0.1"}).rules()
    assert rules.pinned("api.test") == ipaddress.ip_address("127.0.0.1")
    assert rules.pinned("other.test") is None


def test_a_refusal_names_the_rules() -> None:
    reason = decide(Egress(allow=["api.test"]), "evil.test")
    assert reason is not None and "evil.test port 443" in reason and "'api.test'" in reason
