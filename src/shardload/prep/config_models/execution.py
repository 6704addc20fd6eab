"""``execution:``: how write tasks run (threads, processes, dask distributed, batch jobs
through dask-jobqueue, with one model per cluster kind)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (
    Field,
    field_validator,
)

from shardload.prep.config_models.fields import (
    PositiveInt,
    StrictModel,
)


class _JobqueueCommon(StrictModel):
    """Keys every dask-jobqueue cluster takes (``dask_jobqueue.core.Job`` and
    ``JobQueueCluster``), with shardload's ``jobs``. Passed on as written."""

    jobs: PositiveInt = Field(1, description="batch jobs to start (cluster.scale(jobs=N))")
    cores: PositiveInt | None = None
    memory: str | None = None
    processes: PositiveInt | None = None
    nanny: bool | None = None
    protocol: str | None = None
    interface: str | None = None
    death_timeout: float | None = None
    local_directory: str | None = None
    worker_command: str | None = None
    worker_extra_args: list[str] | None = None
    job_extra_directives: list[str] | None = None
    job_script_prologue: list[str] | None = None
    job_directives_skip: list[str] | None = None
    log_directory: str | None = None
    shebang: str | None = None
    python: str | None = None
    job_name: str | None = None
    name: str | None = None
    config_name: str | None = None
    shared_temp_directory: str | None = None
    dashboard_address: str | None = None
    host: str | None = None
    scheduler_options: dict[str, Any] | None = None
    silence_logs: str | None = None


class _Batch(_JobqueueCommon):
    queue: str | None = None
    project: str | None = None
    walltime: str | None = None

    @field_validator("walltime", mode="before")
    @classmethod
    def _clock(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            h, rest = divmod(v, 3600)
            raise ValueError(
                f"YAML read an unquoted time as the number {v} (base 60); quote it: "
                f"walltime: '{h:02d}:{rest // 60:02d}:{rest % 60:02d}'"
            )
        return v


class SLURMClusterModel(_Batch):
    kind: Literal["slurm"]
    account: str | None = None
    job_cpu: PositiveInt | None = None
    job_mem: str | None = None


class PBSClusterModel(_Batch):
    kind: Literal["pbs"]
    account: str | None = None
    resource_spec: str | None = None


class LSFClusterModel(_Batch):
    kind: Literal["lsf"]
    ncpus: PositiveInt | None = None
    mem: PositiveInt | None = None
    lsf_units: str | None = None
    use_stdin: bool | None = None


class SGEClusterModel(_Batch):
    kind: Literal["sge"]
    resource_spec: str | None = None


class OARClusterModel(_Batch):
    kind: Literal["oar"]
    resource_spec: str | None = None
    memory_per_core_property_name: str | None = None


class MoabClusterModel(_Batch):
    kind: Literal["moab"]
    account: str | None = None
    resource_spec: str | None = None


class HTCondorClusterModel(_JobqueueCommon):
    kind: Literal["htcondor"]
    disk: str | None = None
    submit_command_extra: list[str] | None = None
    cancel_command_extra: list[str] | None = None


ClusterModel = Annotated[
    Union[  # noqa: UP007
        SLURMClusterModel,
        PBSClusterModel,
        LSFClusterModel,
        SGEClusterModel,
        OARClusterModel,
        MoabClusterModel,
        HTCondorClusterModel,
    ],
    Field(discriminator="kind"),
]
#: cluster kind -> (dask_jobqueue class, its model)
CLUSTER_KINDS: dict[str, tuple[str, type[_JobqueueCommon]]] = {
    "slurm": ("SLURMCluster", SLURMClusterModel),
    "pbs": ("PBSCluster", PBSClusterModel),
    "lsf": ("LSFCluster", LSFClusterModel),
    "sge": ("SGECluster", SGEClusterModel),
    "oar": ("OARCluster", OARClusterModel),
    "moab": ("MoabCluster", MoabClusterModel),
    "htcondor": ("HTCondorCluster", HTCondorClusterModel),
}


class ExecutionModel(StrictModel):
    """How write tasks run (``execution:``; a string is shorthand for ``scheduler``)."""

    #: auto: the process's active distributed.Client if there is one, else threads
    scheduler: Literal["auto", "threads", "processes", "distributed", "jobqueue", "sync"] = "auto"
    num_workers: PositiveInt | None = None
    threads_per_worker: PositiveInt = 1
    address: str | None = None
    cluster: ClusterModel | None = None
    #: jobqueue: seconds to wait for the batch jobs' workers, then an error saying what the
    #: batch system reports (never a hang)
    timeout_s: Annotated[float, Field(gt=0)] = 300.0


def execution_shorthand(v: Any) -> Any:
    return {"scheduler": v} if isinstance(v, str) else v
