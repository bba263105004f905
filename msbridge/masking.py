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

import json
import logging
import re
from collections.abc import Mapping  # typing.Mapping's isinstance is ~5x slower, over 100k params
from typing import Any, List, Sequence

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
# Both string rules run in linear time (a 1 MB value masks in milliseconds): each pattern starts only where
# a match can start and stops at the first character that ends its part, so no stretch is scanned twice.
# A URI's credentials: a scheme (from the first letter of its run of scheme characters), "://", a user
# without ":/@" or spaces, ":", then a password up to the next "@" (no space before it).
_URI_HEAD = re.compile(r"(?<![a-zA-Z0-9+.-])[0-9+.-]*+[a-zA-Z][a-zA-Z0-9+.-]*+://[^:/@\s]*+:")
# A query parameter: "?", "&" or ";", a name up to the next "=", "&" or space, "=", its value. The name is
# taken from the first of those start characters (a later one in the same name would give a shorter name).
_QUERY_KEY = re.compile(r"[?&;](?P<key>[^=&\s]*+)")
_QUERY_VALUE = re.compile(r"[^&\s\"'#]++")
_QUERY_SECRET_WORD = re.compile(r"token|password|passwd|secret|api[_-]?key|signature|credential", re.I)
_SPACE = re.compile(r"\s")


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
    """Mask URI credentials and secret query parameters inside a string, in time linear in its length.

    Example:
        >>> mask_text("http://bob:hunter2@host:5000/x?token=abc&n=1")
        'http://bob:***@host:5000/x?token=***&n=1'
    """
    if "://" in text:
        text = _mask_uri_credentials(text)
    if "=" in text:
        text = _mask_query_secrets(text)
    return _WEBHOOK_TOKEN.sub(lambda m: f"{m['key']}{MASK}", text)


class _Next:
    """The first position at or after ``start`` where ``find`` finds its target, remembered while it stays ahead
    (callers ask with growing ``start``, so each character is looked at once)."""

    def __init__(self, text: str, find: "re.Pattern[str]") -> None:
        self.text, self.find, self.found = text, find, -2  # -2: not looked yet; -1: none left

    def at(self, start: int) -> int:
        if self.found != -1 and self.found < start:
            match = self.find.search(self.text, start)
            self.found = match.start() if match else -1
        return self.found


_AT = re.compile("@")


def _mask_uri_credentials(text: str) -> str:
    out, done = [], 0
    next_at, next_space = _Next(text, _AT), _Next(text, _SPACE)
    for head in _URI_HEAD.finditer(text):
        if head.start() < done:  # inside a password already masked
            continue
        at, space = next_at.at(head.end()), next_space.at(head.end())
        if at > head.end() and (space == -1 or space > at):
            out += [text[done:head.end()], MASK]
            done = at
    return "".join(out) + text[done:] if out else text


def _mask_query_secrets(text: str) -> str:
    out, done = [], 0
    for key in _QUERY_KEY.finditer(text):
        if key.start() < done or text[key.end():key.end() + 1] != "=" or not _QUERY_SECRET_WORD.search(key["key"]):
            continue
        value = _QUERY_VALUE.match(text, key.end() + 1)
        if value:
            out += [text[done:key.end() + 1], MASK]
            done = value.end()
    return "".join(out) + text[done:] if out else text


def mask_command(argv: Sequence[str]) -> str:
    """A command line as one string, with the values of secret-looking options masked:
    ``--set mlflow.token=abc``, ``--password=abc`` and ``--api-key abc`` alike. A config written on the
    command line (``--config '{"api_key": "abc"}'``, ``--set 'params={hf_token: abc}'``) is masked as a file
    is: parsed, every secret masked, written back as JSON; one that does not parse but names a secret is
    masked whole.

    Example:
        >>> mask_command(["train.py", "--set", "params.hf_token=abc", "--api-key", "xyz", "--lr", "0.1"])
        'train.py --set params.hf_token=*** --api-key *** --lr 0.1'
        >>> mask_command(["train.py", "--config", '{"model": "m", "api_key": "xyz"}'])
        'train.py --config {"model": "m", "api_key": "***"}'
    """
    out: List[str] = []
    for arg in argv:
        key, sep, value = str(arg).partition("=")
        name = key.lstrip("-").rsplit(".", 1)[-1]
        if out and out[-1].startswith("-") and "=" not in out[-1] and is_secret_key(out[-1].lstrip("-")) \
                and not str(arg).startswith("-"):
            out.append(MASK)
        elif sep and name and is_secret_key(name):
            out.append(f"{key}={MASK}")
        elif _inline_config(str(arg)):
            out.append(_mask_inline(str(arg)))
        elif sep and _inline_config(value):
            out.append(f"{key}={_mask_inline(value, name)}")
        else:
            out.append(mask_text(str(arg)))
    return " ".join(out)


def _inline_config(text: str) -> bool:
    return text.lstrip()[:1] in ("{", "[")


def _mask_inline(text: str, key: str = "") -> str:
    """A mapping or list written as JSON, masked as a file is (see ``mask_command``); other text that names
    a secret-looking key is masked whole."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        words = re.findall(r"[A-Za-z0-9_.-]+", text)
        return MASK if any(is_secret_key(word) for word in words) else mask_text(text)
    masked = mask_secrets(value, key)
    return json.dumps(masked, default=str, ensure_ascii=False) if masked != value else mask_text(text)


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
