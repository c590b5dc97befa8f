"""The launcher interface: the local launcher runs a real two-process torchrun job through to COMPLETED, and a scheduler
defined in this file alone registers itself and is used by the stages and the command line."""
import contextlib, io, json, os
from pathlib import Path
import pytest
from nxpretrain.clusters import PROFILES, ClusterProfile
from nxpretrain.jobs.description import quote_argv
from nxpretrain.launch.job import make_job, write_job
from nxpretrain.launch.launcher import (JobState, JobStatus, Launcher, LAUNCHERS, find_records, record_job, register,
                                        status, tail, get_launcher)
from nxpretrain.launch.local import LocalLauncher

TINY = ['data.corpus=synthetic', 'model.n_layers=1', 'model.hidden=32', 'model.n_heads=2', 'model.seq_len=16',
        'data.micro_batch=2', 'data.global_batch=4', 'trainer.max_steps=3', 'optim.warmup_steps=1',
        'trainer.log_every=1', 'trainer.eval_every=0', 'trainer.save_every=0', 'trainer.save_every_minutes=0']


@pytest.fixture
def home(tmp_path, monkeypatch):
    "A job index of the test's own."
    monkeypatch.setenv('NXPRETRAIN_HOME', str(tmp_path / 'home'))
    monkeypatch.setenv('PYTHONPATH',
                       str(Path(__file__).resolve().parents[1]) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return tmp_path / 'home'


@pytest.mark.timeout(300)
def test_local_launcher_runs_two_process_torchrun(home, tmp_path):
    job = make_job('gpt3_tiny', 'cpu', tmp_path / 'job', overrides=TINY, scheduler='local')   # cpu: 2 devices → 2 ranks
    assert '--nproc-per-node 2' in job.script and job.script_path.read_text() == job.script
    ln = LocalLauncher()
    jid = ln.submit(job)
    seen = {ln.status(jid).state}
    while not (s := ln.status(jid)).done: seen.add(s.state)
    assert s.state == JobState.COMPLETED and s.exit_code == 0, (s, ln.log(jid, 40))
    assert seen <= {JobState.PENDING, JobState.RUNNING, JobState.COMPLETED}, seen
    assert (s.job_id, s.scheduler, s.cluster) == (jid, 'local', ln.cluster) and s.elapsed_s > 0
    # the run reached its last step with two ranks
    steps = [json.loads(l) for l in (job.run_dir / 'steps.jsonl').read_text().splitlines()]
    assert [r['step'] for r in steps][-1] == 3, steps
    log = ln.log(jid, 400)
    assert '2 process(es) on cpu' in log and 'step 3/3 | loss' in log and log in Path(s.log).read_text(), log[-2000:]
    # the id alone finds this job (the index names its scheduler and cluster), and only this one
    assert status(jid).state == JobState.COMPLETED and tail(jid, 5) == ln.log(jid, 5)
    assert [r['id'] for r in find_records(jid)] == [jid]
    from nxpretrain.launch.watch import watch
    reader = watch(jid, timeout=60, poll=0.2, widgets=False)   # the monitor's live view, by id
    assert reader.last['step'] == 3 and reader.last['total'] == 3, reader.rows


class RecordingLauncher(Launcher):
    "A scheduler that queues nothing: it remembers what it was given (what a Kubernetes launcher would send)."
    scheduler, script_suffix = 'dummy', 'yaml'
    submitted, cancelled = {}, []

    @property
    def cluster(self) -> str: return 'dummy-cluster'

    def render(self, job) -> str:
        return f"# dummy job {job.name}\nargs: {quote_argv(job.argv)}\nreplicas: {job.nodes}\n"

    def submit(self, job, after=()) -> str:
        job_id = f"d{len(self.submitted) + 1}"
        write_job(job)
        record_job(job, job_id, self.scheduler, self.cluster)
        self.submitted[job_id] = job
        return job_id

    def status(self, job_id) -> JobStatus:
        state = JobState.RUNNING if job_id in self.submitted else JobState.UNKNOWN
        return JobStatus(job_id, state, self.scheduler, self.cluster,
                         name=self.submitted[job_id].name if job_id in self.submitted else '')

    def cancel(self, job_id, signal=None): self.cancelled.append((job_id, signal))

    def log(self, job_id, tail=20) -> str: return f"log of {job_id}"

    def jobs(self): return [self.status(j) for j in self.submitted]


@pytest.fixture
def dummy(home, monkeypatch):
    "The dummy scheduler registered, and a profile whose jobs it queues; both gone after the test."
    monkeypatch.setitem(LAUNCHERS, 'dummy', LAUNCHERS.get('dummy'))
    register(RecordingLauncher)
    monkeypatch.setitem(PROFILES, 'dummy-cpu', ClusterProfile('dummy-cpu', 'gloo', 1, 8, 0.4, 2, 24, scheduler='dummy'))
    RecordingLauncher.submitted.clear()
    RecordingLauncher.cancelled.clear()
    yield RecordingLauncher
    LAUNCHERS.pop('dummy', None)


def test_a_scheduler_defined_here_is_used_by_stages_and_cli(dummy, tmp_path):
    from nxpretrain.stages import train_stage
    from nxpretrain.cli import main
    assert isinstance(get_launcher('dummy'), RecordingLauncher)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        jid = train_stage('gpt3_tiny', 'dummy-cpu', TINY, out_dir=str(tmp_path / 'runs'))
    assert jid == 'd1' and 'submitted as dummy job d1' in out.getvalue(), out.getvalue()[-1500:]
    job = dummy.submitted['d1']
    said = out.getvalue()   # the summary first (id, log, the exact 05_monitor call with out_dir), the script after it
    assert f"-p out_dir {job.out_dir} -p job d1" in said and said.index('submitted as dummy job d1') < said.index(
        '# dummy job nxp-train'
    )
    assert (
        job.scheduler == 'dummy'
        and job.script_path.suffix == '.yaml'
        and job.script_path.read_text().startswith('# dummy job nxp-train-gpt3_tiny')
    )
    assert '#SBATCH' not in job.script and 'corpus: synthetic' in job.recipe_path.read_text()
    # the command line: submit, list, status by id, log, cancel – all through the dummy launcher
    with contextlib.redirect_stdout(io.StringIO()) as out:
        main(['train', 'gpt3_tiny', *TINY, '--cluster', 'dummy-cpu', '--out', str(tmp_path / 'cli')])
    assert 'submitted as dummy job d2' in out.getvalue()
    with contextlib.redirect_stdout(io.StringIO()) as out: main(['jobs', '--json'])
    rows = [r for r in json.loads(out.getvalue()) if r['scheduler'] == 'dummy']
    assert [(r['job_id'], r['cluster'], r['state']) for r in rows] == [
        ('d1', 'dummy-cluster', 'RUNNING'),
        ('d2', 'dummy-cluster', 'RUNNING'),
    ]
    with contextlib.redirect_stdout(io.StringIO()) as out: main(['tail', 'd2'])
    assert out.getvalue() == 'log of d2\n'
    with contextlib.redirect_stdout(io.StringIO()): main(['cancel', 'd1', '--signal', 'USR1'])
    assert dummy.cancelled == [('d1', 'USR1')]
    assert status('d2').scheduler == 'dummy' and status('dummy:d1').name == 'nxp-train-gpt3_tiny'


def test_an_unknown_scheduler_is_one_line(home, monkeypatch, tmp_path):
    from nxpretrain.cli import main
    monkeypatch.setitem(PROFILES, 'k8s-cpu', ClusterProfile('k8s-cpu', 'gloo', 1, 8, 0.4, 2, 24, scheduler='k8s'))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        main(['train', 'gpt3_tiny', *TINY, '--cluster', 'k8s-cpu', '--out', str(tmp_path)])
    assert e.value.code == 2 and err.getvalue().count('\n') == 1 and "scheduler 'k8s'" in err.getvalue(), err.getvalue()


@pytest.mark.timeout(400)
def test_local_usr1_checkpoints_and_the_job_resumes(home, tmp_path):
    """USR1 through the local launcher: the ranks save and stop (requeue status), and the same job submitted again
    resumes."""
    long = [o for o in TINY if not o.startswith(('trainer.max_steps', 'trainer.save_every='))] + [
        'trainer.max_steps=400',
        'trainer.save_every=1000',
    ]
    job = make_job('gpt3_tiny', 'cpu', tmp_path / 'job', overrides=long, scheduler='local')
    ln = LocalLauncher()
    jid = ln.submit(job)
    steps = job.run_dir / 'steps.jsonl'
    while not (steps.exists() and len(steps.read_text().splitlines()) >= 2):
        assert not ln.status(jid).done, ln.log(jid, 40)
    ln.cancel(jid, 'USR1')
    s = ln.wait(jid, timeout=120, poll=0.5)
    assert s.state == JobState.FAILED and s.exit_code == 75 and 'stopped after a checkpoint' in s.reason, (
        s,
        ln.log(jid, 40),
    )
    saved = json.loads((job.run_dir / 'exit_status.json').read_text())
    assert saved['stopped'] == 'signal' and saved['checkpoint'], saved
    # again, to a short end: it starts from the checkpoint
    again = make_job('gpt3_tiny', 'cpu', tmp_path / 'job',
                     overrides=long[:-2] + [f"trainer.max_steps={saved['step'] + 2}", 'trainer.save_every=1000'],
                     scheduler='local')
    s2 = ln.wait(ln.submit(again), timeout=180, poll=0.5)
    assert s2.state == JobState.COMPLETED, ln.log(s2.job_id, 40)
    assert f"step {saved['step'] + 1}/" in ln.log(s2.job_id, 400) and f"step 1/" not in ln.log(s2.job_id, 400)
