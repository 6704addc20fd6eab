"""``shardload train``'s checks before any work: dependencies, and an earlier run's --out."""

from __future__ import annotations

import importlib.util
import logging
import sys

import pytest

from _stores import make_store
from shardload.cli.app import main
from shardload.errors import ShardloadError
from shardload.train import cli_train


def _without(monkeypatch, *names: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        cli_train.importlib.util,
        "find_spec",
        lambda name, *a: None if name in names else real(name, *a),
    )


def test_missing_matplotlib_warns_and_the_run_goes_on(monkeypatch, caplog):
    _without(monkeypatch, "matplotlib")
    with caplog.at_level(logging.WARNING, logger="shardload.train"):
        assert cli_train.check_dependencies("mlp") is False
    assert "no loss.png" in caplog.text


def test_missing_torch_geometric_refused_before_any_work(monkeypatch):
    _without(monkeypatch, "torch_geometric")
    assert cli_train.check_dependencies("mlp") in (True, False)
    with pytest.raises(ShardloadError, match=r"torch_geometric.*shardload\[gnn\]"):
        cli_train.check_dependencies("gnn")


def test_earlier_out_refused_then_replaced_with_overwrite(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.csv").write_text("old")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ShardloadError, match="--overwrite"):
        cli_train.prepare_out(out, overwrite=False, resume=False)
    cli_train.prepare_out(out, overwrite=True, resume=False)
    assert not (out / "metrics.csv").exists()
    assert (out / "notes.txt").read_text() == "mine"  # only a run's own outputs are removed
    cli_train.prepare_out(tmp_path / "new", overwrite=False, resume=False)
    assert (tmp_path / "new").is_dir()


def test_resume_needs_last_checkpoint(tmp_path):
    with pytest.raises(ShardloadError, match=r"last\.ckpt"):
        cli_train.prepare_out(tmp_path, overwrite=False, resume=True)
    (tmp_path / "last.ckpt").write_bytes(b"x")
    cli_train.prepare_out(tmp_path, overwrite=False, resume=True)


def test_an_earlier_run_is_refused_before_lightning_is_imported(tmp_path, monkeypatch, capsys):
    """An --out that holds an earlier run, --resume without its checkpoint, or a store the
    model cannot read, is refused once the store is opened, before Lightning and torch are
    imported (seconds)."""
    store = make_store(tmp_path, n=40, chunk_rows=8, splits={"train": 0.5, "val": 0.5})
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.csv").write_text("old")
    monkeypatch.setenv(cli_train.OUT_ENV, "")  # the command sets it: put back afterwards
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)  # importing it fails
    assert main(["train", "mlp", store.url, "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["train", "mlp", store.url, "--out", str(tmp_path / "new"), "--resume"]) == 2
    assert "last.ckpt does not exist" in capsys.readouterr().err
    # a flat store (x: samples, features) for the lstm, which reads windows
    assert main(["train", "lstm", store.url, "--out", str(tmp_path / "lstm")]) == 2
    assert "model lstm needs x of shape (samples, lookback, features)" in capsys.readouterr().err
    assert not (tmp_path / "lstm").exists()  # refused before its folder was made
