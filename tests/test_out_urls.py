"""Outputs given as URLs, without a server: what cannot be written is refused naming ``out``
(``Path("s3://b/x")`` is the local folder ``s3:/b/x``), and credentials never reach the
provenance or the write fingerprint. The S3 round trips are tests/integration/test_s3.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardload.errors import ConfigError


def test_compute_refuses_a_url_out_instead_of_writing_a_local_folder(tmp_path: Path) -> None:
    from shardload.blockwise.config import load_compute_config

    cfg = {
        "source": {"paths": [str(tmp_path / "cube.zarr")], "variable": "amp"},
        "attributes": {"env": "shardload.attributes:envelope"},
        "out": "s3://bucket/attrs",
    }
    with pytest.raises(ConfigError, match=r"out: s3://bucket/attrs: compute writes a local"):
        load_compute_config(cfg)


def test_copy_refuses_a_dst_url_it_cannot_write(tmp_path: Path) -> None:
    import shardload

    with pytest.raises(ConfigError, match=r"copy: DST out: http://h/x: prepare writes to"):
        shardload.copy(tmp_path / "src", "http://h/x")


def test_storage_option_secrets_are_redacted_from_the_config_record() -> None:
    from shardload.prep.config import validate

    raw = {
        "source": {
            "paths": ["s3://b/in.nc"],
            "storage_options": {"key": "AKIA-SRC", "secret": "s3cr3t-src", "anon": False},
        },
        "sample_dims": ["sample"],
        "arrays": {"x": ["a"]},
        "out": "s3://b/store",
        "out_storage_options": {
            "key": "AKIA-OUT",
            "secret": "s3cr3t-out",
            "endpoint_url": "http://127.0.0.1:9000",
            "client_kwargs": {"aws_session_token": "ASIA-session-value"},
        },
    }
    cfg = validate(raw, Path("/"))
    assert cfg.out_storage_options["secret"] == "s3cr3t-out"  # the run itself has them
    d = cfg.to_dict()
    text = repr(d)
    for secret in ("AKIA-SRC", "s3cr3t-src", "AKIA-OUT", "s3cr3t-out", "ASIA-session-value"):
        assert secret not in text
    assert d["out_storage_options"]["endpoint_url"] == "http://127.0.0.1:9000"
    assert d["source"]["storage_options"]["anon"] is False


def test_prepare_check_shows_an_s3_out_as_written_and_refuses_http(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import make_dataset
    from shardload.cli.prepare import check_plan
    from shardload.prep.config import load_config

    make_dataset(40).to_netcdf(tmp_path / "src.nc")
    raw = {
        "source": {"paths": [str(tmp_path / "src.nc")]},
        "sample_dims": ["sample"],
        "arrays": {"x": ["a"]},
        "out": "s3://bucket/stores/x",
    }
    plan = check_plan(load_config(raw))
    assert plan["out"] == "s3://bucket/stores/x" and not plan["out_exists"]
    with pytest.raises(ConfigError, match=r"out: http://host/x: prepare writes to"):
        check_plan(load_config({**raw, "out": "http://host/x"}))


def test_writing_to_s3_without_s3fs_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from shardload.errors import MissingDependencyError
    from shardload.prep.remote_commit import RemoteCommit

    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs -> ImportError
    with pytest.raises(MissingDependencyError, match=r"shardload\[remote\]"):
        RemoteCommit("s3://bucket/store", fingerprint="f", num_blocks=1)
