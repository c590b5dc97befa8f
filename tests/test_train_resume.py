"""Reliability of training on real processes: kill -9 at random steps, kill -9 during a save, a corrupted checkpoint,
and SIGTERM under torchrun – each resumed run must reproduce the uninterrupted loss curve bit for bit (eager, pinned
threads)."""
import json, os, random, signal, subprocess, sys, time
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = 12
RECIPE = ['--recipe', 'gpt3_tiny', 'data.corpus=synthetic', 'model.n_layers=2', 'model.hidden=64', 'model.seq_len=32',
          'data.micro_batch=2', 'data.global_batch=4', 'trainer.log_every=4', 'trainer.eval_every=0',
          'trainer.save_every=2', 'trainer.keep_last=2', 'trainer.threads=1', 'optim.warmup_steps=2', '--no-progress',
          '--max-steps', str(STEPS)]
RUN = 'gpt3_tiny'


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''), OMP_NUM_THREADS='1')
    env.update({k: str(v) for k, v in extra.items()})
    return env


def launch(out: Path, *extra, env=None, torchrun: int = 0, script: Path | None = None) -> subprocess.Popen:
    """Start a training process (or a torchrun job of `torchrun` workers) writing to `out`; its output goes to
    `out/console.txt`. `script`: a Python file to run instead of `-m nxpretrain.train.entry` (it must run the entry
    itself)."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = (
        [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={torchrun}']
        if torchrun
        else [sys.executable]
    )
    cmd += [*([str(script)] if script else ['-m', 'nxpretrain.train.entry']), *RECIPE, '--out-dir', str(out), *extra]
    log = open(out / 'console.txt', 'a')
    return subprocess.Popen(cmd, cwd=ROOT, env=env or _env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def steps(out: Path) -> list[dict]:
    f = out / RUN / 'steps.jsonl'
    return [json.loads(l) for l in f.read_text().splitlines() if l.strip()] if f.exists() else []


def wait_for(cond, proc, timeout=180, what=''):
    t0 = time.time()
    while not cond():
        if proc.poll() is not None: raise AssertionError(f"process ended (rc {proc.returncode}) before {what}")
        if time.time() - t0 > timeout: raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def finish(proc, timeout=300) -> int:
    try: return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def console(out: Path) -> str: return (out / 'console.txt').read_text()


def assert_same_curve(out: Path, ref: dict, last: int = STEPS):
    """Every logged loss of `out` (re-run steps included) equals the reference bit for bit, and steps 1..last are all
    there."""
    got = steps(out)
    assert {s['step'] for s in got} >= set(range(1, last + 1)), sorted({s['step'] for s in got})
    bad = [(s['step'], s['loss'], ref[s['step']]) for s in got if s['loss'] != ref[s['step']]]
    assert not bad, f"losses differ from the uninterrupted run (step, got, want): {bad[:5]}"


@pytest.fixture(scope='module')
def reference(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp('ref')
    assert finish(launch(out)) == 0, console(out)
    ref = {s['step']: s['loss'] for s in steps(out)}
    assert sorted(ref) == list(range(1, STEPS + 1)), ref
    # it learns: 48 samples over a vocabulary of 8192 move the loss little, so compare the ends' means, not two steps
    assert sum(ref[s] for s in (10, 11, 12)) < sum(ref[s] for s in (1, 2, 3)), ref
    return ref


@pytest.mark.parametrize('seed,extra', [(0, ()), (1, ()), (2, ()), (3, ('--async-save',))],
                         ids=['sync-a', 'sync-b', 'sync-c', 'async'])
def test_kill9_at_random_steps_resumes_identically(tmp_path, reference, seed, extra):
    kills = sorted(random.Random(seed).sample(range(2, STEPS), 2))
    for k in kills:
        p = launch(tmp_path, *extra)
        wait_for(lambda: any(s['step'] >= k for s in steps(tmp_path)), p, what=f'step {k}')
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert finish(launch(tmp_path, *extra)) == 0, console(tmp_path)
    assert console(tmp_path).count('resumed from') >= 1, console(tmp_path)
    assert_same_curve(tmp_path, reference)


PAUSED_SAVE = """
import runpy, sys, time
import nxpretrain.train.checkpoint as ck
finish = ck._finish
def paused(d, *args, **kwargs):
    # step 6: every shard is on disk, the marker is not; the test kills us here
    if ck.checkpoint_step(d) == 6: time.sleep(60)
    return finish(d, *args, **kwargs)
