"""A real Slurm cluster of several nodes on one Linux machine, to rehearse the launch path (`make cluster-rehearsal`).

Each node is a network namespace with its own address on a bridge (a veth pair per node), its own hostname (a UTS
namespace) and its own ``/etc/hosts`` (``/etc/netns/NODE/hosts``, which ``ip netns exec`` puts in place), running
Debian's ``slurmd``; ``slurmctld`` runs in the root namespace under the machine's own hostname, on the bridge's
address. Authentication is a ``munged`` of the cluster's own (its key, socket and logs in the cluster's folder), so a
munge the machine already runs is left alone. The file system is shared, as on a real cluster.

Needs root (namespaces, the bridge, the daemons). :meth:`Cluster.down` removes every process, namespace, link and
file it made, and is safe to call on a half-built cluster or one a killed rehearsal left behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["Cluster", "ClusterError", "install_slurm"]

BRIDGE = "zrbr0"
PREFIX = "zr"  # nodes zr1, zr2, ...; their host-side veth ends zrv1, zrv2, ...
SUBNET = "10.77.0"  # the controller at .1, node i at .(10 + i)
PACKAGES = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm", "munged": "munge"}


class ClusterError(RuntimeError):
    """The cluster could not be built or did not answer; the message says what."""


def _run(*command: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if check and done.returncode:
        raise ClusterError(f"{' '.join(command)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done


def install_slurm() -> list[str]:
    """Install Debian's slurm-wlm and munge where missing (root); the packages installed."""
    missing = sorted({package for tool, package in PACKAGES.items() if shutil.which(tool) is None})
    if missing:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(["apt-get", "install", "-y", "-q", *missing], env=env, capture_output=True).returncode:
            _run("apt-get", "update", "-q", env=env)
            _run("apt-get", "install", "-y", "-q", *missing, env=env)
    return missing


