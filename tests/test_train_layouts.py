"""The trainer through the parallel engine on real gloo processes: DP, TP and PP runs match the single-process run,
resume exactly on the same layout, and resume onto a different layout (DCP reshards model and optimizer state)."""
import math
import pytest
import torch
from nxpretrain.recipes import get_recipe
from nxpretrain.config import override
from nxpretrain.train.trainer import train
from train_helpers import dist_train, close

STEPS, HALF = 6, 3
# decay_steps fixes the schedule's horizon, so a run stopped at HALF and resumed follows the uninterrupted one
R = get_recipe('gpt3_tiny', 'data.corpus=synthetic', 'model.n_layers=2', 'model.hidden=64', 'model.seq_len=32',
               'data.micro_batch=2', 'data.global_batch=4', 'trainer.threads=1', 'trainer.save_every=3',
               'trainer.eval_every=3', 'trainer.eval_steps=1', 'trainer.log_every=3', 'parallel.precision=fp32',
               'optim.warmup_steps=2', f'optim.decay_steps={STEPS}')


def layout(**kw): return override(R, *[f'parallel.{k}={v}' for k, v in kw.items()])


@pytest.fixture(scope='module')
def single(tmp_path_factory):
    torch.set_num_threads(1)
    return train(R, str(tmp_path_factory.mktemp('single')), STEPS, progress=False)


def test_dp2_matches_single_process(tmp_path, single):
    got = dist_train(layout(dp=2), tmp_path, STEPS)
    close(got.losses, single.losses)
    close([got.eval['loss']], [single.eval['loss']])


@pytest.mark.parametrize('lay', [dict(pp=2), dict(cp=2), dict(tp=2, cp=2)], ids=['pp2', 'cp2', 'tp2_cp2'])
def test_training_and_validation_equal_single_process(tmp_path, single, lay):
    """Validation runs on the layout itself (pipeline forward-only pass, ring attention) and gives the one-process
    figures."""
    got = dist_train(layout(**lay), tmp_path, STEPS, world=math.prod(lay.values()))
    close(got.losses, single.losses)
    close([got.eval['loss'], got.eval['perplexity']], [single.eval['loss'], single.eval['perplexity']])


def test_tp2_exact_resume_and_resume_onto_dp2(tmp_path, single):
    full = dist_train(layout(tp=2), tmp_path / 'full', STEPS)
    close(full.losses, single.losses)
    half = dist_train(layout(tp=2), tmp_path / 'cut', HALF)
    rest = dist_train(layout(tp=2), tmp_path / 'cut', STEPS)
    assert rest.start_step == HALF and half.losses + rest.losses == full.losses  # bit for bit on the same layout
    moved = dist_train(layout(dp=2), tmp_path / 'moved', STEPS, resume_from=half.last_checkpoint)
    assert moved.start_step == HALF
    close(moved.losses, full.losses[HALF:])  # TP-sharded model and optimizer state resharded onto DP 2


def test_pp2_checkpoint_resumes_in_one_process(tmp_path, single):
    half = dist_train(layout(pp=2), tmp_path / 'pp', HALF)
    close(half.losses, single.losses[:HALF])
    rest = train(R, str(tmp_path / 'one'), STEPS, resume_from=half.last_checkpoint, progress=False)
    assert rest.start_step == HALF
    close(rest.losses, single.losses[HALF:])


def test_single_process_checkpoint_resumes_onto_pp2(tmp_path, single):
    half = train(R, str(tmp_path / 'one'), HALF, progress=False)
    rest = dist_train(layout(pp=2), tmp_path / 'pp', STEPS, resume_from=half.last_checkpoint)
    close(half.losses + rest.losses, single.losses)


def test_zero1_resume_exact_and_onto_one_process(tmp_path, single):
    z = layout(dp=2, zero1=True)
    full = dist_train(z, tmp_path / 'full', STEPS)
    close(full.losses, single.losses)
    half = dist_train(z, tmp_path / 'cut', HALF)
    rest = dist_train(z, tmp_path / 'cut', STEPS)
    assert half.losses + rest.losses == full.losses  # optimizer state sharded over DP: saved and restored bit for bit
    one = train(R, str(tmp_path / 'one'), STEPS, resume_from=half.last_checkpoint, progress=False)
    close(one.losses, full.losses[HALF:])


def test_async_save_dp2_resumes_exactly(tmp_path):
    """Async saves on 2 ranks (background copy and write on their own gloo group): the resumed run equals the
    uninterrupted one."""
    full = dist_train(layout(dp=2), tmp_path / 'full', STEPS, async_save=True)
    half = dist_train(layout(dp=2), tmp_path / 'cut', HALF, async_save=True)
    rest = dist_train(layout(dp=2), tmp_path / 'cut', STEPS, async_save=True)
    assert rest.start_step == HALF and half.losses + rest.losses == full.losses


def test_interleaved_pipeline_checkpoint_resumes_and_reshards(tmp_path):
    "PP2 with two interleaved chunks per rank: its checkpoint holds every chunk under the whole model's names."
    r = override(R, 'model.n_layers=4')
    one = train(r, str(tmp_path / 'one'), STEPS, progress=False)
    lay = override(r, 'parallel.pp=2', 'parallel.virtual_pp=2')
    half = dist_train(lay, tmp_path / 'cut', HALF)
    rest = dist_train(lay, tmp_path / 'cut', STEPS)
    assert rest.start_step == HALF
    close(half.losses + rest.losses, one.losses)
    full = dist_train(lay, tmp_path / 'full', STEPS)
    assert half.losses + rest.losses == full.losses   # bit for bit on the same layout
    moved = train(r, str(tmp_path / 'moved'), STEPS, resume_from=half.last_checkpoint, progress=False)
    close(moved.losses, one.losses[HALF:])            # resharded onto one process
