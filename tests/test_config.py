"""The prepare config is checked completely, strictly and before any file is touched."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import yaml

import shardload
from conftest import make_dataset, tree_bytes
from shardload.errors import ConfigError
from shardload.prep.config import load_config
from shardload.prep.config_models import (
    CLUSTER_KINDS,
    PrepareModel,
    config_schema,
)

CONFIGS = Path(shardload.__file__).parent / "configs"


def base(out: str = "out", **kw):
    d = {
        "source": {"paths": ["small.nc"]},
        "sample_dims": ["sample"],
        "arrays": {"x": ["a", "b"]},
        "chunk_rows": 7,
        "out": out,
    }
    d.update(kw)
    return d


def problems(raw, overrides=()) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_config(raw, overrides)
    return dict(info.value.problems)  # type: ignore[attr-defined]


def test_every_problem_of_the_issue_at_once_with_its_key_path():
    raw = base(
        overwrite="false",
        split_shuffle="false",
        dtype="float33",
        compression_level="high",
        execution={"num_workers": "four"},
        view={"name": "window", "lookbak": 3},
        splits={"train": 0.8, "val": 0.3},
    )
    p = problems(raw)
    assert set(p) == {
        "overwrite",
        "split_shuffle",
        "dtype",
        "compression_level",
        "execution.num_workers",
        "view.lookbak",
        "splits",
    }
    assert "string 'false'" in p["overwrite"] and "string 'false'" in p["split_shuffle"]
    assert "did you mean 'float32'" in p["dtype"]
    assert "integer" in p["compression_level"] and "'high'" in p["compression_level"]
    assert "'four'" in p["execution.num_workers"]
    assert "did you mean 'lookback'" in p["view.lookbak"]
    assert "sum" in p["splits"] and "1.1" in p["splits"]


@pytest.mark.parametrize(
    ("change", "path", "hint"),
    [
        ({"chunk_size": 3}, "chunk_size", "chunk_rows"),
        ({"source": {"paths": ["a.nc"], "enigne": "h5netcdf"}}, "source.enigne", "engine"),
        ({"view": {"name": "window", "horizn": 1}}, "view.horizn", "horizon"),
        ({"view": {"name": "window", "targets": {"y": ["t"]}, "strid": 1}}, "view.strid", "stride"),
        ({"view": {"function": "userfuncs:mean_over_lev", "kwarg": {}}}, "view.kwarg", "kwargs"),
        ({"view": {"name": "windw"}}, "view.name", "window"),
        ({"view": "windw"}, "view.name", "window"),
        ({"execution": {"schduler": "threads"}}, "execution.schduler", "scheduler"),
        ({"execution": {"scheduler": "thread"}}, "execution.scheduler", "threads"),
        ({"format": "zar"}, "format", "zarr"),
        ({"compression": "LZ4"}, "compression", "lz4"),
        ({"nan": "warning"}, "nan", "warn"),
        (
            {"execution": {"scheduler": "jobqueue", "cluster": {"kind": "slurm", "queu": "x"}}},
            "execution.cluster.queu",
            "queue",
        ),
        (
            {"execution": {"scheduler": "jobqueue", "cluster": {"kind": "pbs", "wall_time": "1"}}},
            "execution.cluster.wall_time",
            "walltime",
        ),
        (
            {"execution": {"scheduler": "jobqueue", "cluster": {"kind": "lsf", "core": 4}}},
            "execution.cluster.core",
            "cores",
        ),
        (
            {"execution": {"scheduler": "jobqueue", "cluster": {"kind": "slrum"}}},
            "execution.cluster.kind",
            "slurm",
        ),
        (
            {
                "execution": {
                    "scheduler": "jobqueue",
                    "cluster": {"kind": "slurm", "job_extra_directive": ["--gres"]},
                }
            },
            "execution.cluster.job_extra_directive",
            "job_extra_directives",
        ),
    ],
)
def test_did_you_mean_at_every_level(change, path, hint):
    raw = base(**change)
    if "source" in change:
        raw["source"] = change["source"]
    p = problems(raw)
    assert path in p, p
    assert f"did you mean {hint!r}" in p[path]


def test_views_without_options_refuse_any():
    p = problems(base(view={"name": "graph", "lookback": 2}))
    assert "takes no options" in p["view.lookback"]
    p = problems(base(), ["view.lookback=3"])  # the default flat view
    assert "takes no options" in p["view.lookback"]


def test_strict_types_no_coercion():
    p = problems(base(chunk_rows="7", split_seed=True, sample_dims=[1], target_chunk_bytes="big"))
    assert set(p) == {"chunk_rows", "split_seed", "sample_dims[0]", "target_chunk_bytes"}
    # walltime read by YAML 1.1 as a base-60 number: say to quote it
    raw = yaml.safe_load(
        "execution: {scheduler: jobqueue, cluster: {kind: slurm, walltime: 1:00:00}}"
    )
    p = problems(base(**raw))
    assert "'01:00:00'" in p["execution.cluster.walltime"]


def test_cross_key_rules():
    p = problems(base(format="npy", compression="zstd", shard_chunks=2))
    assert "npy" in p["compression"] and "zarr" in p["shard_chunks"]
    # reported together with the problems of single keys, never as a consequence of one
    p = problems(base(format="npy", compression="zstd", overwrite="no", view="windw"))
    assert set(p) == {"compression", "overwrite", "view.name"}
    p = problems(base(execution={"scheduler": "jobqueue"}))
    assert "cluster" in p["execution.cluster"]
    p = problems(base(arrays={}))
    assert "arrays" in p


def test_valid_config_resolves():
    cfg = load_config(
        base(
            source="small.nc",
            view={"name": "window", "lookback": 3, "targets": {"y": "b"}},
            dtype="f4",
            target_chunk_bytes="1MiB",
            execution={
                "scheduler": "jobqueue",
                "cluster": {
                    "kind": "slurm",
                    "jobs": 2,
                    "cores": 4,
                    "memory": "8GB",
                    "walltime": "01:00:00",
                    "job_extra_directives": ["--gres=gpu"],
                },
            },
        ),
        base_dir="/data",
    )
    assert cfg.source.paths == ("/data/small.nc",) and cfg.out == "/data/out"
    assert cfg.view == "window" and cfg.view_options["lookback"] == 3
    assert cfg.view_options["targets"] == {"y": ["b"]}
    assert cfg.dtype == "float32" and cfg.target_chunk_bytes == 2**20
    assert cfg.execution.cluster == {
        "kind": "slurm",
        "jobs": 2,
        "cores": 4,
        "memory": "8GB",
        "walltime": "01:00:00",
        "job_extra_directives": ["--gres=gpu"],
    }
    assert cfg.compression == "auto" and load_config(base(format="npy")).compression == "none"


def test_overrides_are_yaml_then_strict():
    cfg = load_config(base(view="window"), ["overwrite=false", "view.lookback=4", "splits={}"])
    assert cfg.overwrite is False and cfg.view_options["lookback"] == 4 and cfg.splits == {}
    p = problems(base(), ['overwrite="false"'])
    assert "string 'false'" in p["overwrite"]
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(base(), ["overwrite"])


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_validate(path):
    cfg = load_config(path)
    assert cfg.out and cfg.source.paths


def test_readme_config_validates():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    text = readme.split("cat > radiation.yaml <<'EOF'\n", 1)[1].split("\nEOF", 1)[0]
    cfg = load_config(yaml.safe_load(text), base_dir="/x")
    assert cfg.arrays == {"x": ("skin_temperature", "temperature_hl", "pressure_hl")}
    assert cfg.out == "/x/rad-store" and cfg.source.combine == "nested"


def test_cluster_keys_are_dask_jobqueue_names():
    jq = pytest.importorskip("dask_jobqueue")
    from dask_jobqueue.core import Job, JobQueueCluster

    deprecated = {"extra", "job_extra", "env_extra", "header_skip"}
    internal = {
        "self",
        "scheduler",
        "config_name",
        "base_class_kwargs",
        "security",
        "loop",
        "job_cls",
        "asynchronous",
        "scheduler_cls",
        "job_kwargs",
        "n_workers",
    }
    common = set(inspect.signature(Job.__init__).parameters)
    common |= set(inspect.signature(JobQueueCluster.__init__).parameters)
    for kind, (cls_name, model) in CLUSTER_KINDS.items():
        job_cls = getattr(jq, cls_name).job_cls
        theirs = common | set(inspect.signature(job_cls.__init__).parameters)
        ours = set(model.model_fields) - {"kind", "jobs"}
        assert ours - {"config_name"} <= theirs - deprecated, (kind, ours - theirs)
        assert theirs - deprecated - internal <= ours, (kind, theirs - deprecated - internal - ours)


def test_config_schema_describes_the_models():
    schema = config_schema()
    assert set(schema["properties"]) == set(PrepareModel.model_fields)
    json.dumps(schema)  # JSON-able
    text = json.dumps(schema)
    for key in ("lookback", "job_extra_directives", "walltime", "storage_options"):
        assert key in text


# -- before any I/O ------------------------------------------------------------------------------
def test_config_error_writes_nothing(tmp_path, small_nc):
    out = tmp_path / "s"
    raw = base(str(out), source={"paths": [str(small_nc)]}, splits={"train": 0.9, "val": 0.3})
    with pytest.raises(ConfigError, match="splits"):
        shardload.prepare(raw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.nc"]


def test_quoted_false_never_replaces_a_store(tmp_path, small_nc):
    out = tmp_path / "s"
    shardload.prepare(base(str(out), source={"paths": [str(small_nc)]}))
    before = tree_bytes(out)
    with pytest.raises(ConfigError, match="overwrite"):
        shardload.prepare(
            base(str(out), source={"paths": [str(small_nc)]}, chunk_rows=5, overwrite="false")
        )
    assert tree_bytes(out) == before
    assert not (tmp_path / "s.partial").exists()


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """``shardload ARGS`` in this process (exit status, stdout, stderr)."""
    from shardload.cli.app import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_prepare_check_prints_the_plan_and_writes_nothing(tmp_path, monkeypatch, capsys):
    make_dataset(50).to_netcdf(tmp_path / "small.nc")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(base("store", shard_chunks=2)))
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = _cli(capsys, "prepare", "--check", "c.yaml")
    assert code == 0, err
    assert "length    50 samples" in out
    assert "(50, 4)" in out and "float32" in out  # x: a (1) + b (3)
    assert "8 chunks of 7 rows" in out and "4 shards" in out
    assert "train" in out and "nothing was written" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    code, out, err = _cli(capsys, "prepare", "--check", "c.yaml", "--set", "view.lookbak=2")
    assert code == 2 and "view.lookbak" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_config_schema_command(capsys):
    code, out, _ = _cli(capsys, "config-schema")
    assert code == 0 and json.loads(out)["title"] == "shardload prepare config"
