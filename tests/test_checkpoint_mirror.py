"""Checkpoints mirrored to a local S3 server during training (`trainer.upload_to`): every complete checkpoint arrives
byte for byte with its COMPLETE marker, an incomplete one never does, a copy cut short is refused when fetched back,
and a wrong bucket stops the run before its first step."""
import pytest
from nxpretrain.data import s3
from nxpretrain.recipes import get_recipe
from nxpretrain.errors import RecipeError
from nxpretrain.train.checkpoint import MARKER, CheckpointError, verify_checkpoint
from nxpretrain.train.mirror import S3Mirror, fetch_checkpoint
from nxpretrain.train.trainer import train
from s3_helpers import s3_server

pytest.importorskip('moto')
R = get_recipe('gpt3_tiny', 'data.corpus=synthetic', 'model.n_layers=2', 'model.hidden=32', 'model.seq_len=32',
               'data.micro_batch=2', 'data.global_batch=2', 'trainer.threads=1', 'trainer.eval_every=0',
               'trainer.save_every=1', 'trainer.keep_last=2', 'optim.warmup_steps=1',
               'trainer.upload_to=s3://ckpts/runs/tiny')


@pytest.fixture
def endpoint(monkeypatch):
    with s3_server() as url:
        monkeypatch.setenv('AWS_ENDPOINT_URL', url)
        s3.s3_client().create_bucket(Bucket='ckpts')
        yield url


def _remote(prefix):
    return {k: s for k, s, _ in s3.list_objects(prefix)}


def test_every_complete_checkpoint_is_uploaded_byte_for_byte(tmp_path, endpoint):
    res = train(R, str(tmp_path / 'run'), 3, progress=False)
    remote = _remote('s3://ckpts/runs/tiny/')
    steps = sorted({k.split('/')[2] for k in remote})
    assert steps == ['step_1', 'step_2', 'step_3']                     # step_1 too, though pruned on disk (keep_last=2)
    assert all(f'runs/tiny/{s}/{MARKER}' in remote for s in steps)
    local = tmp_path / 'run' / 'gpt3_tiny' / 'checkpoints'
    assert sorted(p.name for p in local.iterdir()) == ['step_2', 'step_3']
    for step in ('step_2', 'step_3'):
        files = sorted(p for p in (local / step).rglob('*') if p.is_file())
        assert sorted(f'runs/tiny/{step}/{p.relative_to(local / step)}' for p in files) == sorted(
            k for k in remote if k.split('/')[2] == step
        )
        back = fetch_checkpoint(f's3://ckpts/runs/tiny/{step}', tmp_path / 'back', progress=False)
        assert all((back / p.relative_to(local / step)).read_bytes() == p.read_bytes() for p in files)
    assert (
        'uploaded step_3 to s3://ckpts/runs/tiny/step_3' in (tmp_path / 'run' / 'gpt3_tiny' / 'train.log').read_text()
    )
    # the fetched copy resumes training
    more = train(R, str(tmp_path / 'resumed'), 4, resume_from=str(tmp_path / 'back' / 'step_3'), progress=False)
    assert more.start_step == 3 and len(more.losses) == 1


def test_incomplete_checkpoints_are_never_uploaded(tmp_path, endpoint):
    train(R, str(tmp_path / 'run'), 1, progress=False)
    done = tmp_path / 'run' / 'gpt3_tiny' / 'checkpoints' / 'step_1'
    partial = tmp_path / 'partial' / 'step_7'
    partial.mkdir(parents=True)
    for p in done.iterdir():
        if p.name != MARKER:
            (partial / p.name).write_bytes(p.read_bytes())    # every shard, no marker: a save that died
    said = []
    assert S3Mirror('s3://ckpts/other', log=said.append)(partial) is None
    assert _remote('s3://ckpts/other/') == {} and 'partial checkpoint' in said[0]
    # a copy cut short in S3 (no marker) is refused when fetched, in one line
    for p in sorted(partial.iterdir())[:2]: s3.upload(p, f's3://ckpts/cut/step_7/{p.name}', progress=False)
    with pytest.raises(CheckpointError, match=r'^s3://ckpts/cut/step_7: no COMPLETE marker in S3'):
        fetch_checkpoint('s3://ckpts/cut/step_7', tmp_path / 'back', progress=False)


def test_a_wrong_bucket_fails_before_training(tmp_path, endpoint):
    bad = get_recipe('gpt3_tiny', *[f'{k}={v}' for k, v in (('data.corpus', 'synthetic'), ('trainer.upload_to', 's3://no-such-bucket/x'))])
    with pytest.raises(RecipeError) as e: train(bad, str(tmp_path / 'run'), 1, progress=False)
    assert 'trainer.upload_to=s3://no-such-bucket/x: s3://no-such-bucket: no such bucket' in str(
        e.value
    ) and '\n' not in str(e.value)
    assert not (tmp_path / 'run' / 'gpt3_tiny' / 'checkpoints').exists()
