"""The real trainer on a real two-node Slurm (network namespaces), through the code path of
`papermill nbs/04_train.ipynb -p model gpt3_tiny -p cluster ci@2`: both nodes' ranks train, the loss falls, a checkpoint
lands; USR1 → checkpoint → requeue → resume with SLURM_RESTART_COUNT=1; cancel; the compile stage's dry run.
Skipped, with the reason, where Slurm cannot run here or the trainer is missing."""
import importlib.util, json, os, subprocess, sys, time
from pathlib import Path
import pytest
import nxpretrain
from nxpretrain.testing.local_slurm import LocalSlurm, why_no_slurm
from nxpretrain.launch.job import make_job, data_prep_jobs
from nxpretrain.launch.launcher import submit, status, cancel, tail, wait, log_path, submit_chain
from nxpretrain.launch.slurm import SlurmLauncher

release = SlurmLauncher().release   # Slurm's own: start a requeued job now

REASON = why_no_slurm() or (
    ''
    if (Path(nxpretrain.__file__).parent / 'train' / 'entry.py').exists()
    else 'the trainer (nxpretrain.train.entry) is not in this checkout'
)
pytestmark = [pytest.mark.skipif(bool(REASON), reason=f"cannot run: {REASON}"), pytest.mark.timeout(600)]
REPO = Path(nxpretrain.__file__).resolve().parents[1]
# gpt3_tiny made smaller still: two ranks share this machine's two (busy) cores
SMALL = ['model.n_layers=2', 'model.hidden=64', 'model.seq_len=64', 'data.micro_batch=2', 'data.global_batch=4',
         'trainer.threads=1', 'trainer.log_every=1', 'trainer.eval_every=0', 'optim.lr=3e-3']   # the loss falls in 20


@pytest.fixture(scope='module')
def two_nodes():
    old = os.environ.get('PYTHONPATH')
    os.environ['PYTHONPATH'] = str(REPO) + (os.pathsep + old if old else '')
    with LocalSlurm('ci2', nodes=2, netns=True, port=6817) as c: yield c
    if old is None: os.environ.pop('PYTHONPATH')
    else: os.environ['PYTHONPATH'] = old


@pytest.fixture(scope='module')
def corpus(two_nodes, tmp_path_factory):
    "The demo corpus, prepared by the data stage's worker in a Slurm array job (what the training jobs then read)."
    out = tmp_path_factory.mktemp('data')
    ids = submit_chain(data_prep_jobs('demo', out, 'ci'))
    s = wait(ids[-1], timeout=300)
    assert s.state == 'COMPLETED', (s, tail(ids[-1], 30))
    prefix = tail(ids[-1], 1).strip()
    assert Path(prefix + '.idx').exists() and Path(prefix + '.bin').stat().st_size > 0, prefix
    return prefix


def _small(corpus, *more): return SMALL + [f"data.corpus={corpus}", *more]


def _steps(run_dir) -> list[dict]:
    return [
        json.loads(l) for l in (Path(run_dir) / 'steps.jsonl').read_text(errors='replace').splitlines() if l.strip()
    ]


def _wait_step(run_dir, n, job_id, timeout=240):
    t0 = time.time()
    while time.time() - t0 < timeout:
        f = Path(run_dir) / 'steps.jsonl'
        if f.exists() and len(_steps(run_dir)) >= n: return
        time.sleep(0.5)
    raise AssertionError(f"step {n} not reached: {status(job_id)}\n{tail(job_id, 40)}")


def test_two_node_training_through_04_train(corpus, tmp_path):
    out = tmp_path / 'runs'
    overrides = ' '.join(_small(corpus, 'trainer.save_every=10'))
    p = subprocess.run(
        [sys.executable, '-m', 'papermill', str(REPO / 'nbs/04_train.ipynb'), str(tmp_path / 'train.ipynb'), '-k',
         'python3', '-p', 'model', 'gpt3_tiny', '-p', 'cluster', 'ci@2', '-p', 'overrides', overrides, '-p',
         'max_steps', '20', '-p', 'out_dir', str(out), '--no-progress-bar'],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rec = json.loads(next(out.rglob('jobs.jsonl')).read_text().splitlines()[-1])
    s = wait(rec['id'], timeout=480)
    log = Path(s.log or log_path(rec['id'])).read_text(errors='replace')
    assert s.state == 'COMPLETED', (s, log[-3000:])
    assert '0: nxpretrain: node node1 task 0' in log and '1: nxpretrain: node node2 task 1' in log
    run_dir = next(out.rglob('steps.jsonl')).parent
    losses = [r['loss'] for r in _steps(run_dir)]
    assert len(losses) == 20 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses
    from nxpretrain.train.checkpoint import latest_checkpoint
    assert latest_checkpoint(run_dir / 'checkpoints', log=lambda *_: None).name.endswith('20')


def test_preempt_requeue_resume(corpus, tmp_path):
    job = make_job('gpt3_tiny', 'ci@2', tmp_path / 'job',
                   overrides=_small(corpus, 'trainer.max_steps=30', 'trainer.save_every=1000'))
    jid = submit(job)
    _wait_step(job.run_dir, 6, jid)
    cancel(jid, signal='USR1')                   # what --signal=B:USR1@grace does before a preemption or the time limit
    wait(jid, until={'PENDING'}, timeout=240)       # checkpointed, stopped with the requeue status, requeued
    stopped = json.loads((job.run_dir / 'exit_status.json').read_text(errors='replace'))
    assert stopped['code'] == 75 and stopped['step'] >= 6, stopped
    release(jid)
    s = wait(jid, timeout=480)
    log = Path(s.log).read_text(errors='replace')
    assert s.state == 'COMPLETED' and s.restarts == 1, (s, log[-3000:])
    assert f"nxpretrain: job {jid} restart 1" in log and 'requeueing job' in log
    # the second run went on from the signal's checkpoint: every step once, none repeated, none missing
    steps = [r['step'] for r in _steps(job.run_dir)]
    assert steps == list(range(1, 31)), steps
    assert json.loads((job.run_dir / 'exit_status.json').read_text(errors='replace'))['code'] == 0


def test_cancel_does_not_requeue(corpus, tmp_path):
    job = make_job('gpt3_tiny', 'ci@2', tmp_path / 'job', overrides=_small(corpus, 'trainer.max_steps=300'))
    jid = submit(job)
    _wait_step(job.run_dir, 2, jid)
    cancel(jid)
    s = wait(jid, timeout=120)
    assert s.state == 'CANCELLED' and s.restarts == 0
    assert 'requeueing' not in Path(log_path(jid)).read_text(errors='replace')


def test_compile_stage_dry_run_on_slurm(corpus, tmp_path):
    from nxpretrain.launch.compile_job import compile_stage
    rep = compile_stage('gpt3_tiny', 'ci@2', tmp_path / 'compile', overrides=_small(corpus), steps=2, wait_s=300)
    assert rep.ok and rep.action == 'submitted' and rep.steps_reached == 2, str(rep)
    assert Path(rep.cache_env['TORCHINDUCTOR_CACHE_DIR']).parent.exists()