class Cluster:
    """``nodes`` Slurm nodes (``zr1``...) of ``cpus`` CPUs each, their files under ``folder``.

    Args:
        folder: where the configuration, state, daemons' logs and munge's files go (created).
        nodes: how many nodes.
        cpus: the CPUs each node declares (all of them share the machine's cores).
        slurmd_timeout: Slurm's SlurmdTimeout (seconds until a silent node is DOWN).
        kill_wait: Slurm's KillWait (seconds from a step's SIGTERM to its SIGKILL).
        cred_expire: munge's credential lifetime (AuthInfo's cred_expire), which is also how long a requeued job
            waits before it may start again: Slurm's default is 120 s; 30 here, where steps launch at once.
    """

    def __init__(
        self, folder: Path, nodes: int = 6, cpus: int = 2, slurmd_timeout: int = 30, kill_wait: int = 10,
        cred_expire: int = 30,
    ):  # fmt: skip
        self.folder = Path(folder).resolve()
        self.names = [f"{PREFIX}{i}" for i in range(1, nodes + 1)]
        self.cpus = cpus
        self.slurmd_timeout = slurmd_timeout
        self.kill_wait = kill_wait
        self.cred_expire = cred_expire
        self.controller = socket.gethostname()
        self.env = dict(os.environ, SLURM_CONF=str(self.folder / "slurm.conf"))

    def address(self, node: str) -> str:
        return f"{SUBNET}.{10 + int(node[len(PREFIX) :])}"

    # ------------------------------------------------------------------ building

    def up(self) -> None:
        """Network, munge, slurmctld, one slurmd per node; returns once every node is idle."""
        self.down()  # what a killed rehearsal may have left
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        self._network()
        self._munge()
        self._configure()
        _run("slurmctld", "-c", env=self.env)  # -c: no state from an earlier cluster
        for node in self.names:
            _run(
                "ip", "netns", "exec", node, "unshare", "--uts", "sh", "-c",
                f"hostname {node} && exec slurmd -N {node}", env=self.env,
            )  # fmt: skip
        self.wait_idle(self.names, 60)

    def _network(self) -> None:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        hosts = ["127.0.0.1 localhost", f"{SUBNET}.1 {self.controller}"]
        hosts += [f"{self.address(node)} {node}" for node in self.names]
        for node in self.names:
            veth = node.replace(PREFIX, f"{PREFIX}v", 1)
            _run("ip", "netns", "add", node)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", node)
            _run("ip", "link", "set", veth, "master", BRIDGE, "up")
            _run("ip", "-n", node, "addr", "add", f"{self.address(node)}/24", "dev", "eth0")
            _run("ip", "-n", node, "link", "set", "eth0", "up")
            _run("ip", "-n", node, "link", "set", "lo", "up")
            etc = Path("/etc/netns") / node
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("\n".join(hosts) + "\n")

    def _munge(self) -> None:
        munge = self.folder / "munge"
        munge.mkdir(exist_ok=True)
        os.chmod(munge, 0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        _run(
            "munged", "--force", f"--key-file={key}", f"--socket={munge / 'munge.socket'}",
            f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        )  # fmt: skip

    def _configure(self) -> None:
        f = self.folder
        nodes = "\n".join(
            f"NodeName={node} NodeAddr={self.address(node)} CPUs={self.cpus} RealMemory=4000" for node in self.names
        )
        (f / "slurm.conf").write_text(
            f"""# the rehearsal cluster (tools/cluster_rehearsal/cluster.py)
ClusterName=rehearsal
SlurmctldHost={self.controller}({SUBNET}.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={f / "munge" / "munge.socket"},cred_expire={self.cred_expire}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SlurmctldPidFile={f}/slurmctld.pid
SlurmdPidFile={f}/slurmd.%n.pid
SlurmdSpoolDir={f}/spool.%n
StateSaveLocation={f}/state
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmctldLogFile={f}/slurmctld.log
SlurmdLogFile={f}/slurmd.%n.log
JobCompType=jobcomp/filetxt
JobCompLoc={f}/jobcomp.txt
SlurmdTimeout={self.slurmd_timeout}
KillWait={self.kill_wait}
MinJobAge=3600
{nodes}
PartitionName=rehearsal Nodes={",".join(self.names)} Default=YES MaxTime=INFINITE State=UP
"""
        )
        # slurmd 22.05 starts on a cgroup-v1 machine only with its plugin named (none is used: proctrack/linuxproc)
        (f / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        (f / "state").mkdir(exist_ok=True)

    # ------------------------------------------------------------------ using

    def slurm(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm command (scontrol, sbatch, squeue, ...) against this cluster."""
        return _run(*command, check=check, env=self.env)

    def node_states(self) -> dict[str, str]:
        out = self.slurm("sinfo", "-N", "-h", "-o", "%N %t").stdout.split()
        return dict(zip(out[::2], out[1::2]))

    def wait_idle(self, nodes: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if all(states.get(node) == "idle" for node in nodes):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"nodes not idle within {timeout:.0f}s: {states} (see {self.folder}/slurmd.*.log)")
            time.sleep(1)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (empty once the controller forgot the job)."""
        out = self.slurm("scontrol", "-o", "show", "job", job_id, check=False).stdout
        return dict(item.split("=", 1) for item in out.split() if "=" in item)

    def completions(self) -> list[dict[str, str]]:
        """The job completion records (jobcomp/filetxt): one per job end, requeues included."""
        path = self.folder / "jobcomp.txt"
        if not path.exists():
            return []
        return [
            dict(item.split("=", 1) for item in line.split() if "=" in item)
            for line in path.read_text().splitlines()
            if line.strip()
        ]

    def pids(self, node: str) -> list[int]:
        """Every process in ``node``'s network namespace."""
        out = _run("ip", "netns", "pids", node, check=False).stdout
        return [int(pid) for pid in out.split()]

    def _job_pids(self, node: str) -> list[tuple[int, str]]:
        """``(PID, name)`` of every process on ``node`` but its Slurm daemons (slurmd, slurmstepd)."""
        found = []
        for pid in self.pids(node):
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except FileNotFoundError:
                continue
            if name not in ("slurmd", "slurmstepd"):
                found.append((pid, name))
        return found

    def job_processes(self, node: str) -> list[str]:
        """What runs on ``node`` besides its Slurm daemons: ``PID command`` of each."""
        found = []
        for pid, _ in self._job_pids(node):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except FileNotFoundError:
                continue
            found.append(f"{pid} {command.strip()[:120]}")
        return found

    def kill_node_processes(self, node: str) -> list[str]:
        """SIGKILL every process on ``node`` but its Slurm daemons; the names of those killed."""
        killed = []
        for pid, name in self._job_pids(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.append(name)
        return killed

    # ------------------------------------------------------------------ taking down

    def down(self) -> None:
        """Stop every job, daemon and process; remove namespaces, links, ``/etc/netns`` entries."""
        if self._alive(self.folder / "slurmctld.pid"):  # jobs end with their steps' processes
            try:
                _run("scancel", "--full", "--quiet", "-u", "root", check=False, env=self.env, timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for node in self._leftover_nodes():
            for pid in self.pids(node):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for pid_file in [self.folder / "slurmctld.pid", self.folder / "munge" / "munged.pid"]:
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
            except (FileNotFoundError, ValueError, ProcessLookupError):
                pass
        for node in self._leftover_nodes():
            _run("ip", "netns", "del", node, check=False)
            shutil.rmtree(Path("/etc/netns") / node, ignore_errors=True)
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            _run("ip", "link", "del", BRIDGE, check=False)
        for link in Path("/sys/class/net").glob(f"{PREFIX}v*"):
            _run("ip", "link", "del", link.name, check=False)
        try:
            Path("/etc/netns").rmdir()  # only where nothing else uses it
        except OSError:
            pass

    @staticmethod
    def _alive(pid_file: Path) -> bool:
        try:
            os.kill(int(pid_file.read_text().strip()), 0)
            return True
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return False

    def _leftover_nodes(self) -> list[str]:
        out = _run("ip", "netns", "list", check=False).stdout
        return [
            line.split()[0] for line in out.splitlines() if line.startswith(PREFIX) and line.split()[0][2:].isdigit()
        ]

    def leftovers(self) -> list[str]:
        """What :meth:`down` should have removed and is still there (empty when clean)."""
        found = [f"netns {n}" for n in self._leftover_nodes()]
        found += [f"link {p.name}" for p in Path("/sys/class/net").glob(f"{PREFIX}*")]
        found += (
            [f"/etc/netns/{p.name}" for p in Path("/etc/netns").glob(f"{PREFIX}*")]
            if Path("/etc/netns").exists()
            else []
        )
        mine = {os.getpid(), os.getppid()}
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit() or int(pid_dir.name) in mine:
                continue
            try:
                cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(self.folder) in cmdline or cmdline.startswith(("slurmd ", "slurmctld ", "slurmstepd")):
                found.append(f"process {pid_dir.name}: {cmdline[:80]}")
        return found
