"""The console script's usage errors: one line on stderr, exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.cli.main import main


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["exp", "list", "--bogus"], "canary exp list: No such option: --bogus"),
        (["nosuch"], "canary: No such command 'nosuch'"),
        (["exp", "list", "--limit", "abc"], "canary exp list: Invalid value for '--limit'"),
        (["rules", "show"], "Missing argument"),
        (["serve", "--liveness-bound", "0.5"],
         "canary serve: Invalid value for '--liveness-bound'"),
        (["collector", "--liveness-bound", "1e9"],
         "canary collector: Invalid value for '--liveness-bound'"),
        (["collector", "--publish-every", "9"],
         "canary collector: Invalid value for '--publish-every'"),
        (["collector", "--publish-every", "-1"],
         "canary collector: Invalid value for '--publish-every'"),
        (["collector", "--publish-every", "nan"],
         "canary collector: Invalid value for '--publish-every'"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert expected in err
    assert err.rstrip().endswith("--help')")


def test_help_still_prints_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exp", "--help"]) == 0
    assert "list" in capsys.readouterr().out


@pytest.mark.parametrize(("listen", "tls", "url"), [
    ("127.0.0.1:8080", False, "http://127.0.0.1:8080/ui/"),
    ("0.0.0.0:9000", True, "https://127.0.0.1:9000/ui/"),
    ("[::1]:8080", False, "http://[::1]:8080/ui/"),
    ("api.internal:443", True, "https://api.internal:443/ui/"),
])
def test_serve_and_dev_print_where_the_dashboard_opens(listen: str, tls: bool, url: str) -> None:
    from controlplane.cli.server import dashboard_address
    from controlplane.kernel.settings import Settings

    assert dashboard_address(Settings(listen=listen), tls=tls) == url


def test_a_sidecar_default_upstream_in_another_spelling_is_one_line_naming_the_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["sidecar", "--service", "checkout", "--listen", "127.0.0.1:0", "--etcd", "memory://"]
    assert main([*argv, "--redis", "memory://", "--default-upstream", "http://0x7f000001:9"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "canary sidecar: upstream URL host is 127.0.0.1 written in another form; "
        "write it as 127.0.0.1\n"
    )


@pytest.mark.parametrize("command", ["serve", "dev"])
def test_a_listen_address_without_a_port_is_one_line_not_a_traceback(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # dev would otherwise leave its database here
    assert main([command, "--listen", "bogus"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert "expected HOST:PORT, got 'bogus'" in err


@pytest.mark.parametrize("command", ["serve", "dev"])
def test_a_listen_address_in_use_is_one_line_before_anything_starts(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second `canary dev` beside a running one must not revoke its token, replace its
    join file or print join commands for a control plane that never listens."""
    import socket

    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        code = main([command, "--listen", address, "--backends", "memory"]
                    if command == "dev" else
                    [command, "--listen", address, "--database-url", "sqlite:///x.db"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err == (f"canary {command}: cannot listen on {address}: the address is in use "
                   "(another canary dev or serve?); choose another with --listen\n")
    assert list(tmp_path.iterdir()) == []  # no database, no join file


def test_a_bad_public_url_is_named_as_the_public_url(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CANARY_PUBLIC_URL", "ftp://canary.example.com")
    assert main(["serve", "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert "public_url: the public URL must start with http:// or https://" in err
    assert "upstream" not in err
