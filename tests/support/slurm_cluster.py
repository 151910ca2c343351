"""A real, single-host Slurm for tests: munged, slurmctld and two slurmd "nodes" (n1, n2) on this
machine, configured in a temporary folder and torn down afterwards.

Each node advertises 16 CPUs and 8 GPUs whatever the machine has (`SlurmdParameters=config_overrides`;
the GPUs are gres entries backed by /dev/null links), so batch scripts written for GPU nodes run
unchanged: the bundled runtime itself runs on CPU with gloo. The node names do not resolve — as on
clusters with private naming — and every node's NodeAddr is 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "sinfo", "scontrol", "squeue", "scancel")
NODE_CPUS, NODE_GPUS = 16, 8
NODES = ("n1", "n2")
MUNGE_SOCKET_DIR = Path("/run/munge")


class SlurmUnavailable(Exception):
    """Slurm cannot run here (not installed, not root); the message is the skip reason."""


@dataclass(frozen=True)
class LocalSlurm:
    root: Path
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        """Environment for client commands (and, through sbatch's --export=ALL, for jobs)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *command: str, timeout: float = 30, check: bool = True,
            cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(list(command), env={**self.env, **(env or {})}, cwd=cwd, capture_output=True,
                              text=True, timeout=timeout, check=check)

    def node_states(self) -> list[str]:
        listed = self.run("sinfo", "--noheader", "--Node", "--format=%T", check=False).stdout
        return listed.split()


def _conf(root: Path) -> str:
    ports = [free_port() for _ in NODES]
    return "\n".join([
        "ClusterName=moeplan-test",
        "SlurmctldHost=localhost",
        "SlurmUser=root",
        f"SlurmctldPort={free_port()}",
        "AuthType=auth/munge",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "MinJobAge=4",  # or `sbatch --wait` polls at 2, 10, 42 ... seconds
        "EnforcePartLimits=ALL",  # or an impossible job pends forever and `sbatch --wait` hangs
        "KillWait=5",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
        "GresTypes=gpu",
        *(f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={NODE_CPUS} "
          f"Gres=gpu:{NODE_GPUS} State=UNKNOWN" for node, port in zip(NODES, ports, strict=True)),
        f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _check_installed() -> None:
    missing = [tool for tool in (*DAEMONS, *CLIENTS) if shutil.which(tool) is None]
    if missing:
        raise SlurmUnavailable(f"Slurm is not installed ({', '.join(missing)} missing; .ci/system-deps "
                               "installs slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        raise SlurmUnavailable("a local Slurm needs root (SlurmUser=root, munged as the munge user)")


def _munge_works() -> bool:
    probe = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
    return probe.returncode == 0


def _start_munged() -> int | None:
    """Start munged unless one already answers; return the pid to stop afterwards (None: not ours)."""
    if _munge_works():
        return None
    MUNGE_SOCKET_DIR.mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_SOCKET_DIR, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True, capture_output=True, timeout=30)
    for _ in range(50):
        if _munge_works():
            pid_file = MUNGE_SOCKET_DIR / "munged.pid"
            return int(pid_file.read_text()) if pid_file.exists() else None
        time.sleep(0.1)
    raise SlurmUnavailable("munged did not come up")


def _stop(pid_file: Path, timeout: float = 10) -> None:
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


@contextmanager
def local_slurm(root: Path, ready_timeout: float = 30) -> Iterator[LocalSlurm]:
    """slurmctld + one `slurmd -N <node>` per node, configured under `root`, up until all are idle."""
    _check_installed()
    for folder in ("state", "spool", "log", "gpus"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    gpus = []
    for index in range(NODE_GPUS):
        link = root / "gpus" / f"gpu{index}"  # gres files must be character devices
        if not link.is_symlink():
            link.symlink_to("/dev/null")
        gpus.append(str(link))
    conf = root / "slurm.conf"
    conf.write_text(_conf(root))
    (root / "gres.conf").write_text(f"NodeName={','.join(NODES)} Name=gpu File={','.join(gpus)}\n")
    cluster = LocalSlurm(root, conf)
    munged = _start_munged()
    try:
        daemons = [["slurmctld", "-f", str(conf)]]
        daemons += [["slurmd", "-f", str(conf), "-N", node] for node in NODES]
        for daemon in daemons:
            started = cluster.run(*daemon, check=False)
            if started.returncode != 0:
                raise SlurmUnavailable(f"{daemon[0]} did not start: {started.stderr.strip()}")
        deadline = time.monotonic() + ready_timeout
        while cluster.node_states() != ["idle"] * len(NODES):
            if time.monotonic() > deadline:
                log = (root / "log" / "slurmctld.log").read_text(errors="replace")[-2000:]
                raise SlurmUnavailable(f"the Slurm nodes did not become idle "
                                       f"(states {cluster.node_states()}); slurmctld log tail:\n{log}")
            time.sleep(0.2)
        yield cluster
    finally:
        cluster.run("scancel", "--full", "--user=root", check=False)
        for node in NODES:
            _stop(root / f"slurmd-{node}.pid")
        _stop(root / "slurmctld.pid")
        if munged is not None:
            try:
                os.kill(munged, signal.SIGTERM)
            except ProcessLookupError:
                pass
