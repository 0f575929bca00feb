"""`make cluster-rehearsal`: the project's Slurm launch, run for real on a Slurm cluster of CPU nodes on this machine.

    sudo python tools/cluster_rehearsal/rehearse.py [--folder DIR]

It builds 6 nodes (:mod:`cluster`: network namespaces on a bridge, Debian's slurmctld and one slurmd per node) and
submits ``sbatch recipes/launch/slurm_zppo.sbatch recipes/demo.yaml`` on 4 of them, with no GPUs: the student's vLLM
server (CPU engine) on the first node, the teacher's on the second, one training rank on each of the other two,
meeting at the third node's address. Then, in order (one line per phase, with its time):

1. ``server-never-up``: a server that does not answer within SERVER_WAIT ends the job at once, naming it.
2. ``wrong-rendezvous``: the second training node resolves the first to a wrong address (its /etc/hosts): the job
   ends within RENDEZVOUS_TIMEOUT, naming the address.
3. ``job-a``: the run. The teacher's node loses its server (SIGKILL) after the first rollout step: the launch script
   starts it again, the steps without it train without BCQ and count the failures, a later step has it back. Once
   that step's checkpoint is whole, the first training node's processes are killed (SIGKILL): the job ends, naming
   the node and the last whole checkpoint.
4. ``job-b``: the killed node drained, the job resubmitted away from the first job's training nodes with
   ``--signal=B:USR1@120``. Once its first run has written a checkpoint, its time limit is brought forward to the
   next whole minute 120 s away (:meth:`Rehearsal.reach_time_limit` says why): Slurm signals it, the run stops at a
   checkpoint, the job is requeued (its limit put back) and resumes, and COMPLETES. While it runs, after each
   weight sync, the student's server is asked for the log-probs of a fixed text.
5. ``checks``, from the run's own records: every job's end (Slurm's job completion log); both ranks' digests equal
   at every update (``zppo_trl.rank_digest``), the last one the saved model's; the weight syncs from the first
   training node only, and the server's log-probs after the last sync those of the weights it was sent; every
   server request from a training node's address; every checkpoint whole, with its buffer; the teacher's outage and
   recovery in the metrics.

After each job, nothing of it may be left on its nodes, and no server may have been restarted but the one killed.
Everything is torn down at the end, on failure and on Ctrl-C; every log stays in the folder, which is printed. Exit 0
only when every check passed. Needs root, the project's environments (`make envs`) and the demo's model.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

from cluster import Cluster, ClusterError, install_slurm  # noqa: E402

MODEL = ".cache/demo/SmolLM2-135M-Instruct"
NODES = 6
# 13 rollout steps of 2 updates. The first job is stopped once the teacher is back (after 3 or 4 rollout steps);
# the resubmission's first run is signalled within about a minute of its first new checkpoint (Slurm's resolution):
# at 12 s a rollout step (an AMD EPYC core), up to 6 more steps, and it must still have work left when the signal lands
MAX_STEPS = 26
SAVE_STEPS = 2  # a checkpoint at every rollout step
# The resubmission asks for a limit it would not reach and USR1 that long before it; once its first run has written a
# checkpoint, the rehearsal brings the limit forward to the next whole minute past SIGNAL_LEAD_S from then
TIME_LIMIT_MIN, SIGNAL_LEAD_S = 30, 120
WEIGHT_ENDPOINTS = ("/collective_rpc", "/init_weight_transfer_engine", "/update_named_param", "/finish_weight_update")
PROBE_TEXT = "Question: Tom has 3 apples and buys 4 more. How many apples does he have? Answer: \\boxed{7}"


class RehearsalFailed(RuntimeError):
    """A check or phase failed; the message says which and why."""


def log(message: str) -> None:
    print(message, flush=True)


class Rehearsal:
    """The rehearsal's state: the cluster, the folder, what each phase found."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.cluster = Cluster(folder / "slurm", nodes=NODES)
        self.logs = folder / "logs"
        self.run_dir = folder / "run"
        self.found: dict = {}
        self.phases: list[tuple[str, float, str]] = []

    # ------------------------------------------------------------------ plumbing

    def phase(self, name: str, function) -> None:
        start = time.monotonic()
        detail = function()
        seconds = time.monotonic() - start
        self.phases.append((name, seconds, detail))
        log(f"phase {name}: {seconds:.0f} s ({detail})")

    def env(self, log_dir: Path, **extra: str) -> dict:
        venv = REPO / ".venv" / "bin"
        env = dict(
            self.cluster.env,
            PATH=f"{venv}:{os.environ['PATH']}",
            PYTHON=str(venv / "python"),
            VLLM_PYTHON=str(REPO / ".venv-vllm" / "bin" / "python"),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            CPU_THREADS="1",  # 2 ranks and 2 servers share this machine's cores
            LOG_DIR=str(log_dir),
            # the teacher's engine on core 0, the student's on the last core, as `make demo` does
            STUDENT_SERVER_OPTS=f"--kv-cache-gib 1 --cpu-cores {os.cpu_count() - 1} -- {self.server_args}",
            TEACHER_SERVER_OPTS=f"--kv-cache-gib 1 --cpu-cores 0 -- {self.server_args}",
            SERVER_WAIT="300",
            RENDEZVOUS_TIMEOUT="120",
        )
        env.update(extra)
        return env

    @property
    def server_args(self) -> str:
        return "--dtype float32 --enforce-eager --block-size 32"

    def recipe_args(self) -> list[str]:
        """The demo's recipe, smaller: one new question per rank and rollout step (2 rows x 2 micro-batches of a
        group of 4), a learning rate at which the weights visibly move, a checkpoint every rollout step, the ranks'
        digests."""
        return [
            "recipes/demo.yaml", "--output_dir", str(self.run_dir), "--max_steps", str(MAX_STEPS),
            "--save_steps", str(SAVE_STEPS), "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", "1", "--learning_rate", "1e-4", "--rank_digests", "true",
            "--report_to", "none", "--disable_tqdm", "true", "--teacher_wait_s", "120",
        ]  # fmt: skip

    def submit(self, label: str, sbatch_args: list[str], env: dict, recipe: list[str] | None = None) -> str:
        log_dir = Path(env["LOG_DIR"])
        log_dir.mkdir(parents=True, exist_ok=True)  # Slurm opens the job's output there before the script runs
        command = ["sbatch", "--parsable", "--gpus-per-node=0", "--job-name", f"zppo-{label}"]
        command += ["--output", str(log_dir / "job-%j.out"), *sbatch_args]
        command += ["recipes/launch/slurm_zppo.sbatch", *(recipe or self.recipe_args())]
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RehearsalFailed(f"sbatch for {label} failed: {done.stderr.strip()}")
        job = done.stdout.strip().split(";")[0]
        self.found.setdefault("jobs", {})[label] = job
        return job

    def output(self, job: str, log_dir: Path) -> str:
        path = log_dir / f"job-{job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def ends(self, job: str) -> list[dict]:
        return [record for record in self.cluster.completions() if record.get("JobId") == job]

    def wait_end(self, job: str, timeout: float, states: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED",
                 "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")) -> dict:  # fmt: skip
        """The job's final end record (not a requeue), within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            final = [r for r in self.ends(job) if r.get("JobState") in states]
            if final:
                return final[-1]
            time.sleep(1)
        raise RehearsalFailed(f"job {job} did not end within {timeout:.0f}s ({self.cluster.job(job).get('JobState')})")

    def wait_for(self, what: str, condition, timeout: float, job: str | None = None):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            # a requeued run's end is recorded with the state the job went back to: PENDING (see check_jobs)
            if job and any(r.get("JobState") not in ("REQUEUED", "PENDING") for r in self.ends(job)):
                raise RehearsalFailed(
                    f"job {job} ended while waiting for {what}: {self.ends(job)[-1].get('JobState')}"
                )
            time.sleep(1)
        raise RehearsalFailed(f"no {what} within {timeout:.0f}s")

    def left_nothing(self, job: str, nodes: list[str], timeout: float = 60) -> None:
        """Once ``job`` has ended, nothing of it may stay on its nodes (Slurm's KillWait, 10 s here, then its
        SIGKILL): a process that outlives its job keeps its port and its memory, and the next job on the node
        finds them."""
        deadline = time.monotonic() + timeout
        while left := {node: found for node in nodes if (found := self.cluster.job_processes(node))}:
            if time.monotonic() > deadline:
                raise RehearsalFailed(f"job {job} ended but its processes did not, {timeout:.0f} s later: {left}")
            time.sleep(1)

    def allocation(self, job: str) -> list[str]:
        nodelist = self.wait_for(f"job {job} to start", lambda: self._nodelist(job), 120)
        return self.cluster.slurm("scontrol", "show", "hostnames", nodelist).stdout.split()

    def _nodelist(self, job: str) -> str | None:
        info = self.cluster.job(job)
        return info.get("NodeList") if info.get("JobState") == "RUNNING" else None

    def metrics(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written
                continue
        return [row for row in rows if "zppo/rollout_steps" in row]

    def whole_checkpoint(self) -> str | None:
        from zppo_trl.checkpoint_state import last_complete_checkpoint

        return last_complete_checkpoint(str(self.run_dir)) if self.run_dir.exists() else None

    # ------------------------------------------------------------------ phases

    def prepare(self) -> str:
        installed = install_slurm()
        for path in (".venv/bin/python", ".venv-vllm/bin/python"):
            if not (REPO / path).exists():
                raise RehearsalFailed(f"no {path}: run `make envs` first")
        subprocess.run([str(REPO / ".venv/bin/python"), "recipes/demo/prepare_model.py", MODEL], cwd=REPO, check=True)
        return f"installed {', '.join(installed)}" if installed else "slurm-wlm and munge present, model ready"

    def cluster_up(self) -> str:
        self.cluster.up()
        addresses = ", ".join(f"{n} {self.cluster.address(n)}" for n in self.cluster.names)
        return f"{NODES} nodes idle: {addresses}; slurmctld on {self.cluster.controller}"

    def server_never_up(self) -> str:
        log_dir = self.logs / "server-never-up"
        env = self.env(log_dir, SERVER_WAIT="10", SERVER_RESTARTS="0")
        job = self.submit("server-never-up", ["--nodes=4"], env)
        start = time.monotonic()
        end = self.wait_end(job, 120)
        elapsed = time.monotonic() - start
        out = self.output(job, log_dir)
        nodes = self.cluster.slurm("scontrol", "show", "hostnames", end["NodeList"]).stdout.split()
        self.left_nothing(job, nodes)  # the servers it gave up on included
        expected = f"the student server on {nodes[0]} is not up"  # did not answer, or its step gave up waiting first
        if end["JobState"] != "FAILED" or expected not in out:
            raise RehearsalFailed(f"job {job} ({end['JobState']}) did not fail naming the server: see {log_dir}")
        return f"job {job} FAILED after {elapsed:.0f} s: the student server on {nodes[0]} did not answer within 10 s"

    def wrong_rendezvous(self) -> str:
        log_dir = self.logs / "wrong-rendezvous"
        nodes = self.cluster.names[:4]
        first, second = nodes[2], nodes[3]
        hosts = Path("/etc/netns") / second / "hosts"
        original = hosts.read_text()
        hosts.write_text(re.sub(rf"^\S+ {first}$", f"10.77.0.99 {first}", original, flags=re.M))
        try:
            env = self.env(log_dir, RENDEZVOUS_TIMEOUT="20")
            job = self.submit("wrong-rendezvous", ["--nodes=4", f"--nodelist={','.join(nodes)}"], env)
            self.wait_for("the training step", lambda: "training: 2 nodes" in self.output(job, log_dir), 300, job)
            start = time.monotonic()
            end = self.wait_end(job, 180)
            elapsed = time.monotonic() - start
            self.left_nothing(job, nodes)
        finally:
            hosts.write_text(original)
        out = self.output(job, log_dir)
        expected = f"could not reach the rendezvous at {first}:29500 (10.77.0.99) within 20s"
        if end["JobState"] != "FAILED" or expected not in out:
            raise RehearsalFailed(f"job {job} ({end['JobState']}) did not fail naming the rendezvous: see {log_dir}")
        return (
            f"job {job} FAILED {elapsed:.0f} s after its training step started: {second} could not reach "
            f"{first}:29500 (resolved to 10.77.0.99) within 20 s"
        )

    def job_a(self) -> str:
        log_dir = self.logs / "job-a"
        job = self.submit("a", ["--nodes=4"], self.env(log_dir))
        nodes = self.allocation(job)
        teacher, trainers = nodes[1], nodes[2:]
        self.found["a"] = dict(job=job, nodes=nodes, trainers=trainers, log_dir=log_dir)
        self.wait_for("first rollout step", lambda: len(self.metrics()) >= 1, 900, job)
        # The teacher's server dies: its processes on the teacher's node, not the node's Slurm daemons.
        restarted, up = f"the teacher server on {teacher} exited", "teacher vLLM server is up at"
        before = self.output(job, log_dir)
        if before.count(restarted) or before.count(up) != 1:
            raise RehearsalFailed(f"job {job}'s teacher server restarted before it was killed: see {log_dir}")
        killed = self.cluster.kill_node_processes(teacher)
        teacher_killed = time.monotonic()
        self.wait_for("the teacher's restart", lambda: restarted in self.output(job, log_dir), 60, job)
        back = self.wait_for("the teacher answering again", lambda: self.output(job, log_dir).count(up) == 2, 300, job)
        teacher_back = time.monotonic() - teacher_killed if back else None

        def recovered():
            rows = self.metrics()
            degraded = [r for r in rows if r.get("zppo/teacher/failures", 0) > 0]
            if not degraded:
                return None
            later = [
                r
                for r in rows
                if r["step"] > degraded[0]["step"]
                and r.get("zppo/teacher/failures", 1) == 0
                and r.get("zppo/teacher/requests", 0) > 0
            ]
            return (degraded[0], later[0]) if later else None

        degraded, recovery = self.wait_for("a step with the teacher back", recovered, 900, job)
        checkpoint = f"checkpoint-{recovery['step'] + 1}"  # the rollout step's second update
        self.wait_for(f"{checkpoint} whole", lambda: (self.whole_checkpoint() or "").endswith(checkpoint), 300, job)
        time.sleep(5)  # into the next rollout step
        victim = trainers[0]
        processes = self.cluster.kill_node_processes(victim)
        killed_at = time.monotonic()
        end = self.wait_end(job, 300)
        ended_after = time.monotonic() - killed_at
        self.left_nothing(job, nodes)
        out = self.output(job, log_dir)
        lost = f"error: training node {victim} (ranks 0-0) was lost"
        named = f"the last whole checkpoint is {self.run_dir / checkpoint}"
        if end["JobState"] != "FAILED" or lost not in out or named not in out:
            raise RehearsalFailed(f"job {job} ({end['JobState']}) did not end naming {victim} and {checkpoint}")
        if server_restarts(out) != [f"teacher server on {teacher}"]:
            raise RehearsalFailed(
                f"job {job}: server restarts {server_restarts(out)}, only the killed teacher's expected"
            )
        self.found["a"].update(
            victim=victim, checkpoint=checkpoint, ended_after=ended_after, teacher_back=teacher_back,
            degraded=degraded, recovery=recovery, teacher_killed=len(killed), trainer_killed=len(processes),
        )  # fmt: skip
        return (
            f"job {job} on {','.join(nodes)}; teacher on {teacher} killed after rollout step 1 ({len(killed)} "
            f"processes), serving again {teacher_back:.0f} s later; step {degraded['zppo/rollout_steps']:.0f}: "
            f"{degraded['zppo/teacher/failures']:.0f} teacher failures, BCQ trained "
            f"{degraded.get('zppo/bcq_trained', 0):.0f}; step {recovery['zppo/rollout_steps']:.0f}: 0 failures of "
            f"{recovery['zppo/teacher/requests']:.0f} requests; {victim} killed ({len(processes)} processes) after "
            f"{checkpoint}: job FAILED {ended_after:.0f} s later naming {victim} and {checkpoint}"
        )

    def job_b(self) -> str:
        a = self.found["a"]
        victim = a["victim"]
        self.cluster.slurm("scontrol", "update", f"NodeName={victim}", "State=DRAIN", "Reason=rehearsal_killed")
        others = [n for n in a["trainers"] if n != victim]
        log_dir = self.logs / "job-b"
        env = self.env(log_dir, PREEMPTION_GRACE=str(SIGNAL_LEAD_S))
        sbatch = ["--nodes=4", f"--exclude={','.join(others)}", f"--time={TIME_LIMIT_MIN}"]
        sbatch.append(f"--signal=B:USR1@{SIGNAL_LEAD_S}")
        job = self.submit("b", sbatch, env)
        nodes = self.allocation(job)
        if set(nodes[2:]) & set(a["trainers"]):
            raise RehearsalFailed(f"job {job} trains on {nodes[2:]}, not away from job a's {a['trainers']}")
        self.found["b"] = dict(job=job, nodes=nodes, trainers=nodes[2:], log_dir=log_dir, probes=[])
        prober = SyncProber(self, nodes[0], log_dir / "student_vllm.log", job)
        prober.start()
        try:
            limit = self.reach_time_limit(job, a["checkpoint"], log_dir)
            end = self.wait_end(job, 1500)
        finally:
            prober.stop()
        self.found["b"].update(probes=prober.probes, probe_errors=prober.errors, syncs=prober.syncs, limit=limit)
        self.found["b"]["restarts"] = self.cluster.job(job).get("Restarts")
        self.left_nothing(job, nodes)
        out = self.output(job, log_dir)
        requeues = out.count("requeueing job")
        if end["JobState"] != "COMPLETED":
            raise RehearsalFailed(f"job {job} ended {end['JobState']}: see {log_dir}")
        if not requeues:
            raise RehearsalFailed(f"job {job} was never stopped by its time limit's signal: see {log_dir}")
        if server_restarts(out):
            raise RehearsalFailed(f"job {job}: servers restarted though none was killed: {server_restarts(out)}")
        # each line comes from both ranks
        resumed = list(dict.fromkeys(re.findall(r"resuming from \S*/(checkpoint-\d+)", out)))
        stops = list(dict.fromkeys(re.findall(r"stopped by a signal after (\d+) optimizer updates", out)))
        self.found["b"].update(resumed=resumed, requeues=requeues, stops=stops, end=end)
        if not resumed or resumed[0] != a["checkpoint"]:
            raise RehearsalFailed(f"job {job} resumed from {resumed[:1]}, not job a's {a['checkpoint']}")
        return (
            f"job {job} on {','.join(nodes)} ({victim} drained); resumed from {', '.join(resumed)}; time limit "
            f"brought to {limit['minutes']} min at {limit['run_time']} s of its run: Slurm's USR1 "
            f"{limit['signalled_after']:.0f} s later, stopped {requeues} time(s) (after updates {', '.join(stops)}), "
            f"requeued and back {limit['back_after']:.0f} s later; COMPLETED"
        )

    def reach_time_limit(self, job: str, after: str, log_dir: Path) -> dict:
        """The job runs into its time limit: once its first run has written a checkpoint past ``after`` (so it has
        trained), its limit is brought forward to the first whole minute at least SIGNAL_LEAD_S from now, and Slurm
        sends the ``--signal`` the job asked for within about a minute (the resolution its man page states). Once
        the job is requeued the limit goes back to TIME_LIMIT_MIN, so that the rerun, whose clock starts again,
        finishes. A fixed short limit would not do: with Slurm's minute of slack it lands anywhere in a run that is
        itself a minute or two on one machine and three times that on another."""
        first = int(after.split("-")[1])

        def trained() -> bool:
            checkpoint = self.whole_checkpoint()
            return checkpoint is not None and int(checkpoint.rsplit("-", 1)[1]) > first

        self.wait_for(f"job {job}'s first checkpoint after {after}", trained, 900, job)
        run_time = run_seconds(self.cluster.job(job)["RunTime"])
        minutes = -(-(run_time + SIGNAL_LEAD_S) // 60)
        self.cluster.slurm("scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}")
        limited = time.monotonic()
        self.wait_for(
            f"Slurm's signal ahead of job {job}'s time limit",
            lambda: "stop signal:" in self.output(job, log_dir),
            SIGNAL_LEAD_S + 90,
            job,
        )
        signalled = time.monotonic()
        self.wait_for(f"job {job}'s requeue", lambda: self.cluster.job(job).get("JobState") == "PENDING", 300, job)
        self.cluster.slurm("scontrol", "update", f"JobId={job}", f"TimeLimit={TIME_LIMIT_MIN}")
        self.wait_for(f"job {job} running again", lambda: self.cluster.job(job).get("JobState") == "RUNNING", 300)
        return dict(
            minutes=minutes, run_time=run_time, signalled_after=signalled - limited,
            back_after=time.monotonic() - signalled,
        )  # fmt: skip

    def checks(self) -> str:
        results = [
            self.check_jobs(),
            self.check_digests(),
            self.check_weight_syncs(),
            self.check_requests(),
            self.check_checkpoints(),
            self.check_teacher(),
        ]
        return "; ".join(results)

    # ------------------------------------------------------------------ checks

    def check_jobs(self) -> str:
        a, b = self.found["a"]["job"], self.found["b"]["job"]
        # Slurm's job completion log records a requeued run's end with the state the job went back to (PENDING)
        states = {label: [r["JobState"] for r in self.ends(job)] for label, job in (("a", a), ("b", b))}
        requeues = self.found["b"]["requeues"]
        if states["a"] != ["FAILED"] or states["b"] != ["PENDING"] * requeues + ["COMPLETED"]:
            raise RehearsalFailed(f"job ends {states}, after {requeues} requeue(s)")
        return f"job {a} FAILED; job {b} requeued {requeues} time(s), then COMPLETED"

    def check_digests(self) -> str:
        from transformers import AutoModelForCausalLM

        from zppo_trl.rank_digest import params_digest, read_rank_digests

        ranks = read_rank_digests(self.run_dir)
        if sorted(ranks) != [0, 1]:
            raise RehearsalFailed(f"rank digests from ranks {sorted(ranks)}, not 0 and 1")
        steps = [[d["step"] for d in ranks[r]] for r in (0, 1)]
        if steps[0] != steps[1] or steps[0] != list(range(1, MAX_STEPS + 1)):
            raise RehearsalFailed(f"digest steps {steps}: one line per update and rank expected")
        for d0, d1 in zip(ranks[0], ranks[1]):
            if (d0["params"], d0["state"]) != (d1["params"], d1["state"]):
                raise RehearsalFailed(f"ranks disagree after update {d0['step']}: {d0} / {d1}")
        resumed = int(self.found["a"]["checkpoint"].split("-")[1])
        hosts = {(d["step"] <= resumed, d["host"]) for r in (0, 1) for d in ranks[r]}
        expected = {(True, n) for n in self.found["a"]["trainers"]} | {(False, n) for n in self.found["b"]["trainers"]}
        if hosts != expected:
            raise RehearsalFailed(f"digests written on {sorted(hosts)}, expected {sorted(expected)}")
        final = params_digest(AutoModelForCausalLM.from_pretrained(self.run_dir))
        if final != ranks[0][-1]["params"] or final == ranks[0][0]["params"]:
            raise RehearsalFailed("the saved model is not the weights both ranks ended with")
        self.found["digests"] = len(steps[0])
        return (
            f"both ranks' weights and ZPPO state identical at all {len(steps[0])} updates, the last = the saved model"
        )

    def check_weight_syncs(self) -> str:
        import torch
        from transformers import AutoModelForCausalLM

        syncs = {}
        for label in ("a", "b"):
            run = self.found[label]
            rank0 = self.cluster.address(run["trainers"][0])
            clients = {ip for ip, path in access_log(run["log_dir"] / "student_vllm.log") if path in WEIGHT_ENDPOINTS}
            if not clients <= {rank0}:
                raise RehearsalFailed(f"job {label}: weights sent to the student server from {clients}, not {rank0}")
            syncs[label] = sum(
                path == "/collective_rpc" for _, path in access_log(run["log_dir"] / "student_vllm.log")
            )
        if not syncs["a"]:
            raise RehearsalFailed("job a's student server logged no weight sync")
        probes = self.found["b"]["probes"]
        # The last sync of the run: by the last of job b's servers that logged syncs (a run resumed at the last
        # checkpoint trains, and syncs, nothing); the probe after it, before the server was stopped.
        synced_runs = self.found["b"]["syncs"]  # server PID -> its syncs, in the order the servers ran
        last_server = list(synced_runs)[-1] if synced_runs else None
        after = [p for p in probes if p["server"] == last_server and p["syncs"] == synced_runs.get(last_server)]
        last = max(after, key=lambda p: p["time"], default=None)
        if last is None:
            seen = [(p["server"], p["syncs"]) for p in probes]
            raise RehearsalFailed(
                f"no probe of the student server after its last weight sync (syncs per server {synced_runs}; "
                f"probed {seen}; errors {self.found['b']['probe_errors'][-3:]})"
            )
        synced = self.run_dir / f"checkpoint-{MAX_STEPS - SAVE_STEPS}"  # the weights of the last rollout step
        ids, served = last["ids"], torch.tensor(last["logprobs"])

        def scored(path) -> torch.Tensor:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, :-1].float()
            return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]

        to_synced = (served - scored(synced)).abs().max().item()
        to_initial = (served - scored(REPO / MODEL)).abs().max().item()
        if not (to_synced < 1e-3 and to_initial > 20 * to_synced):
            raise RehearsalFailed(
                f"the student server's log-probs after its last sync differ from {synced.name}'s by {to_synced:.2e} "
                f"and from the initial weights' by {to_initial:.2e}"
            )
        self.found["sync"] = dict(to_synced=to_synced, to_initial=to_initial, syncs=syncs)
        return (
            f"weights sent by rank 0's node only ({syncs['a']} syncs in job a; in job b's runs "
            f"{list(synced_runs.values())}); "
            f"after the last, the server's log-probs are {synced.name}'s within {to_synced:.1e} "
            f"(the initial weights': {to_initial:.1e} away)"
        )

    def check_requests(self) -> str:
        counted = 0
        for label in ("a", "b"):
            run = self.found[label]
            trainers = {self.cluster.address(n) for n in run["trainers"]}
            for server in ("student_vllm.log", "teacher_vllm.log"):
                for ip, path in access_log(run["log_dir"] / server):
                    if path == "/health" or ip == "10.77.0.1":  # health checks; the rehearsal's own probes
                        continue
                    if ip not in trainers:
                        raise RehearsalFailed(f"job {label}: {server} got {path} from {ip}, not a training node")
                    counted += 1
        if not counted:
            raise RehearsalFailed("no request reached the servers")
        return f"all {counted} server requests from the training nodes' addresses (none from 127.0.0.1)"

    def check_checkpoints(self) -> str:
        from zppo_trl.checkpoint_state import ZPPO_STATE_NAME, checkpoint_gaps

        checkpoints = sorted(self.run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        for checkpoint in checkpoints:
            gaps = checkpoint_gaps(str(checkpoint))
            state = json.loads((checkpoint / ZPPO_STATE_NAME).read_text())
            if gaps or not state["buffer"]["residents"]:
                raise RehearsalFailed(f"{checkpoint.name} is not whole ({gaps}) or has an empty buffer")
        if not checkpoints or checkpoints[-1].name != f"checkpoint-{MAX_STEPS}":
            raise RehearsalFailed(f"checkpoints {[c.name for c in checkpoints]}: the last should be {MAX_STEPS}")
        return f"{len(checkpoints)} checkpoints whole, each with its replay buffer"

    def check_teacher(self) -> str:
        a = self.found["a"]
        degraded, recovery = a["degraded"], a["recovery"]
        if degraded.get("zppo/bcq_trained", 0) != 0:
            raise RehearsalFailed(f"a step without its teacher trained BCQ: {degraded}")
        return (
            f"teacher outage in rollout step {degraded['zppo/rollout_steps']:.0f} "
            f"({degraded['zppo/teacher/failures']:.0f} failed requests, no BCQ), back in step "
            f"{recovery['zppo/rollout_steps']:.0f}"
        )


def server_restarts(out: str) -> list[str]:
    """The servers a job's supervisor started again (``the teacher server on zr2 exited (status 137): ...``)."""
    return re.findall(r"the (\w+ server on \S+) exited \(status \d+\)", out)


