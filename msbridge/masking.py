"""Masks secrets before anything is written: configs, tracking URIs, READMEs, logs.

A value is masked when its key looks like a secret (token, password, secret,
api_key, credentials ...). In any string, credentials inside a URI
(``https://user:pass@host``) and secret-looking query parameters are masked.

Example:
    >>> mask_secrets({"mlflow": {"tracking_uri": "http://bob:hunter2@host:5000", "token": "abc"}})
    {'mlflow': {'tracking_uri': 'http://bob:***@host:5000', 'token': '***'}}
"""
from __future__ import annotations

import re
from typing import Any

MASK = "***"

_SECRET_KEY = re.compile(r"(token|passw(or)?d|passwd|secret|api[_-]?key|credential|private[_-]?key|auth)", re.I)
_URI_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]+):(?P<pw>[^@/\s]+)@")
_QUERY_SECRET = re.compile(
    r"(?P<key>[?&](?:[^=&\s]*(?:token|password|passwd|secret|api[_-]?key|signature)[^=&\s]*))=(?P<val>[^&\s]+)",
    re.I,
)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(str(key)))


def mask_text(text: str) -> str:
    """Mask URI credentials and secret query parameters inside a string."""
    text = _URI_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['key']}={MASK}", text)


def mask_secrets(value: Any, key: str = "") -> Any:
    """A copy of ``value`` (dicts, lists, strings) with every secret masked."""
    if key and is_secret_key(key) and value not in (None, "", {}, []) and not isinstance(value, (dict, list, tuple)):
        return MASK
    if isinstance(value, dict):
        return {k: mask_secrets(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_secrets(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value
