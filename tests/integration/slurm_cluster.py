"""A throw-away single-node SLURM (slurmctld + slurmd + munged) for the job-queue tests.

Debian's ``slurm-wlm`` 22.05 and ``munge`` start as root, without systemd, in a few seconds.
Everything lives in one temporary folder: the munge key, socket, pid, log and seed files; the
slurm.conf; state, spool, logs and pid files. Daemons run in the foreground as our children so
that :meth:`SlurmCluster.stop` can end them by pid (never by name). Every client command needs
``SLURM_CONF`` in its environment: :attr:`SlurmCluster.env`.

Facts this follows (measured on the 2-core test machine):

- munged needs its socket folder and *every parent* world-executable, so the root folder is a
  0755 ``mkdtemp`` under /tmp (pytest's ``tmp_path`` is 0700); the key is 1 KiB random, 0400.
- ``cgroup`` plugins break job launch here: ``proctrack/linuxproc`` and ``task/none``.
- RealMemory (MB) must cover dask-jobqueue's ``--mem`` (1GB -> 954M).
- The daemons bind 0.0.0.0 unless ``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny``, which
  is only correct when the hostname resolves to 127.0.0.1.
- With slurmd down, cancelled jobs stay ``CG`` until ``SlurmdTimeout``: it is set low.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def missing_reason() -> str | None:
    """Why a real SLURM cannot start here (None when it can)."""
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        return (
            f"SLURM/munge binaries missing ({', '.join(missing)}): install slurm-wlm and munge "
            "(make sysdeps, as root)"
        )
    if os.geteuid() != 0:
        return "the SLURM test cluster runs its daemons as root (SlurmUser=root); not root here"
    return None


def _exe(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    return str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node_resources() -> tuple[int, int]:
    """(CPUs, RealMemory in MB) as ``slurmd -C`` reports them."""
    out = subprocess.run([_exe("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return int(fields.get("CPUs", os.cpu_count() or 1)), int(fields.get("RealMemory", 1024))


def _hostname_is_loopback() -> bool:
    try:
        return socket.gethostbyname(socket.gethostname()) == "127.0.0.1"
    except OSError:
        return False


class SlurmCluster:
    """One controller, one node (``localhost``), partition ``debug``; see the module docs."""

    def __init__(self, *, slurmd_timeout_s: int = 5) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="shardload-slurm-", dir="/tmp"))
        self.root.chmod(0o755)
        self.slurmd_timeout_s = slurmd_timeout_s
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.timings: dict[str, float] = {}

    # -- setup --------------------------------------------------------------------------------
    def _write_files(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o755)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for d in ("state", "spool", "log", "run"):
            (self.root / d).mkdir(mode=0o755)
        cpus, mem = _node_resources()
        comm = (
            "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny\n"
            if _hostname_is_loopback()
            else ""
        )
        r = self.root
        self.conf.write_text(
            f"""ClusterName=shardloadtest
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
MailProg=/bin/true
SlurmdTimeout={self.slurmd_timeout_s}
InactiveLimit=0
KillWait=2
MinJobAge=2
MessageTimeout=5
JobCompType=jobcomp/none
MpiDefault=none
AccountingStorageType=accounting_storage/none
{comm}NodeName=localhost CPUs={cpus} RealMemory={mem} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""
        )

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "ab")  # noqa: SIM115 - kept by Popen
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()

    def start_munge(self) -> None:
        m = self.root / "munge"
        self._spawn(
            "munged",
            [
                _exe("munged"),
                "-F",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={m / 'munge.key'}",
                f"--pid-file={m / 'munged.pid'}",
                f"--log-file={m / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), 10, "munged socket")

    def start_slurmctld(self) -> None:
        self._spawn("slurmctld", [_exe("slurmctld"), "-D", "-c", "-f", str(self.conf)])

    def start_slurmd(self) -> None:
        self._spawn("slurmd", [_exe("slurmd"), "-D", "-N", "localhost", "-f", str(self.conf)])

    def start(self, timeout_s: float = 60) -> SlurmCluster:
        t0 = time.perf_counter()
        try:
            self._write_files()
            self.start_munge()
            self.start_slurmctld()
            self.start_slurmd()
            self._wait(self.node_idle, timeout_s, "node localhost idle in sinfo")
        except BaseException:
            self.stop()
            raise
        self.timings["cluster_up_s"] = time.perf_counter() - t0
        return self

    # -- queries ------------------------------------------------------------------------------
    def run(self, *cmd: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(cmd), capture_output=True, text=True, env=self.env, timeout=timeout_s
        )

    def node_idle(self) -> bool:
        for name in ("munged", "slurmctld", "slurmd"):
            p = self.procs.get(name)
            if p is not None and p.poll() is not None:
                raise RuntimeError(f"{name} exited ({p.returncode}): {self.logs()}")
        r = self.run("sinfo", "-h", "-N", "-o", "%T", timeout_s=10)
        return r.returncode == 0 and r.stdout.strip().rstrip("*") in ("idle", "mixed")

    def jobs(self) -> list[str]:
        """``JOBID STATE`` lines of every job the controller knows (running or not)."""
        r = self.run("squeue", "-h", "-o", "%i %T", timeout_s=15)
        if r.returncode != 0:
            raise RuntimeError(f"squeue failed: {r.stderr.strip()}")
        return [line for line in r.stdout.splitlines() if line.strip()]

    def logs(self, tail: int = 2000) -> str:
        out = []
        for f in [*sorted((self.root / "log").glob("*")), self.root / "munge" / "munged.log"]:
            if f.exists():
                out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    @staticmethod
    def _wait(cond: object, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cond():  # type: ignore[operator]
                return
            time.sleep(0.2)
        raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")

    # -- teardown -----------------------------------------------------------------------------
    def stop_daemon(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)

    def cancel_all(self, wait_s: float = 20) -> None:
        """Cancel every job and wait (a little) until the controller lists none, so that slurmd
        ends their processes before it stops."""
        if not all(n in self.procs for n in ("munged", "slurmctld")):
            return
        self.run("scancel", "--full", "-u", "root", timeout_s=15)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self.jobs():
            time.sleep(0.3)

    def stop(self) -> None:
        """Cancel every job, stop the daemons (by pid), remove the folder. Safe to call twice."""
        with contextlib.suppress(OSError, subprocess.SubprocessError, RuntimeError):
            self.cancel_all()
        for name in ("slurmd", "slurmctld", "munged"):
            self.stop_daemon(name)
        shutil.rmtree(self.root, ignore_errors=True)
