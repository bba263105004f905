"""Masks secrets before anything is written: configs, tracking URIs, READMEs, logs, console lines.

A value is masked when its key looks like a secret (token, password, secret,
api_key, credentials ...), whatever its type: a string or a number becomes
``***``; in a list or a mapping under such a key every leaf does (the shape
stays, so a reader still sees what was set). In any string, credentials inside
a URI (``https://user:pass@host``) and secret-looking query parameters are
masked; ``mask_command`` masks the values of secret-looking options on a
command line. ``MaskingFilter`` applies the string rules to every line logged on
the ``msbridge`` logger.

Example:
    >>> mask_secrets({"mlflow": {"tracking_uri": "http://bob:hunter2@host:5000", "token": "abc"}})
    {'mlflow': {'tracking_uri': 'http://bob:***@host:5000', 'token': '***'}}
    >>> mask_secrets({"credentials": {"user": "bob", "pw": "x"}, "db_password_list": ["a", "b"]})
    {'credentials': {'user': '***', 'pw': '***'}, 'db_password_list': ['***', '***']}
"""
from __future__ import annotations

import logging
import re
from typing import Any, List, Mapping, Sequence

MASK = "***"

# Anywhere in the key, separators ignored: db_password, clientSecret, hf-api-key, aws_access_key_id.
_SECRET_SUBSTRING = re.compile(r"passw(or)?d|passphrase|secret|credential|api_?key|private_?key|access_?key|webhook",
                               re.I)
# Keys that are secrets only inside one section: an alert target's url holds the bot's token.
_SECRET_WITHIN = {"alerts": frozenset({"url"})}
# Chat-bot webhook URLs carry their token in the path or in ?key= (Slack, Feishu/Lark, WeCom).
_WEBHOOK_TOKEN = re.compile(r"(?P<key>hooks\.slack\.com/services/|/open-apis/bot/v2/hook/|/webhook/send\?key=)"
                            r"(?P<val>[^\s\"'&#]+)")
# Whole words of the key: pw, pwd, auth, token (but not tokenizer, max_tokens, pad_token_id).
_SECRET_WORDS = frozenset({"pw", "pwd", "auth", "authorization", "bearer", "cookie", "token"})
_TOKEN_COUNTS = frozenset({"id", "ids", "type", "types", "num", "count", "len", "length", "idx", "index", "size"})
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_URI_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@\s]+)@")
_QUERY_SECRET = re.compile(
    r"(?P<key>[?&;](?:[^=&\s]*(?:token|password|passwd|secret|api[_-]?key|signature|credential)[^=&\s]*))"
    r"=(?P<val>[^&\s\"'#]+)",
    re.I,
)


def is_secret_key(key: Any) -> bool:
    """Whether a config key names a secret.

    Example:
        >>> [is_secret_key(k) for k in ("hf_token", "dbPassword", "tokenizer", "pad_token_id", "max_tokens")]
        [True, True, False, False, False]
    """
    text = str(key)
    if _SECRET_SUBSTRING.search(text.replace("-", "").replace("_", "").replace(".", "")):
        return True
    words = [w.lower() for w in _WORD.findall(text)]
    for i, word in enumerate(words):
        if word.endswith("token") and word != "token" or word in _SECRET_WORDS and word != "token":
            return True
        if word == "token" and (i + 1 == len(words) or words[i + 1] not in _TOKEN_COUNTS):
            return True
    return False


def mask_text(text: str) -> str:
    """Mask URI credentials and secret query parameters inside a string."""
    text = _URI_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    text = _WEBHOOK_TOKEN.sub(lambda m: f"{m['key']}{MASK}", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['key']}={MASK}", text)


def mask_command(argv: Sequence[str]) -> str:
    """A command line as one string, with the values of secret-looking options masked:
    ``--set mlflow.token=abc``, ``--password=abc`` and ``--api-key abc`` alike.

    Example:
        >>> mask_command(["train.py", "--set", "params.hf_token=abc", "--api-key", "xyz", "--lr", "0.1"])
        'train.py --set params.hf_token=*** --api-key *** --lr 0.1'
    """
    out: List[str] = []
    for arg in argv:
        key, sep, _ = str(arg).partition("=")
        name = key.lstrip("-").rsplit(".", 1)[-1]
        if out and out[-1].startswith("-") and "=" not in out[-1] and is_secret_key(out[-1].lstrip("-")) \
                and not str(arg).startswith("-"):
            out.append(MASK)
        elif sep and name and is_secret_key(name):
            out.append(f"{key}={MASK}")
        else:
            out.append(mask_text(str(arg)))
    return " ".join(out)


def mask_secrets(value: Any, key: Any = "", secret: bool = False, within: frozenset = frozenset()) -> Any:
    """A copy of ``value`` (mappings, lists, strings) with every secret masked.

    ``secret``: ``value`` sits under a secret-looking key already (every leaf is masked).
    ``within``: keys that are secrets in the section being masked (``url`` under ``alerts``).
    """
    secret = secret or (key != "" and (is_secret_key(key) or key in within))
    within = within | _SECRET_WITHIN.get(str(key), frozenset())
    if isinstance(value, Mapping):
        return {k: mask_secrets(v, str(k), secret, within) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [mask_secrets(v, "", secret, within) for v in value]
    if secret and value not in (None, "") and not isinstance(value, bool):
        return MASK
    if isinstance(value, str):
        return mask_text(value)
    return value


class MaskingFilter(logging.Filter):
    """Masks URI credentials and secret query parameters in every record it sees.

    Example:
        >>> logging.getLogger("msbridge").addFilter(MaskingFilter())
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let logging report it as it would
            return True
        masked = mask_text(message)
        if masked != message:
            record.msg, record.args = masked, ()
        return True
