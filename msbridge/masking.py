"""Masks secrets before anything is written: configs, tracking URIs, READMEs, logs, console lines.

A value is masked when its key looks like a secret (token, password, secret,
api_key, signing_key, credentials ...), whatever its type: a string or a number
becomes ``***``; in a list or a mapping under such a key every leaf does (the shape
stays, so a reader still sees what was set). So is the ``value`` of a Kubernetes-style
``{name: HF_TOKEN, value: ...}`` item. In any string, credentials inside a URI
(``https://user:pass@host``), secret-looking query parameters and ``Bearer ...``
are masked; ``mask_command`` masks the values of secret-looking options on a
command line (``-p``, ``--password``, ``--*-token``, ``--*-key``).

Masking is by value too: every secret masked once (``remember`` is called on each config
as it loads) is masked in every later string, wherever it was copied (a YAML alias
``note: *k`` of ``api_key: &k ...``, an exception's text, a tag). ``MaskingFilter``
applies the string rules to every line logged on the ``msbridge`` logger.

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
_SECRET_SUBSTRING = re.compile(r"passw(or)?d|passphrase|secret|credential|api_?key|private_?key|access_?key|webhook|"
                               r"signing_?key|ssh_?key|session_?key", re.I)
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
# "Bearer <token>" / "Basic <base64>" (an Authorization header quoted in an exception or a log line): a value
# with a digit, or of 16 characters or more ("Bearer authentication failed" is prose).
_AUTH_SCHEME = re.compile(r"\b(?P<key>[Bb]earer|BEARER|[Bb]asic|BASIC)(?P<sep>:?\s+)"
                          r"(?P<val>(?=[A-Za-z._~+/=-]*[0-9])[A-Za-z0-9._~+/=-]{8,}|[A-Za-z0-9._~+/=-]{16,})")
#: A value shorter than this is not remembered as a secret to mask everywhere (it would mask common words).
MIN_REMEMBERED = 6
# Every secret value seen so far (by key, by ${...} source, by an alias of either), longest first.
_REMEMBERED: List[str] = []
_REMEMBERED_RE: List["re.Pattern[str]"] = []
# Short options whose value is a secret on a command line (mysql's -p, sshpass's -p).
_SECRET_SHORT = frozenset({"p"})


def is_secret_key(key: Any) -> bool:
    """Whether a config key names a secret.

    Example:
        >>> [is_secret_key(k) for k in ("hf_token", "dbPassword", "tokenizer", "pad_token_id", "max_tokens")]
        [True, True, False, False, False]
    """
    text = str(key)
    if not text:
        return False
    if _SECRET_SUBSTRING.search(text.replace("-", "").replace("_", "").replace(".", "")):
        return True
    words = [w.lower() for w in _WORD.findall(text)]
    for i, word in enumerate(words):
        if word.endswith("token") and word != "token" or word in _SECRET_WORDS and word != "token":
            return True
        if word == "token" and (i + 1 == len(words) or words[i + 1] not in _TOKEN_COUNTS):
            return True
    return False


def mask_text(text: str, by_value: bool = True) -> str:
    """Mask URI credentials and secret query parameters inside a string, in time linear in its length;
    with ``by_value``, every secret ``remember`` was given too.

    Example:
        >>> mask_text("http://bob:hunter2@host:5000/x?token=abc&n=1")
        'http://bob:***@host:5000/x?token=***&n=1'
    """
    if "://" in text:
        text = _mask_uri_credentials(text)
    if "=" in text:
        text = _mask_query_secrets(text)
    if "earer" in text or "asic" in text or "EARER" in text or "ASIC" in text:
        text = _AUTH_SCHEME.sub(lambda m: f"{m['key']}{m['sep']}{MASK}", text)
    text = _WEBHOOK_TOKEN.sub(lambda m: f"{m['key']}{MASK}", text)
    if by_value and _REMEMBERED_RE:  # last: a known secret inside a token must not cut the token's own pattern
        text = _REMEMBERED_RE[0].sub(MASK, text)
    return text


def remember(value: Any) -> None:
    """Mask ``value`` (a secret's text) in every later string, wherever it appears. Only a string that looks
    like a secret is remembered: ``MIN_REMEMBERED`` characters or more, and not a plain word under 16 letters
    (``auth_type: password``, ``token_budget: 100000`` would mask common words and numbers everywhere).

    Example:
        >>> remember("hf_abcdef123456"); mask_text("the note says hf_abcdef123456")
        'the note says ***'
        >>> remember("password"); mask_text("--password ***")
        '--password ***'
    """
    if not isinstance(value, str) or len(value) < MIN_REMEMBERED or MASK in value or value in _REMEMBERED:
        return
    if value.isdigit() or value.isalpha() and len(value) < 16 and (value.islower() or value.isupper()):
        return
    text = value
    _REMEMBERED.append(text)
    _REMEMBERED.sort(key=len, reverse=True)  # the longest first: a secret holding another is masked whole
    _REMEMBERED_RE[:] = [re.compile("|".join(re.escape(t) for t in _REMEMBERED))]


def secret_paths(value: Any, path: tuple = (), secret: bool = False) -> List[tuple]:
    """``(path, value)`` of every leaf of ``value`` that ``mask_secrets`` masks (by its key, or as the ``value`` of a
    ``{name: X_TOKEN, value: ...}`` item).

    Example:
        >>> secret_paths({"a": {"api_key": "k1"}, "env": [{"name": "HF_TOKEN", "value": "k2"}]})
        [(('a', 'api_key'), 'k1'), (('env', 0, 'value'), 'k2')]
    """
    if isinstance(value, Mapping):
        named = _named_secret(value)
        return [found for k, v in value.items()
                for found in secret_paths(v, path + (k,), secret or is_secret_key(k) or (named and k == "value"))]
    if isinstance(value, (list, tuple)):
        return [found for i, v in enumerate(value) for found in secret_paths(v, path + (i,), secret)]
    return [(path, value)] if secret and value not in (None, "") and not isinstance(value, bool) else []


def _named_secret(item: Mapping[Any, Any]) -> bool:
    """A Kubernetes-style env item, ``{name: HF_TOKEN, value: ...}``, whose name looks like a secret."""
    return "value" in item and isinstance(item.get("name"), str) and is_secret_key(item["name"])


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
        if out and out[-1].startswith("-") and "=" not in out[-1] and _secret_option(out[-1]) \
                and not str(arg).startswith("-"):
            out.append(MASK)
        elif len(key) > 2 and key[:1] == "-" and key[1:2] in _SECRET_SHORT and key[2:3] != "-" and not sep:
            out.append(key[:2] + MASK)  # -pSECRET, as mysql takes it
        elif sep and name and (is_secret_key(name) or key.startswith("-") and _secret_option(key)):
            out.append(f"{key}={MASK}")
        elif _inline_config(str(arg)):
            out.append(_mask_inline(str(arg)))
        elif sep and _inline_config(value):
            out.append(f"{key}={_mask_inline(value, name)}")
        else:
            out.append(mask_text(str(arg)))
    return " ".join(out)


def _secret_option(option: str) -> bool:
    """Whether a command-line option's value is a secret: ``-p``, ``--password``, ``--hf-token``, ``--wandb-key``.

    Example:
        >>> [_secret_option(o) for o in ("-p", "--wandb-key", "--hf_token", "--lr", "--key")]
        [True, True, True, False, True]
    """
    name = option.lstrip("-")
    if option.startswith("-") and not option.startswith("--"):
        return name in _SECRET_SHORT or is_secret_key(name)
    return is_secret_key(name) or re.search(r"(^|[-_])key$", name, re.I) is not None


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
        named = _named_secret(value)
        return {k: mask_secrets(v, str(k), secret or (named and k == "value"), within) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [mask_secrets(v, "", secret, within) for v in value]
    if secret and value not in (None, "") and not isinstance(value, bool):
        remember(value)
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
