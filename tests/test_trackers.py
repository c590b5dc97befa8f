"""The trainer's metrics in MLflow and W&B, read back with the real client libraries, offline: a tiny run with
`trainer.loggers=tensorboard,mlflow,wandb` stopped at step 4 and resumed to step 6 logs into one MLflow run and one
W&B run; every step's loss and learning rate there equals `steps.jsonl`, validation lands at its steps, the recipe is
the run's parameters, the end state is recorded, and no secret from the environment is written anywhere in the run
folder."""
import json
from pathlib import Path
import pytest
pytest.importorskip('mlflow', reason="pip install 'nxpretrain[tracking]'")
pytest.importorskip('wandb', reason="pip install 'nxpretrain[tracking]'")
from mlflow.tracking import MlflowClient
from nxpretrain.recipes import get_recipe
from nxpretrain.validate import problems
from nxpretrain.train.trainer import train
from nxpretrain.train.trackers import wandb_history
import nxpretrain.validate as validation

pytestmark = pytest.mark.timeout(300)
TINY = ['data.corpus=synthetic', 'model.n_layers=1', 'model.hidden=32', 'model.n_heads=2', 'model.seq_len=16',
        'data.micro_batch=2', 'data.global_batch=4', 'trainer.log_every=1', 'trainer.eval_every=3',
        'trainer.eval_steps=1', 'trainer.save_every=2', 'trainer.max_steps=6', 'optim.warmup_steps=1',
        'trainer.loggers=tensorboard,mlflow,wandb']


def test_mlflow_and_wandb_hold_what_the_trainer_logged(tmp_path, monkeypatch):
    monkeypatch.setenv('WANDB_API_KEY', 'wandb-secret-0123456789abcdef0123456789abcdef01234567')
    monkeypatch.setenv('HF_TOKEN', 'hf_secretsecretsecretsecret')
    for k in ('MLFLOW_TRACKING_URI', 'WANDB_MODE'): monkeypatch.delenv(k, raising=False)
    r = get_recipe('gpt3_tiny', *TINY)
    first = train(r, str(tmp_path), max_steps=4, progress=False)
    assert first.final_step == 4
    res = train(r, str(tmp_path), max_steps=6, progress=False)          # resumes from step_4 into the same tracker runs
    assert res.start_step == 4 and res.final_step == 6
    run = Path(res.out_dir)
    steps = [json.loads(l) for l in (run / 'steps.jsonl').read_text().splitlines()]
    assert [s['step'] for s in steps] == [1, 2, 3, 4, 5, 6]
    ids = json.loads((run / 'trackers.json').read_text())
    client = MlflowClient(tracking_uri=(run / 'mlruns').as_uri())
    # MLflow: one run, every step's loss and lr, validation at 3 and 6, the recipe as parameters, the end as tags
    loss = sorted((m.step, m.value) for m in client.get_metric_history(ids['mlflow'], 'train/loss'))
    assert loss == [(s['step'], pytest.approx(s['loss'], rel=1e-6)) for s in steps], loss
    lr = sorted((m.step, m.value) for m in client.get_metric_history(ids['mlflow'], 'train/lr'))
    assert lr == [(s['step'], pytest.approx(s['lr'], rel=1e-6)) for s in steps], lr
    assert [m.step for m in client.get_metric_history(ids['mlflow'], 'val/loss')] == [3, 6]
    mrun = client.get_run(ids['mlflow'])
    assert (
        mrun.data.params['model.hidden'] == '32' and mrun.data.params['trainer.loggers'] == 'tensorboard,mlflow,wandb'
    )
    assert mrun.data.tags['final.step'] == '6' and mrun.data.tags['final.stopped'] == res.stopped
    assert mrun.info.status == 'FINISHED'
    assert len(client.search_runs([mrun.info.experiment_id])) == 1
    # W&B offline: the same rows, across the two starts, under one run id
    rows = [row for row in wandb_history(run) if 'train/loss' in row]
    assert [row['_step'] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert [row['train/loss'] for row in rows] == pytest.approx([s['loss'] for s in steps], rel=1e-6)
    assert {row['_step'] for row in wandb_history(run) if 'val/loss' in row} == {3, 6}
    assert all(p.name.endswith(ids['wandb']) for p in (run / 'wandb').glob('offline-run-*'))
    # nothing secret in any file the run wrote
    for f in run.rglob('*'):
        if f.is_file():
            data = f.read_bytes()
            assert b'wandb-secret' not in data and b'hf_secret' not in data, f


def test_logger_problems_are_one_line_before_any_work(monkeypatch):
    r = get_recipe('gpt3_tiny', 'trainer.loggers=tensorboard,neptune')
    assert problems(r) == ["trainer.loggers='tensorboard,neptune': neptune unknown; choose from tensorboard, mlflow, "
                           "wandb"]
    monkeypatch.setitem(validation.TRACKERS, 'wandb', 'wandb_is_not_installed_here')
    msg = problems(get_recipe('gpt3_tiny', 'trainer.loggers=wandb'))
    assert msg == ["trainer.loggers='wandb': wandb needs its client library: pip install 'nxpretrain[tracking]'"], msg
