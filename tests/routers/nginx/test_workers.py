"""Finding an nginx master's workers that still accept, in a /proc laid out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from routers.nginx.workers import children, master_of, serving_workers

TITLES = {
    11: b"nginx: worker process\0\0\0\0",
    12: b"nginx: worker process is shutting down\0",
    13: b"nginx: cache manager process\0",
}


def fake_proc(root: Path, *, with_children_file: bool) -> Path:
    for pid, title in TITLES.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cmdline").write_bytes(title)
        (root / str(pid) / "stat").write_text(f"{pid} (nginx: a) b) S 10 10 10 0")
    (root / "99").mkdir()
    (root / "99" / "stat").write_text("99 (sh) S 1 1 1 0")
    (root / "10").mkdir()
    (root / "10" / "cmdline").write_bytes(b"nginx: master process /usr/sbin/nginx -c x\0")
    (root / "10" / "stat").write_text("10 (nginx) S 1 10 10 0")
    (root / "self").mkdir()
    if with_children_file:
        (root / "10" / "task" / "10").mkdir(parents=True)
        (root / "10" / "task" / "10" / "children").write_text("11 12 13 ")
    return root


@pytest.mark.parametrize("with_children_file", [True, False])
def test_only_plain_workers_are_serving(tmp_path: Path, with_children_file: bool) -> None:
    proc = fake_proc(tmp_path, with_children_file=with_children_file)
    assert children(10, proc) == {11, 12, 13}
    assert serving_workers(10, proc) == {11}


def test_the_master_of_a_worker(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, with_children_file=False)
    assert master_of(11, proc) == 10
    assert master_of(10, proc) is None  # its parent, pid 1, is no nginx master
    assert master_of(99, proc) is None
    assert master_of(12345, proc) is None


def test_nothing_known_without_proc(tmp_path: Path) -> None:
    assert serving_workers(10, tmp_path / "absent") == set()