ck._finish = paused
runpy.run_module('nxpretrain.train.entry', run_name='__main__', alter_sys=True)
"""


def test_kill9_during_save_keeps_previous_checkpoint(tmp_path, reference):
    from nxpretrain.train.checkpoint import MARKER, latest_checkpoint
    script, tmp_path = tmp_path / 'paused_save.py', tmp_path / 'run'
    script.write_text(PAUSED_SAVE)
    ck = tmp_path / RUN / 'checkpoints'
    p = launch(tmp_path, script=script)
    wait_for(lambda: (ck / 'step_6' / '.done_rank0.json').exists(), p, what='the shards of step 6')
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert not (ck / 'step_6' / MARKER).exists()
    assert latest_checkpoint(ck, log=lambda m: None).name == 'step_4'
    assert finish(launch(tmp_path)) == 0, console(tmp_path)
    c = console(tmp_path)
    assert 'step_6: partial checkpoint' in c and 'resumed from ' + str(ck / 'step_4') in c, c
    assert_same_curve(tmp_path, reference)


def test_corrupted_checkpoint_is_named_and_skipped(tmp_path, reference):
    assert finish(launch(tmp_path)) == 0, console(tmp_path)
    ck = tmp_path / RUN / 'checkpoints'
    shard = next((ck / f'step_{STEPS}').glob('__0_*.distcp'))
    b = bytearray(shard.read_bytes())
    b[len(b) // 2] ^= 0x01
    shard.write_bytes(bytes(b))
    assert finish(launch(tmp_path)) == 0, console(tmp_path)  # the newest checkpoint is bad: redo the last two steps
    c = console(tmp_path)
    assert f'{shard}: CRC-32C mismatch' in c and 'resumed from ' + str(ck / f'step_{STEPS - 2}') in c, c
    assert_same_curve(tmp_path, reference)


def test_explicit_bad_checkpoint_is_an_error(tmp_path):
    bad = tmp_path / 'nope' / 'step_3'
    p = launch(tmp_path, '--resume-from', str(bad))
    assert finish(p) == 2
    assert f'{bad}: no such checkpoint folder' in console(tmp_path)


def test_old_xla_checkpoint_is_one_line_naming_the_fix(tmp_path):
    """A run folder of the XLA loop's first format (`step_N/state.pt` and `done`, before nxpretrain.train.xla saved
    through Checkpointer): the auto-resume stops with one line that says what to do, and removes nothing."""
    old = tmp_path / RUN / 'checkpoints' / 'step_4'
    old.mkdir(parents=True)
    for f in ('state.pt', 'done'): (old / f).write_bytes(b'')
    assert finish(launch(tmp_path)) == 2
    said = [l for l in console(tmp_path).splitlines() if l.startswith('error:')]
    assert len(said) == 1 and "XLA loop's old format" in said[0] and 'aside' in said[0], console(tmp_path)
    assert sorted(f.name for f in old.iterdir()) == ['done', 'state.pt']


def test_sigterm_under_torchrun_saves_and_resumes(tmp_path):
    """DP 2 under torchrun: SIGTERM → every rank finishes the step, one checkpoint, exit status 75; the requeued run
    continues identically."""
    from nxpretrain.train.entry import exit_status, EXIT_REQUEUE
    ref_dir, out = tmp_path / 'ref', tmp_path / 'run'
    assert finish(launch(ref_dir, torchrun=2)) == 0, console(ref_dir)
    ref = {s['step']: s['loss'] for s in steps(ref_dir)}
    p = launch(out, 'trainer.save_every=0', torchrun=2)
    wait_for(lambda: any(s['step'] >= 5 for s in steps(out)), p, what='step 5')
    os.killpg(p.pid, signal.SIGTERM)
    finish(p)
    st = exit_status(out / RUN)
    assert st['code'] == EXIT_REQUEUE and st['stopped'] == 'signal', (st, console(out))
    assert Path(st['checkpoint']).name == f"step_{st['step']}"
    assert finish(launch(out, 'trainer.save_every=0', torchrun=2)) == 0, console(out)
    assert exit_status(out / RUN)['code'] == 0
    assert_same_curve(out, ref)
