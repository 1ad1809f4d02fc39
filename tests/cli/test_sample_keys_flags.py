"""`--sample-keys-file` on `canary sidecar` and `canary collector`: a bad key file is
one line on stderr naming the file, exit code 2, and never the secret."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from controlplane.cli.main import main

SHORT = secrets.token_bytes(16).hex()


@pytest.mark.parametrize(
    "command",
    [
        ["collector", "--redis", "memory://", "--etcd", "memory://"],
        ["sidecar", "--service", "svc", "--listen", "127.0.0.1:0"],
    ],
)
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (f"k1:{SHORT}\n", "16 bytes, at least 32"),
        ("k1\n", "expected kid:secret"),
        (None, "cannot read"),
    ],
    ids=["short", "no-secret", "unreadable"],  # SHORT is random: ids must not show it
)
def test_a_bad_key_file_is_one_line_and_exit_2(
    command: list[str],
    content: str | None,
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CANARY_SAMPLE_KEYS", raising=False)
    monkeypatch.delenv("CANARY_SAMPLE_KEYS_FILE", raising=False)
    path = tmp_path / "sample.keys"
    if content is not None:
        path.write_text(content)
    assert main([*command, "--sample-keys-file", str(path)]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1, err
    assert expected in err and str(path) in err
    assert SHORT not in err and SHORT not in out
