"""A private one-node Slurm cluster for tests: munged, MariaDB + slurmdbd (so that sacct, and with it submitit, sees
the true state of a job: COMPLETED, FAILED, CANCELLED), slurmctld and slurmd, on free ports, every file in one
temporary folder, each daemon in the foreground so that it is stopped by its process id. MariaDB takes no login
without a password over TCP (root: its socket alone; slurmdbd: a random password), so that other local users
cannot reach it while the tests run.

Needs root (slurmd runs jobs as their user) and Debian's slurm-wlm, slurmdbd, munge and mariadb-server (.ci/run
installs them). Each wait is on a condition, with a generous deadline."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("munged", "mungekey", "mariadb-install-db", "mariadbd", "mariadb", "slurmdbd", "slurmctld", "slurmd", "sbatch",
            "sacct", "sacctmgr", "scontrol", "scancel", "squeue", "sinfo", "srun")
INSTALL = "apt-get install slurm-wlm slurmdbd munge mariadb-server"
CLUSTER = "gcltest"
SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"
DB_USER, DB_NAME = "slurm", "slurm_acct_db"
MEMORY_MB = 65536                # the node's declared memory and GPUs (it need not have them)
GPU_FILES = ("/dev/null", "/dev/zero")     # stand-ins for GPU devices: slurmd counts the files
GPUS = len(GPU_FILES)


def why_not_here() -> str | None:
    """Why this machine cannot start the cluster (not root, a program missing), or None."""
    if os.geteuid() != 0:
        return "the private Slurm cluster needs root (slurmd runs each job as its user)"
    path = f"{os.environ.get('PATH', '')}:{SBIN}"
    missing = [p for p in PROGRAMS if shutil.which(p, path=path) is None]
    if missing:
        return f"no {', '.join(missing)} on this machine: {INSTALL}"
    return None


def free_ports(n: int) -> list[int]:
    """`n` TCP ports no one listens on now (bound together, so that they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class SlurmCluster:
    folder: Path
    env: dict                       # what a Slurm client needs: SLURM_CONF, and the sbin folders on PATH
    db_port: int                    # MariaDB's TCP port (127.0.0.1): slurmdbd's, with its password
    daemons: list = field(default_factory=list)     # (name, Popen), in the order they started

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm tool (sinfo, sacct, scancel, ...) against this cluster."""
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done

    def start(self, name: str, *cmd: str) -> subprocess.Popen:
        log = open(self.folder / f"{name}.out", "ab")
        process = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   preexec_fn=_default_signals)
        log.close()
        self.daemons.append((name, process))
        return process

    def wait_for(self, what: str, condition, deadline_s: float = 120.0) -> None:
        """Wait until `condition()` holds; fail naming `what`, the daemons that died and the logs' ends."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if condition():
                return
            dead = [f"{name} (exit {p.returncode})" for name, p in self.daemons if p.poll() is not None]
            if dead:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the test's Slurm cluster did not get to '{what}'; dead: {dead or 'none'}\n{self.logs()}")

    def logs(self, lines: int = 15) -> str:
        out = []
        for log in sorted(self.folder.glob("*.out")) + sorted(self.folder.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(out)

    def idle(self) -> bool:
        done = self.run("sinfo", "-h", "-o", "%T", check=False)
        return done.returncode == 0 and done.stdout.strip() == "idle"

    def queue_empty(self) -> bool:
        done = self.run("squeue", "-h", "-o", "%i", check=False)
        return done.returncode == 0 and not done.stdout.strip()

    def stop(self) -> None:
        """Cancel every job, wait for the queue to empty, stop each daemon by its pid (last started first), then end
        any process still running from this cluster's folder (a job's step daemon, a job's own process)."""
        if self.daemons and all(p.poll() is None for _, p in self.daemons):
            self.run("scancel", "--full", "--user", "root", check=False)
            end = time.monotonic() + 60
            while time.monotonic() < end and not self.queue_empty():
                time.sleep(0.5)
        for name, process in reversed(self.daemons):
            _end(process.pid, lambda p=process: p.poll() is not None)
        end_processes_naming(self.folder)


def end_processes_naming(*folders: Path) -> list[int]:
    """End (by pid) every process whose command line, environment or working folder names one of `folders`: what a
    test started there and left running (a job's step daemon or its commands, a driver, a warm stage server).
    Returns their pids."""
    pids = processes_naming(*folders)
    for pid in pids:
        _end(pid, lambda pid=pid: not Path(f"/proc/{pid}").exists())
    return pids


def processes_naming(*folders: Path) -> list[int]:
    markers = [str(Path(f).resolve()).encode() for f in folders]
    mine = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            seen = (proc / "cmdline").read_bytes() + b"\0" + (proc / "environ").read_bytes() + b"\0" + \
                os.readlink(proc / "cwd").encode()
        except OSError:
            continue
        if any(marker in seen for marker in markers):
            mine.append(int(proc.name))
    return mine


def _default_signals() -> None:
    """A daemon's SIGINT and SIGTERM as the daemon expects them, even when the tests run with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _end(pid: int, gone, grace_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            if gone():
                return
            try:
                os.waitpid(pid, os.WNOHANG)        # reap it if it is our child
            except ChildProcessError:
                pass
            time.sleep(0.1)


def start_cluster(folder: Path, cpus: int = 8) -> SlurmCluster:
    """Start the cluster in `folder` (which must exist and be private); `cpus` is what the node declares, whatever
    the machine has, so that several small jobs run side by side on a small machine."""
    folder = folder.resolve()
    for sub in ("state", "spool", "db", "run"):
        (folder / sub).mkdir(exist_ok=True)
    ctld_port, slurmd_port, dbd_port, db_port = free_ports(4)
    db_password = secrets.token_hex(16)
    host = socket.gethostname().split(".")[0]
    munge_socket = folder / "run" / "munge.socket"
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf"), "PATH": f"{os.environ.get('PATH', '')}:{SBIN}"}
    env.pop("SLURM_JOB_ID", None)
    cluster = SlurmCluster(folder, env, db_port)
    try:
        _write_configs(folder, host, cpus, ctld_port, slurmd_port, dbd_port, db_port, munge_socket, db_password)
        subprocess.run(["mungekey", "--create", f"--keyfile={folder / 'munge.key'}"], env=env, check=True,
                       capture_output=True)
        cluster.start("munged", "munged", "--foreground", "--force", f"--socket={munge_socket}",
                      f"--key-file={folder / 'munge.key'}", f"--pid-file={folder / 'run' / 'munged.pid'}",
                      f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'run' / 'munged.seed'}")
        # root logs in through the socket alone, as the OS's root (unix_socket); slurmdbd, over TCP on 127.0.0.1, as
        # a user of its own with a random password that only the 0600 slurmdbd.conf holds
        subprocess.run(["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={folder / 'db'}",
                        "--auth-root-authentication-method=socket", "--skip-test-db"],
                       env=env, check=True, capture_output=True)
        cluster.start("mariadbd", "mariadbd", "--no-defaults", "--user=root", f"--datadir={folder / 'db'}",
                      f"--socket={folder / 'run' / 'mysql.sock'}", f"--port={db_port}", "--bind-address=127.0.0.1",
                      f"--pid-file={folder / 'run' / 'mariadbd.pid'}", "--skip-name-resolve",
                      "--innodb-buffer-pool-size=32M", "--innodb-flush-log-at-trx-commit=0", "--skip-log-bin")
        cluster.wait_for("munged's socket", munge_socket.exists)
        cluster.wait_for("MariaDB listening", lambda: listening(db_port))
        subprocess.run(["mariadb", "--no-defaults", f"--socket={folder / 'run' / 'mysql.sock'}", "-u", "root", "-e",
                        "DELETE FROM mysql.global_priv WHERE User = ''; FLUSH PRIVILEGES; "       # no anonymous login
                        f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{db_password}'; "
                        f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';"], env=env, check=True, capture_output=True)
        cluster.start("slurmdbd", "slurmdbd", "-D")
        cluster.wait_for("slurmdbd listening", lambda: listening(dbd_port))
        cluster.run("sacctmgr", "-i", "add", "cluster", CLUSTER)
        cluster.start("slurmctld", "slurmctld", "-D", "-i")
        cluster.wait_for("slurmctld answering", lambda: cluster.run("scontrol", "ping", check=False).returncode == 0
                         and "UP" in cluster.run("scontrol", "ping", check=False).stdout)
        cluster.start("slurmd", "slurmd", "-D", "-N", host)
        cluster.wait_for("the node idle", cluster.idle)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _write_configs(folder: Path, host: str, cpus: int, ctld_port: int, slurmd_port: int, dbd_port: int, db_port: int,
                   munge_socket: Path, db_password: str) -> None:
    # cred_expire: how long Slurm holds a requeued job before it may start again (default 120 s)
    auth = f"AuthType=auth/munge\nAuthInfo=socket={munge_socket},cred_expire=5\n"
    (folder / "slurm.conf").write_text(
        f"ClusterName={CLUSTER}\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n"
        "SlurmUser=root\nSlurmdUser=root\n" + auth +
        f"StateSaveLocation={folder / 'state'}\nSlurmdSpoolDir={folder / 'spool'}\n"
        f"SlurmctldPidFile={folder / 'run' / 'slurmctld.pid'}\nSlurmdPidFile={folder / 'run' / 'slurmd.pid'}\n"
        f"SlurmctldLogFile={folder / 'slurmctld.log'}\nSlurmdLogFile={folder / 'slurmd.log'}\n"
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\nSwitchType=switch/none\n"
        "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/slurmdbd\n"
        f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={dbd_port}\n"
        f"AccountingStoragePass={munge_socket}\n"   # the munge socket of slurmctld's and the tools' slurmdbd connections
        "SchedulerType=sched/backfill\nSchedulerParameters=sched_interval=2,bf_interval=2\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        # KillWait: SIGTERM to SIGKILL, time for a job to stop its train stage with SIGINT (30 s by default)
        "SlurmdParameters=config_overrides\nReturnToService=2\nKillWait=10\nMinJobAge=5\nInactiveLimit=0\n"
        "SlurmctldTimeout=30\nSlurmdTimeout=30\nMessageTimeout=20\nJobRequeue=1\n"
        "GresTypes=gpu\n"
        # what the node declares, whatever the machine has (config_overrides): room for a job's --mem-gb 32 and
        # --gpus 2 (two GPUs without devices: jobs may ask for them, and sbatch checks what they ask for)
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={MEMORY_MB} Gres=gpu:{GPUS} State=UNKNOWN\n"
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP\n")
    (folder / "gres.conf").write_text("".join(f"NodeName={host} Name=gpu File={device}\n" for device in GPU_FILES))
    dbd = folder / "slurmdbd.conf"
    dbd.touch(mode=0o600)            # private before the password is in it (slurmdbd also refuses a readable one)
    dbd.chmod(0o600)
    dbd.write_text(
        f"DbdHost=localhost\nDbdAddr=127.0.0.1\nDbdPort={dbd_port}\nSlurmUser=root\n" + auth +
        f"PidFile={folder / 'run' / 'slurmdbd.pid'}\nLogFile={folder / 'slurmdbd.log'}\n"
        f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={db_port}\n"
        f"StorageUser={DB_USER}\nStoragePass={db_password}\nStorageLoc={DB_NAME}\n")
