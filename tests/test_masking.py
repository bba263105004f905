"""Secrets are masked whatever their type and depth, and URL credentials anywhere in any string."""
from __future__ import annotations

import logging

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
