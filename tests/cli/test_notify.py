"""`canary notify test|subscriptions|deliveries` against a real API and a real receiver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from controlplane.cli.main import app
from controlplane.notify.signing import verify
from tests.support.auth import bearer
from tests.support.webhooks import Receiver, free_port, receiving

runner = CliRunner()
SECRET = "whsec_cli-test-secret-0123456789abcdef"


def canary(*args: str) -> Result:
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


@pytest.fixture
def hook_url(receiver: Receiver) -> Iterator[str]:
    with receiving(receiver) as url:
        yield url


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    return path


def subscription(api_url: str, url: str, name: str) -> dict[str, Any]:
    answer = httpx.post(
        f"{api_url}/v1/notifications/subscriptions",
        json={"name": name, "url": url},
        headers=bearer(),
    )
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


def test_a_sample_to_a_url_is_signed_with_the_secret_file(
    receiver: Receiver, hook_url: str, secret_file: Path
) -> None:
    result = canary("notify", "test", "--url", hook_url, "--secret-file", str(secret_file))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "delivered: the receiver answered HTTP 200"
    [request] = receiver.received()
    assert verify(
        SECRET,
        timestamp=request.headers["x-canary-timestamp"],
        signature_value=request.headers["x-canary-signature"],
        body=request.body,
        now=float(request.headers["x-canary-timestamp"]),
    )
    assert json.loads(request.body)["event_id"] == 0


def test_the_slack_format_is_sent_when_asked(
    receiver: Receiver, hook_url: str, secret_file: Path
) -> None:
    result = canary(
        "notify",
        "test",
        "--url",
        hook_url,
        "--secret-file",
        str(secret_file),
        "--format",
        "slack",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["delivered"] is True
    assert set(json.loads(receiver.received()[0].body)) == {"text", "blocks"}


def test_a_refusing_receiver_is_one_line_and_exit_1(
    receiver: Receiver, hook_url: str, secret_file: Path
) -> None:
    receiver.answer(500)
    result = canary("notify", "test", "--url", hook_url, "--secret-file", str(secret_file))
    assert result.exit_code == 1
    assert result.stderr == "canary notify test: not delivered: HTTP 500\n"


def test_an_unreachable_receiver_is_exit_1(secret_file: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/hook"
    result = canary("notify", "test", "--url", url, "--secret-file", str(secret_file))
    assert result.exit_code == 1
    assert result.stderr.startswith("canary notify test: not delivered: ConnectError")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "give either --subscription ID or --url URL"),
        (["--url", "http://127.0.0.1:1/x"], "--url needs --secret-file"),
        (["--url", "http://127.0.0.1:1/x", "--subscription", "1"], "give either"),
        # refused before any request: a metadata address is never contacted
        (
            ["--url", "http://169.254.169.254/x", "--secret-file", "{secret}"],
            "not sent: webhook host is a link-local or cloud metadata address",
        ),
        (["--url", "not a url", "--secret-file", "{secret}"], "must not contain spaces"),
        (
            ["--url", "http://127.0.0.1:1/x", "--secret-file", "{secret}", "--format", "xml"],
            "'xml' is not a valid Format",
        ),
        (["--url", "http://127.0.0.1:1/x", "--secret-file", "{short}"], "printable characters"),
        (["--url", "http://127.0.0.1:1/x", "--secret-file", "{missing}"], "cannot read"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    args: list[str], says: str, secret_file: Path, tmp_path: Path
) -> None:
    short = tmp_path / "short"
    short.write_text("tooshort")
    files = {
        "{secret}": str(secret_file),
        "{short}": str(short),
        "{missing}": str(tmp_path / "nope"),
    }
    result = canary("notify", "test", *[files.get(a, a) for a in args])
    assert result.exit_code == 2, result.output
    assert says in result.stderr and result.stderr.count("\n") == 1


def test_a_stored_subscription_is_tested_through_the_api(
    api_url: str, receiver: Receiver, hook_url: str
) -> None:
    created = subscription(api_url, hook_url, "cli-ok")
    result = canary("notify", "test", "--subscription", str(created["id"]), "--api", api_url)
    assert result.exit_code == 0, result.output
    [request] = receiver.received()
    assert verify(
        created["secret"],
        timestamp=request.headers["x-canary-timestamp"],
        signature_value=request.headers["x-canary-signature"],
        body=request.body,
        now=float(request.headers["x-canary-timestamp"]),
    )

    missing = canary("notify", "test", "--subscription", "987654", "--api", api_url)
    assert missing.exit_code == 2 and "no subscription 987654" in missing.stderr

    listed = canary("notify", "subscriptions", "--api", api_url, "--json")
    assert listed.exit_code == 0, listed.output
    assert created["secret"] not in listed.stdout and hook_url not in listed.stdout
    assert "cli-ok" in canary("notify", "subscriptions", "--api", api_url).stdout


def test_deliveries_are_listed(api_url: str) -> None:
    result = canary("notify", "deliveries", "--api", api_url, "--status", "failed", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["items"] == []
    bad = canary("notify", "deliveries", "--api", api_url, "--status", "lost")
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("value", "text"),
    [(["tripped", "rolled_back"], "tripped, rolled_back"), ([], "-"), (True, "yes"),
     (False, "no"), (None, "-"), ("", "-"), (3, "3")],
)
def test_table_cells_read_as_words_not_python(value: Any, text: str) -> None:
    from controlplane.cli.notify import cell_text

    assert cell_text(value) == text


def test_add_list_test_and_rm_a_subscription(
    api_url: str, receiver: Receiver, hook_url: str, secret_file: Path
) -> None:
    added = canary("notify", "add", "--name", "cli-add", "--url", hook_url, "--kind",
                   "trip", "--format", "slack", "--api", api_url)
    assert added.exit_code == 0, added.output
    head, secret_line, hint = added.stdout.strip().splitlines()
    sub_id = head.split()[1]
    assert head == f"subscription {sub_id} cli-add -> {hook_url} (slack, enabled)"
    secret = secret_line.rpartition(": ")[2]
    assert secret_line.startswith("signing secret (shown once") and len(secret) >= 16
    assert hint == f"try it: canary notify test --subscription {sub_id}"

    listed = json.loads(canary("notify", "list", "--api", api_url, "--json").stdout)
    mine = next(s for s in listed["items"] if str(s["id"]) == sub_id)
    assert (mine["name"], mine["format"]) == ("cli-add", "slack")
    assert mine["kinds"] and all("trip" in kind for kind in mine["kinds"])  # the topic
    assert "secret" not in mine
    table = canary("notify", "list", "--api", api_url).stdout
    assert "cli-add" in table and secret not in table
    row = next(line for line in table.splitlines() if "cli-add" in line)
    assert "tripped" in row and "['" not in row and "True" not in row and "yes" in row

    tested = canary("notify", "test", "--subscription", sub_id, "--api", api_url)
    assert tested.exit_code == 0, tested.output
    [request] = receiver.received()
    assert verify(secret, timestamp=request.headers["x-canary-timestamp"],
                  signature_value=request.headers["x-canary-signature"], body=request.body,
                  now=float(request.headers["x-canary-timestamp"]))

    removed = canary("notify", "rm", sub_id, "--api", api_url)
    assert removed.exit_code == 0 and removed.stdout.strip() == f"subscription {sub_id} deleted"
    listed = json.loads(canary("notify", "list", "--api", api_url, "--json").stdout)
    assert sub_id not in {str(s["id"]) for s in listed["items"]}
    again = canary("notify", "rm", sub_id, "--api", api_url)
    assert again.exit_code == 2 and again.stderr.count("\n") == 1


def test_add_with_a_secret_file_never_prints_the_secret(
    api_url: str, hook_url: str, secret_file: Path
) -> None:
    added = canary("notify", "add", "--name", "cli-own-secret", "--url", hook_url,
                   "--secret-file", str(secret_file), "--disabled", "--api", api_url)
    assert added.exit_code == 0, added.output
    assert SECRET not in added.stdout and "(json, disabled)" in added.stdout
    bad = canary("notify", "add", "--name", "x", "--url", hook_url, "--format", "xml",
                 "--api", api_url)
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1
