"""The router's pure parts: nginx's message, the status answer, the check config."""

from __future__ import annotations

from pathlib import Path

import pytest

from routers.nginx.router import (
    IncludeFiles,
    StatusAnswer,
    check_config,
    nginx_message,
    parse_status,
)
from routers.seam import InForce

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"


def test_nginx_message_keeps_the_line_that_says_what_is_wrong() -> None:
    after_log = (
        '2026/12/06 14:03:50 [emerg] 15647#15647: host not found in upstream "x:80" in '
        "/etc/nginx/canary.conf:5\nnginx: configuration file /etc/nginx/nginx.conf test failed\n"
    )
    assert nginx_message(after_log) == (
        'host not found in upstream "x:80" in /etc/nginx/canary.conf:5'
    )
    before_log = 'nginx: [emerg] unknown directive "bogus" in /etc/nginx/canary.conf:1\n'
    assert nginx_message(before_log) == 'unknown directive "bogus" in /etc/nginx/canary.conf:1'
    assert nginx_message("") == "no message from nginx"
    assert nginx_message("odd\x1b[31m output") == "odd?[31m output"


def test_status_answers() -> None:
    body = b'{"service":"pay-api","experiment":"42","revision":7,"worker":812}\n'
    assert parse_status(OK + body, "pay-api") == StatusAnswer(InForce("42", 7), 812)
    none = b'{"service":"pay-api","experiment":null,"revision":null,"worker":812}'
    assert parse_status(OK + none, "pay-api").in_force == InForce(None, None)


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 404 Not Found\r\n\r\n{}",
        OK + b'{"service":"orders","experiment":"42","revision":7,"worker":812}',
        OK + b'{"service":"pay-api","experiment":42,"revision":7,"worker":812}',
        OK + b'{"service":"pay-api","experiment":"42","revision":true,"worker":812}',
        OK + b'{"service":"pay-api","experiment":"42","revision":7,"worker":1}',
        OK + b'{"service":"pay-api","experiment":"42","revision":7}',
        OK + b'{"service":"pay-api","experiment":"42","revision":7,"worker":"\xff"}',
        OK + b"[]",
        OK + b"not json",
        b"garbage",
    ],
)
def test_status_answers_that_are_not_ours_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_status(raw, "pay-api")


def test_the_check_config_includes_the_candidate_only(tmp_path: Path) -> None:
    files = IncludeFiles.of(tmp_path / "conf.d" / "canary-pay-api.conf")
    text = check_config(files)
    assert f"include {tmp_path}/conf.d/.canary-pay-api.conf.candidate;" in text
    assert "canary-pay-api.conf;" not in text.replace(".candidate;", "")
    assert str(files.check_dir) in text and files.check_dir.name.startswith(".")
