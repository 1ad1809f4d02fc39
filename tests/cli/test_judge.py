"""`canary judge`: local, one-shot, with exit codes a script can branch on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from controlplane.cli.main import app, main

runner = CliRunner()


def canary_judge(*args: str) -> Result:
    return runner.invoke(app, ["judge", *args], env={"COLUMNS": "200"})


def write(path: Path, values: list[float] | np.ndarray) -> Path:
    path.write_text("".join(f"{v}\n" for v in values))
    return path


@pytest.fixture
def baseline(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    return write(tmp_path / "baseline.txt", np.round(rng.lognormal(4, 0.3, 400), 3))


def scaled(tmp_path: Path, factor: float, name: str = "canary.txt") -> Path:
    rng = np.random.default_rng(2)
    return write(tmp_path / name, np.round(rng.lognormal(4, 0.3, 400) * factor, 3))


def test_exit_codes_pass_high_low_nodata(tmp_path: Path, baseline: Path) -> None:
    assert canary_judge(str(baseline), str(scaled(tmp_path, 1.0))).exit_code == 0
    assert canary_judge(str(baseline), str(scaled(tmp_path, 1.5))).exit_code == 1
    faster = str(scaled(tmp_path, 0.5))
    assert canary_judge(str(baseline), faster).exit_code == 0  # increase is the default
    assert canary_judge(str(baseline), faster, "--direction", "decrease").exit_code == 1
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert canary_judge(str(baseline), str(empty)).exit_code == 3
    few = str(scaled(tmp_path, 1.0))
    assert canary_judge(str(baseline), few, "--min-samples", "401").exit_code == 3


def test_json_output_carries_the_evidence(tmp_path: Path, baseline: Path) -> None:
    result = canary_judge(
        str(baseline), str(scaled(tmp_path, 0.5)), "--direction", "either", "--json"
    )
    assert result.exit_code == 1, result.output
    got = json.loads(result.stdout)
    assert got["classification"] == "low"
    evidence = got["metrics"]["latency"]["evidence"]
    assert evidence["interval_high"] < 0 and evidence["interval_level"] == 0.99
    assert evidence["baseline_count"] == 400


def test_table_output(tmp_path: Path, baseline: Path) -> None:
    result = canary_judge(str(baseline), str(scaled(tmp_path, 1.5)))
    assert result.exit_code == 1
    assert result.stdout.startswith("HIGH")
    assert "interval_low" in result.stdout and "shift_estimate" in result.stdout


def test_effect_gate_options(tmp_path: Path, baseline: Path) -> None:
    canary = str(scaled(tmp_path, 1.1))
    assert canary_judge(str(baseline), canary).exit_code == 1
    gated = ("--effect-kind", "mean_ratio", "--effect-max", "1.2")
    assert canary_judge(str(baseline), canary, *gated).exit_code == 0
    cles = ("--effect-kind", "cles", "--effect-max", "0.55", "--json")
    result = canary_judge(str(baseline), canary, *cles)
    assert json.loads(result.stdout)["metrics"]["latency"]["evidence"]["effect_kind"] == "cles"
    pct = ("--effect-kind", "percentile_ratio", "--effect-max", "1.05", "--effect-percentile", "99")
    assert canary_judge(str(baseline), canary, *pct).exit_code == 1


def test_csv_with_a_named_column(tmp_path: Path) -> None:
    base = tmp_path / "base.csv"
    base.write_text("ts,latency_ms\n1,10\n2,11\n\n3,12\n4,10.5\n")
    slow = tmp_path / "slow.csv"
    slow.write_text("ts,latency_ms\n1,40\n2,41\n3,42\n4,45\n")
    result = canary_judge(str(base), str(slow), "--column", "latency_ms", "--json")
    got = json.loads(result.stdout)
    assert got["metrics"]["latency"]["evidence"]["baseline_count"] == 4
    assert got["metrics"]["latency"]["evidence"]["canary_mean"] == 42.0


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("1\n2\nabc\n", (), "bad.txt:3: not a number: 'abc'"),
        ("1\n-5\n", (), "bad.txt:2: '-5' is not a latency"),
        ("1\nnan\n", (), "bad.txt:2: 'nan' is not a latency"),
        ("1\ninf\n", (), "bad.txt:2: 'inf' is not a latency"),
        ("ts,ms\n1,2\n", (), "bad.txt:1: looks like CSV: name the column with --column"),
        (
            "ts,ms\n1,2\n",
            ("--column", "latency"),
            "bad.txt:1: no column 'latency' (columns: ts, ms)",
        ),
        ("ts,ms\n1,2\n3\n", ("--column", "ms"), "bad.txt:3: no value in column 'ms'"),
        ("ts,ms\n1,x\n", ("--column", "ms"), "bad.txt:2: not a number: 'x'"),
    ],
)
def test_a_bad_file_is_one_line_naming_file_and_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    extra: tuple[str, ...],
    message: str,
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text(content)
    code = main(["judge", str(bad), str(bad), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("canary judge: ") and message in err[0], err


def test_missing_file_and_bad_options_exit_2(
    tmp_path: Path, baseline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        ([str(baseline), str(tmp_path / "nope.txt")], "nope.txt: No such file or directory"),
        ([str(baseline), str(baseline), "--confidence", "0.3"], "must be within (0.5, 1)"),
        ([str(baseline), str(baseline), "--effect-kind", "cles"], "go together"),
        (
            [str(baseline), str(baseline), "--effect-kind", "cles", "--effect-max", "3"],
            "effect.max for cles must be within [0.5, 1]",
        ),
        ([str(baseline), str(baseline), "--direction", "up"], "Invalid value for '--direction'"),
    ]
    for args, message in cases:
        code = main(["judge", *args])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, args
        assert len(err) == 1 and message in err[0], err


def test_binary_file_is_refused(
    tmp_path: Path, baseline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\xff\xfe\x00\x01")
    assert main(["judge", str(baseline), str(blob)]) == 2
    assert "blob.bin: not UTF-8 text" in capsys.readouterr().err
