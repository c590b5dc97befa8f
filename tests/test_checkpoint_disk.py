"""A full disk seen coming and met, on a 40 MB file system the test makes (a size-limited tmpfs, so root only): a run
that needs more room stops before any work, in one line; with `trainer.low_disk=warn` it trains, and the save that
finds the disk full ends the run in one line naming the folder and the cause – no traceback. The partial folder is
left; once there is room the next start skips it, and the resumed run continues the uninterrupted loss curve
exactly."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from nxpretrain.recipes import get_recipe
from nxpretrain.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
# gpt3_tiny at full size (a checkpoint of 22.8 MB: one fits in 40 MB, two do not), on the synthetic stream
OVERRIDES = ['data.corpus=synthetic', 'trainer.save_every=5', 'trainer.eval_every=0', 'trainer.log_every=5',
             'trainer.threads=1']
STEPS = 10
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason='mounting a size-limited tmpfs needs root')


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / 'disk'
    mnt.mkdir()
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=40m', 'tmpfs', str(mnt)], capture_output=True, text=True)
    if r.returncode: pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(['umount', '-l', str(mnt)], check=True)


def run(cwd, *argv, module='nxpretrain.train.entry'):
    "Exit status and output (stdout and stderr together) of `python -m MODULE ARGV…`."
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS='1')
    cmd = [sys.executable, '-c', f'import sys; from {module} import main; sys.exit(main())', *argv]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def test_too_little_room_stops_the_run_before_it_starts(small_disk, tmp_path):
    rc, out = run(tmp_path, 'train', 'gpt3_tiny', *OVERRIDES, '--max-steps', str(STEPS), '--out', str(small_disk),
                  module='nxpretrain.cli')
    folder = small_disk / 'gpt3_tiny' / 'checkpoints'
    errors = [line for line in out.splitlines() if line.startswith('nxpretrain train:')]
    assert rc == 2 and len(errors) == 1 and 'Traceback' not in out, out
    assert errors[0].startswith(f'nxpretrain train: {folder}: ') and 'free, ' in errors[0], errors[0]
    assert 'needed for 3 checkpoints of 22.3 MB' in errors[0] and 'trainer.low_disk=warn' in errors[0], errors[0]
    assert not folder.exists() and not (small_disk / 'gpt3_tiny' / 'steps.jsonl').exists()   # nothing was trained


def test_a_full_disk_during_a_save_is_one_line_and_the_resume_is_exact(small_disk, tmp_path):
    reference = train(get_recipe('gpt3_tiny', *OVERRIDES), str(tmp_path / 'reference'), STEPS, progress=False)
    rc, out = run(tmp_path, '--recipe', 'gpt3_tiny', *OVERRIDES, 'trainer.low_disk=warn', '--max-steps', str(STEPS),
                  '--out-dir', str(small_disk), '--no-progress')
    folder = small_disk / 'gpt3_tiny' / 'checkpoints'
    assert rc == 2 and 'Traceback' not in out, out
    assert any(line.startswith(f'warning: {folder}: ') for line in out.splitlines()), out
    error, = [line for line in out.splitlines() if line.startswith('error:')]
    want = f'error: {folder / "step_10"}: saving the checkpoint failed: No space left on device ('
    assert error.startswith(want) and 'the next start resumes from the newest complete checkpoint' in error, error
    assert (folder / 'step_5' / 'COMPLETE').exists() and not (folder / 'step_10' / 'COMPLETE').exists()
    # room is made (the file system grows), and the next start skips the partial folder and goes on from step 5
    subprocess.run(['mount', '-o', 'remount,size=80m', str(small_disk)], check=True)
    rc, out = run(tmp_path, '--recipe', 'gpt3_tiny', *OVERRIDES, '--max-steps', str(STEPS), '--out-dir',
                  str(small_disk), '--no-progress')
    assert rc == 0, out
    assert 'step_10: partial checkpoint' in out and f'resumed from {folder / "step_5"}' in out, out
    assert (folder / 'step_10' / 'COMPLETE').exists()
    steps = [json.loads(line) for line in (small_disk / 'gpt3_tiny' / 'steps.jsonl').read_text().splitlines()]
    assert [s['step'] for s in steps] == list(range(1, STEPS + 1)) + list(range(6, STEPS + 1))
    assert [s['loss'] for s in steps[STEPS:]] == reference.losses[5:], (steps[STEPS:], reference.losses)
    assert [s['loss'] for s in steps[:STEPS]] == reference.losses