def run_seconds(value: str) -> int:
    """Slurm's ``RunTime`` (``[D-]HH:MM:SS``) in seconds."""
    days, _, clock = value.rpartition("-")
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def access_log(path: Path) -> list[tuple[str, str]]:
    """``(client address, path)`` of every request in a vLLM server's log (uvicorn's access lines)."""
    if not path.exists():
        return []
    pattern = re.compile(r'INFO:\s+(\d+\.\d+\.\d+\.\d+):\d+ - "(?:GET|POST) (/[^ ?]*)')
    return [m.groups() for m in map(pattern.search, path.read_text(errors="replace").splitlines()) if m]


class SyncProber(threading.Thread):
    """While a job runs: after each weight sync the student's server logs, ask it for the log-probs of a fixed text
    (from the controller's address), and keep them with the server (its PID: each of the job's runs starts its own,
    which writes a new log) and the number of syncs it had logged then."""

    def __init__(self, rehearsal: Rehearsal, node: str, server_log: Path, job: str):
        super().__init__(daemon=True)
        self.rehearsal, self.server_log, self.job = rehearsal, server_log, job
        self.url = f"http://{rehearsal.cluster.address(node)}:8001"
        self.probes: list[dict] = []
        self.errors: list[str] = []
        self.syncs: dict[str, int] = {}  # the server's PID -> the weight syncs it logged, in the order they ran
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)

    def server(self) -> str | None:
        """The PID of the server now writing the log (start_server truncates the log, then writes its PID file)."""
        path = Path(f"{self.server_log}.pid")
        return path.read_text().strip() or None if path.exists() else None

    def run(self) -> None:
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(REPO / MODEL)(PROBE_TEXT)["input_ids"]
        seen = (None, 0)
        while not self._halt.wait(1):
            server = self.server()  # before the log: a log read after a newer server truncated it counts fewer
            syncs = sum(path == "/collective_rpc" for _, path in access_log(self.server_log))
            if server is None or syncs == 0:
                continue
            self.syncs[server] = max(self.syncs.get(server, 0), syncs)
            if (server, syncs) == seen:
                continue
            try:
                logprobs = self._score(ids)
            except Exception as err:  # the server between runs, or a reply not as expected: kept for the report
                self.errors.append(f"{type(err).__name__}: {err}")
                continue
            if self.server() != server:  # another server answered
                continue
            self.probes.append(dict(time=time.time(), server=server, syncs=syncs, ids=ids, logprobs=logprobs))
            seen = (server, syncs)

    def _score(self, ids: list[int]) -> list[float]:
        with urllib.request.urlopen(f"{self.url}/v1/models", timeout=10) as reply:
            model = json.load(reply)["data"][0]["id"]
        body = dict(model=model, prompt=ids, max_tokens=1, temperature=1.0, prompt_logprobs=1)
        request = urllib.request.Request(
            f"{self.url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            positions = json.load(reply)["choices"][0]["prompt_logprobs"][1:]
        return [position[str(token)]["logprob"] for position, token in zip(positions, ids[1:])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = REPO / "outputs" / "cluster-rehearsal" / datetime.now().strftime("%Y%m%d-%H%M%S")
    parser.add_argument("--folder", type=Path, default=default, help="where every log goes (default: %(default)s)")
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        print(
            "error: the cluster rehearsal needs root (network namespaces, a bridge, Slurm's daemons)", file=sys.stderr
        )
        return 2
    folder = options.folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    # polling for a whole checkpoint meets checkpoints being written: the package warns of each, which is noise here
    logging.getLogger("zppo_trl").setLevel(logging.ERROR)
    log(f"rehearsal folder: {folder}")
    rehearsal = Rehearsal(folder)

    def interrupted(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupted)
    start = time.monotonic()
    status = 1
    try:
        rehearsal.phase("prepare", rehearsal.prepare)
        rehearsal.phase("cluster-up", rehearsal.cluster_up)
        rehearsal.phase("server-never-up", rehearsal.server_never_up)
        rehearsal.phase("wrong-rendezvous", rehearsal.wrong_rendezvous)
        rehearsal.phase("job-a", rehearsal.job_a)
        rehearsal.phase("job-b", rehearsal.job_b)
        rehearsal.phase("checks", rehearsal.checks)
        status = 0
    except (RehearsalFailed, ClusterError, subprocess.CalledProcessError) as err:
        log(f"error: {err}")
    except KeyboardInterrupt as err:
        log(f"interrupted ({str(err) or 'SIGINT'}): tearing down")
        status = 130
    except Exception:  # a bug of the rehearsal's own: still torn down, still a failure
        traceback.print_exc()
    finally:
        teardown = time.monotonic()
        rehearsal.cluster.down()
        left = rehearsal.cluster.leftovers()
        log(f"phase teardown: {time.monotonic() - teardown:.0f} s ({'nothing left' if not left else left})")
        if left:
            status = status or 1
    total = time.monotonic() - start
    record = dict(status=status, minutes=total / 60, phases=rehearsal.phases, found=rehearsal.found)
    (folder / "rehearsal.json").write_text(json.dumps(record, indent=1, default=str))  # the probes included
    if status == 0:
        a, b = rehearsal.found["a"], rehearsal.found["b"]
        addresses = "/".join(rehearsal.cluster.address(n) for n in b["trainers"])
        log(
            f"rehearsal: {NODES} nodes, job {b['job']} COMPLETED, 2 trainer ranks on {addresses}, resumed from "
            f"{a['checkpoint']} after {a['victim']} was killed, weights identical across ranks "
            f"({total / 60:.1f} min; logs in {folder})"
        )
    else:
        log(f"rehearsal FAILED after {total / 60:.1f} min; logs in {folder}")
    return status


if __name__ == "__main__":
    sys.exit(main())
