"""Whether a URL can be used as a network address: checked before anything connects to it.

Example:
    >>> address_problem("http://127.0.0.1:5000") is None
    True
"""
from __future__ import annotations

import re
import urllib.parse
from typing import Optional

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def address_problem(url: str) -> Optional[str]:
    """What makes ``url`` (``scheme://[user@]host[:port]/...``) unusable as a network address, or None: a control
    character (CR/LF would split an HTTP request), no host, or a port outside 1-65535. The URL itself is never
    quoted (a webhook's holds its token).

    Example:
        >>> address_problem("http://127.0.0.1:99999/x"), address_problem("https://:5000"), address_problem("http://h:-1")
        ('port 99999 is not one of 1-65535', 'names no host', "port '-1' is not one of 1-65535")
    """
    bad = _CONTROL.search(url)
    if bad:
        return f"holds the control character {bad.group()!r} at position {bad.start()}"
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    host_end = netloc.rfind("]") + 1  # an IPv6 literal holds colons of its own
    has_port = ":" in netloc[host_end:]
    port = netloc[host_end:].rpartition(":")[2]
    if not parts.hostname:
        return "names no host"
    if has_port and port:  # "host:" is the default port, as for urllib
        number = int(port) if port.isdigit() and len(port) < 8 else None
        if number is None or not 1 <= number <= 65535:
            return f"port {port!r} is not one of 1-65535" if number is None else f"port {number} is not one of 1-65535"
    return None
