"""Secrets are masked whatever their type and depth, and URL credentials anywhere in any string."""
from __future__ import annotations

import logging
import random
import re
import time

import pytest

from msbridge.masking import MASK, MaskingFilter, is_secret_key, mask_command, mask_secrets, mask_text


@pytest.mark.parametrize("key", ["password", "db_password", "dbPassword", "PASSWD", "pw", "pwd", "token", "hf_token",
                                 "HF_TOKEN", "accessToken", "api_key", "apiKey", "api-key", "client_secret",
                                 "credentials", "private_key", "aws_access_key_id", "auth", "Authorization",
                                 "db_password_list", "passphrase", "cookie"])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["tokenizer", "max_tokens", "pad_token_id", "bos_token_id", "token_type_ids",
                                 "num_tokens", "seq_length", "author", "learning_rate", "experiment", "keyword"])
def test_ordinary_keys_stay_readable(key):
    assert not is_secret_key(key)


def test_every_leaf_under_a_secret_key_is_masked_and_the_shape_stays():
    config = {
        "db": {"host": "db.local", "credentials": {"user": "bob", "pw": "s1", "extra": {"otp": 123456}}},
        "db_password_list": ["s2", "s3", None],
        "api_key": 42,
        "tokens": {"pad_token_id": 0, "auth": {"basic": ["u", "s4"]}},
        "use_auth": True,
    }
    assert mask_secrets(config) == {
        "db": {"host": "db.local", "credentials": {"user": MASK, "pw": MASK, "extra": {"otp": MASK}}},
        "db_password_list": [MASK, MASK, None],
        "api_key": MASK,
        "tokens": {"pad_token_id": 0, "auth": {"basic": [MASK, MASK]}},
        "use_auth": True,  # a switch, not a secret
    }


def test_url_credentials_and_secret_query_parameters_are_masked_anywhere_in_a_string():
    text = ("see http://bob:hunter2@host:5000/x and redis://:pa$$@cache:6379, "
            "postgres://u:p%40ss@db/x?sslmode=require; https://h/d?api_key=k1&x=1&token=k2")
    assert mask_text(text) == ("see http://bob:***@host:5000/x and redis://:***@cache:6379, "
                               "postgres://u:***@db/x?sslmode=require; https://h/d?api_key=***&x=1&token=***")
    assert mask_secrets({"notes": [text]}) == {"notes": [mask_text(text)]}
    assert mask_text("http://host:5000/path and user@host") == "http://host:5000/path and user@host"


def test_every_msbridge_log_line_is_masked(caplog):
    caplog.set_level(logging.INFO, logger="msbridge")
    logging.getLogger("msbridge").info("msbridge: MLflow at %s is unreachable", "http://u:s3cr3t@127.0.0.1:1")
    assert "s3cr3t" not in caplog.text and "http://u:***@127.0.0.1:1" in caplog.text
    assert any(isinstance(f, MaskingFilter) for f in logging.getLogger("msbridge").filters)


def test_secret_options_on_a_command_line_are_masked():
    argv = ["train.py", "--set", "mlflow.token=abc", "--password=pw1", "--api-key", "k1", "--lr", "0.1",
            "--uri", "http://u:p2@h", "--set", "tokenizer.type=T", "--use-auth", "--verbose"]
    assert mask_command(argv) == ("train.py --set mlflow.token=*** --password=*** --api-key *** --lr 0.1 "
                                  "--uri http://u:***@h --set tokenizer.type=T --use-auth --verbose")


# The regexes mask_text used before it was made linear (they are quadratic on long runs): the reference.
_OLD_URI = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@\s]+)@")
_OLD_QUERY = re.compile(r"(?P<key>[?&;](?:[^=&\s]*(?:token|password|passwd|secret|api[_-]?key|signature|credential)"
                        r"[^=&\s]*))=(?P<val>[^&\s\"'#]+)", re.I)


