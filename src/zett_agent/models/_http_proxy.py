"""Which proxy a request goes through, read from the environment as httpx and urllib do.

``proxy_for(url, env)`` picks the proxy for one URL (``{scheme}_proxy``, ``all_proxy``,
``no_proxy``, lower case first); ``proxy_authorization(proxy)`` is the header its credentials
become. Pure functions of their arguments: ``_http`` does the connecting.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping
from urllib.parse import SplitResult, unquote, urlsplit

from zett_agent.models._http_readers import RequestError

__all__ = ["proxy_authorization", "proxy_for"]


def proxy_for(url: SplitResult, env: Mapping[str, str]) -> SplitResult | None:
    """The proxy a request to ``url`` goes through according to ``env``, or ``None``.

    ``{scheme}_proxy``, else ``all_proxy`` (lower case first; an upper-case ``HTTP_PROXY`` is
    ignored when ``REQUEST_METHOD`` is set, as in a CGI script, as urllib does), unless
    ``no_proxy`` names the host: ``*`` (every host), a host name (itself and its subdomains; a
    leading ``.`` or ``*.`` is ignored), an IP address or network (``10.0.0.0/8``), each
    optionally with ``:port`` or a ``scheme://`` prefix. A value without a scheme is an
    ``http://`` proxy.

    Raises ``RequestError`` for a proxy URL that is not ``http://host[:port]``.
    """
    scheme = url.scheme
    proxy = _env(env, f"{scheme}_proxy") or _env(env, "all_proxy")
    if not proxy or _bypassed(url, _env(env, "no_proxy") or ""):
        return None
    if "://" not in proxy:
        proxy = f"http://{proxy}"
    parsed = urlsplit(proxy)
    try:
        valid = parsed.scheme == "http" and bool(parsed.hostname) and parsed.port != 0
    except ValueError:  # a port that is not a number
        valid = False
    if not valid:
        where = "$ALL_PROXY" if not _env(env, f"{scheme}_proxy") else f"${scheme.upper()}_PROXY"
        shown = parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl()
        raise RequestError(
            f"the proxy {shown!r} from {where} is not supported: only http://host:port proxies "
            f"are (set {where} to one, or list {url.hostname} in $NO_PROXY to connect directly)"
        )
    return parsed


def _env(env: Mapping[str, str], name: str) -> str | None:
    if name in env:
        return env[name]  # lower case wins, even empty
    if name == "http_proxy" and "REQUEST_METHOD" in env:
        return None  # httpoxy: a CGI request's "Proxy:" header becomes HTTP_PROXY
    return env.get(name.upper())


def _bypassed(url: SplitResult, no_proxy: str) -> bool:
    host = (url.hostname or "").lower()
    port = url.port or (443 if url.scheme == "https" else 80)
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if entry == "*":
            return True
        if "://" in entry:
            scheme, _, entry = entry.partition("://")
            if scheme != url.scheme:
                continue
        entry = entry.rstrip("/")
        name, want = entry, None
        if entry.startswith("["):  # [v6] or [v6]:port
            name, _, rest = entry[1:].partition("]")
            want = rest[1:] or None
        elif entry.count(":") == 1:  # host:port (a bare IPv6 address has more colons)
            name, _, want = entry.partition(":")
        if not name or (want is not None and want != str(port)):
            continue
        if "/" in name:
            if _in_network(host, name):
                return True
            continue
        name = name.removeprefix("*").removeprefix(".")
        if host == name or host.endswith(f".{name}"):
            return True
    return False


def _in_network(host: str, network: str) -> bool:
    import ipaddress  # only for a NO_PROXY that names networks

    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(network, strict=False)
    except ValueError:
        return False


def proxy_authorization(proxy: SplitResult) -> list[str]:
    """The ``Proxy-Authorization`` header line for ``proxy``'s credentials (none without)."""
    if proxy.username is None:
        return []
    secret = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
    return [f"Proxy-Authorization: Basic {binascii.b2a_base64(secret, newline=False).decode()}"]
