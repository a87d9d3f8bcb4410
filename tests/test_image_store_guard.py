"""The image store is warren's own, like its state directory: its layers are other
sandboxes' roots, and the store takes a layer directory already there (named by its
digest) as one it made. So no sandbox sees it, and no sandbox may write at or above it
(even before it exists: a planted layer would be taken). Judged from the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """XDG_DATA_HOME with a store in it, outside the workspace, readable by the caller."""
    store = tmp_path / "data" / "warren" / "images"
    (store / "layers" / "abc").mkdir(parents=True)
    (store / "layers" / "abc" / "marker").write_text("LAYER-CONTENT-5e1\n")
    return tmp_path / "data"


def test_the_image_store_is_hidden_from_a_sandbox(tmp_path: Path, data: Path, state_home: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = data / "warren" / "images" / "layers" / "abc" / "marker"
    env = {"XDG_DATA_HOME": str(data)}
    r = run_cli(["run", "-w", str(ws), "--read", str(tmp_path), "--", "cat", str(marker)], cwd=ws, env=env)
    assert "LAYER-CONTENT" not in r.stdout and r.returncode != 0, r.stdout
    # Control: the rest of the same readable directory is seen, and the workspace works.
    (tmp_path / "beside.txt").write_text("BESIDE\n")
    ok = run_cli(
        ["run", "-w", str(ws), "--read", str(tmp_path), "--", "sh", "-c", f"cat {tmp_path}/beside.txt > out"],
        cwd=ws,
        env=env,
    )
    assert ok.returncode == 0 and (ws / "out").read_text() == "BESIDE\n", ok.stderr


@pytest.mark.parametrize("exists", [True, False], ids=["store", "no-store-yet"])
def test_no_sandbox_may_write_at_or_above_the_image_store(
    tmp_path: Path, data: Path, state_home: Path, exists: bool
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    if not exists:
        data = tmp_path / "empty-data"
        data.mkdir()
    plant = data / "warren" / "images" / "layers" / "planted"
    env = {"XDG_DATA_HOME": str(data)}
    r = run_cli(
        ["run", "-w", str(ws), "--write", str(data), "--", "mkdir", "-p", str(plant)], cwd=ws, env=env
    )
    assert r.returncode == 125 and "contains warren's image store" in r.stderr, r.stderr
    assert "XDG_DATA_HOME" in r.stderr
    assert not plant.exists()
    # Control: the same --write of a directory beside the store is granted.
    beside = tmp_path / "beside"
    beside.mkdir()
    ok = run_cli(
        ["run", "-w", str(ws), "--write", str(beside), "--", "touch", str(beside / "f")], cwd=ws, env=env
    )
    assert ok.returncode == 0 and (beside / "f").exists(), ok.stderr