def _old_mask(text):
    text = _OLD_URI.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    return _OLD_QUERY.sub(lambda m: f"{m['key']}={MASK}", text)


def test_linear_masking_masks_exactly_what_the_regexes_it_replaced_masked():
    pieces = ["a", "1", "+", ":", "/", "@", " ", "\n", "?", "&", ";", "=", "token", "://", "h", "#", "'", "Password",
              "x:", "http://", "API-KEY", '"']
    rng = random.Random(28)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 16))) for _ in range(30_000)]
    changed = [t for t in texts if _old_mask(t) != t]
    assert len(changed) > 1_000  # the sample exercises both rules, not only text left alone
    assert [t for t in texts if mask_text(t) != _old_mask(t)] == []


def _seconds(text):
    """The best of 3 of ``mask_text``'s CPU time on this thread (a busy machine does not stretch it)."""
    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        mask_text(text)
        best = min(best, time.thread_time() - start)
    return best


@pytest.mark.parametrize("unit", ["x", "a://b:", "?;", "http://u:p@h/?token=1&", "a1", "=", "https://h/x?a=b&"])
def test_masking_is_linear_in_the_length_of_the_text(unit):
    """A 1 MB value costs about ten times a 100 kB one (quadratic: a hundred times), and well under a second."""
    small = unit * (100_000 // len(unit))
    big = small * 10
    assert mask_text(big).count(MASK) == 10 * mask_text(small).count(MASK) or MASK not in mask_text(small)
    small_s, big_s = _seconds(small), _seconds(big)
    assert big_s < 2.0, f"{big_s:.2f} CPU s for 1 MB"
    assert big_s < 30 * max(small_s, 1e-3), (small_s, big_s)


@pytest.mark.parametrize("key", ["signing_key", "ssh_key", "sessionKey", "SSH-KEY", "jwt_signing_key"])
def test_key_names_of_keys_are_secret(key):
    assert is_secret_key(key) and mask_secrets({key: "abc"}) == {key: MASK}


def test_the_value_of_a_kubernetes_style_env_item_named_like_a_secret_is_masked():
    env = [{"name": "HF_TOKEN", "value": "x1"}, {"name": "WORLD_SIZE", "value": "8"}, {"name": "x", "token": 1}]
    assert mask_secrets({"env": env}) == {"env": [{"name": "HF_TOKEN", "value": MASK},
                                                  {"name": "WORLD_SIZE", "value": "8"}, {"name": "x", "token": MASK}]}


def test_a_secret_once_masked_by_its_key_is_masked_wherever_it_was_copied():
    assert mask_secrets({"api_key": "sk-copied-7f3a9"}) == {"api_key": MASK}
    assert mask_text("note: sk-copied-7f3a9, again sk-copied-7f3a9") == "note: ***, again ***"
    assert mask_secrets({"auth_type": "password"}) == {"auth_type": MASK}
    assert mask_text("--password given") == "--password given", "a plain word is not masked everywhere"


@pytest.mark.parametrize("argv,shown", [
    (["t.py", "-p", "x1"], "t.py -p ***"), (["t.py", "-px1"], "t.py -p***"),
    (["t.py", "--wandb-key", "x1"], "t.py --wandb-key ***"), (["t.py", "--hf-token=x1"], "t.py --hf-token=***"),
    (["t.py", "--key", "x1", "--lr", "0.1"], "t.py --key *** --lr 0.1"), (["t.py", "-n", "4"], "t.py -n 4"),
])
def test_secret_options_on_a_command_line_are_masked(argv, shown):
    assert mask_command(argv) == shown


@pytest.mark.parametrize("text,shown", [
    ("401: Authorization: Bearer eyJ0.abc9.def", "401: Authorization: Bearer ***"),
    ("Basic dXNlcjpwYXNzd29yZA==", "Basic ***"), ("Bearer authentication failed", "Bearer authentication failed"),
])
def test_bearer_and_basic_credentials_in_text_are_masked(text, shown):
    assert mask_text(text) == shown
