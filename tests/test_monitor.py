"""The monitor never shows one job's data under another job's id: the job index holds jobs of several clusters with the
same id, and the monitor answers only with the one of the cluster that answers here, or a one-line error naming where
it looked."""
import json, socket, time
from pathlib import Path
import pytest
from nxpretrain.errors import LaunchError
from nxpretrain.launch.launcher import find_records
from nxpretrain import monitor

ROOT = Path(__file__).resolve().parents[1]


def _record(home: Path, jid, scheduler, cluster, code=0):
    "A finished job of `cluster` in the index, with a log that names its cluster."
    d = home / f"{scheduler}-{cluster}-{jid}"
    (d / 'state').mkdir(parents=True)
    (d / 'job.log').write_text(''.join(f"{cluster} line {i}\n" for i in range(50)))
    (d / 'state' / 'started').write_text(str(time.time() - 30))
    (d / 'state' / 'exit_code').write_text(str(code))
    rec = dict(id=jid, scheduler=scheduler, cluster=cluster, name='j', kind='train', log=str(d / 'job.log'),
               out_dir=str(d), tasks=0, time=time.time() - 31, pid=1, start_ticks=-1, state_dir=str(d / 'state'))
    with open(home / 'jobs.jsonl', 'a') as f: f.write(json.dumps(rec) + '\n')


def test_two_clusters_with_the_same_job_id(tmp_path, monkeypatch):
    monkeypatch.setenv('NXPRETRAIN_HOME', str(tmp_path))
    here = socket.gethostname()
    _record(tmp_path, 'local-0001', 'local', here)
    _record(tmp_path, 'local-0001', 'local', 'other-host', code=1)       # the same id from another machine, newer
    _record(tmp_path, '4242', 'slurm', 'alpha')                     # a Slurm job of a cluster that does not answer here
    assert len(find_records('local-0001')) == 2
    # this machine's job, its log and its status, never the other's
    tail = monitor.log_tail('local-0001', 5)
    assert tail.splitlines() == [f"{here} line {i}" for i in range(45, 50)], tail
    s = monitor.job_status('local-0001')
    assert (str(s.state), s.cluster, s.exit_code) == ('COMPLETED', here, 0) and s.elapsed_s > 0, s
    row = monitor.status_table('local-0001').rows[0]
    assert row[:3] == ['local-0001', f"local:{here}", 'COMPLETED'] and row[4] != '0:00:00', row
    # ids this machine did not give: one line naming where the monitor looked and where the index has them
    for jid, other in (('local-0002', None), ('4242', "slurm cluster 'alpha'")):
        with pytest.raises(LaunchError) as e: monitor.log_tail(jid)
        msg = str(e.value)
        assert '\n' not in msg and f"local cluster '{here}'" in msg and 'slurm' in msg, msg
        if other: assert f"the index has it from {other}" in msg, msg
    _record(tmp_path, 'local-0003', 'local', 'other-host')
    with pytest.raises(LaunchError, match="other-host") as e: monitor.status_table('local-0003')
    assert 'other-host line' not in str(e.value)


def test_follow_redraws_until_the_job_ends(tmp_path, monkeypatch, capsys):
    "A live job of this machine writes steps for ~3 s: `follow_job` redraws while it runs and ends on its final state."
    monkeypatch.setenv('NXPRETRAIN_HOME', str(tmp_path))
    p, run = _live_job(tmp_path)
    s = monitor.follow_job('local-live', run, every=0.5, tail=2)
    p.wait()
    assert str(s.state) == 'COMPLETED' and s.elapsed_s > 2, s
    out = capsys.readouterr().out
    assert out.count('RUNNING') >= 2 and out.rstrip().count('COMPLETED') == 1, out[-3000:]
    assert out.rfind('COMPLETED') > out.rfind('RUNNING') and 'step 6/6 | loss 4' in out[out.rfind('COMPLETED') :], out[
        -2000:
    ]


def _live_job(tmp_path, steps=6, pause=0.5):
    "A job of this machine in the index that writes `steps` steps `pause` s apart, then exits 0; (process, run folder)."
    import subprocess
    from nxpretrain.launch.local import _start_ticks
    run, state = tmp_path / 'run', tmp_path / 'state'
    run.mkdir()
    state.mkdir()
    script = (f"date +%s > {state}/started; for i in $(seq 1 {steps}); do echo '{{\"step\": '$i', \"loss\": '$((10 - "
              f"i))', \"time\": '$(date +%s.%N)'}}' >> {run}/steps.jsonl; echo \"step $i/{steps} | loss $((10 - i))\" "
              f">> {tmp_path}/job.log; sleep {pause}; done; echo 0 > {state}/exit_code")
    p = subprocess.Popen(['bash', '-c', script], start_new_session=True)
    rec = dict(id='local-live', scheduler='local', cluster=socket.gethostname(), name='j', kind='train',
               out_dir=str(tmp_path), log=str(tmp_path / 'job.log'), tasks=0, time=time.time(), pid=p.pid,
               start_ticks=_start_ticks(p.pid), state_dir=str(state))
    (tmp_path / 'jobs.jsonl').write_text(json.dumps(rec) + '\n')
    return p, run


def test_watch_redraws_in_the_background_of_a_real_kernel(tmp_path):
    """In a real Jupyter kernel, `watch_job` returns at once; while the job runs, other cells run at once and the job's
    view keeps being replaced (update_display_data), ending on its final state; the watch then stops by itself."""
    import os, queue
    from jupyter_client.manager import start_new_kernel
    km, kc = start_new_kernel(kernel_name='python3', env={**os.environ, 'NXPRETRAIN_HOME': str(tmp_path)})
    try:
        kc.execute_interactive('from nxpretrain.monitor import watch_job', timeout=120)
        p, run = _live_job(tmp_path, steps=8, pause=0.5)
        t0 = time.time()
        reply = kc.execute_interactive(f"w = watch_job('local-live', {str(run)!r}, 8, every=0.3, tail=2)", timeout=60,
                                       output_hook=lambda m: None)
        started = time.time() - t0
        assert reply['content']['status'] == 'ok', reply['content']
        assert p.poll() is None, 'the job ended before the watch returned: the watch blocked the kernel'
        replies = []                              # other cells run while the job runs and the view redraws
        for _ in range(3):
            t = time.time()
            r = kc.execute_interactive('1 + 1', timeout=10, output_hook=lambda m: None)
            replies.append((r['content']['status'], time.time() - t))
            time.sleep(0.5)
        p.wait()
        updates, t_end = [], time.time() + 20
        while time.time() < t_end:
            try: m = kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                if updates and 'COMPLETED' in updates[-1]: break
                continue
            if m['msg_type'] == 'update_display_data': updates.append(m['content']['data'].get('text/plain', ''))
        r = kc.execute_interactive('assert not w.running, w', timeout=10, output_hook=lambda m: None)
        assert r['content']['status'] == 'ok', r['content']
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert started < 30 and all(s == 'ok' and dt < 2 for s, dt in replies), (started, replies)
    tables = [u for u in updates if 'local-live' in u]
    assert len(tables) >= 2 and 'COMPLETED' in tables[-1] and 'RUNNING' in ''.join(tables[:-1]), tables
    assert 'step 8/8 | loss 2' in ''.join(updates[-4:]), updates[-4:]


# NxD Training's TensorBoard rows as NxDT 9169aa0 writes them with our exports' log_every_n_steps 1: the postfix's
# names, unprefixed (NxDT src/neuronx_distributed_training/lightning_modules/model/base.py:640-654, logged on_step so no
# `_step` suffix), `epoch` (Lightning 2.5.0 trainer/connectors/logger_connector/logger_connector.py:113) and
# `train_step_timing` (NxDT src/neuronx_distributed_training/utils/exp_manager.py:74), one row a step at x = the
# 0-based step (logger_connector.py:113-114)
NXDT_TAGS = ('reduced_train_loss', 'lr', 'parameter_norm', 'gradient_norm', 'global_step', 'consumed_samples',
             'throughput', 'throughput_peak', 'epoch', 'train_step_timing')


def _nxdt_line(step: int, batches: int = 91) -> str:
    "Lightning 2.5's bar as NxDT prints it after `step` steps (tqdm_progress.py:105; seconds as at 320 s a step)."
    elapsed, left = 320 * step, 320 * (batches - step)
    clock = lambda s: f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"
    return (f"Epoch 0:  {100 * step // batches:2d}%|▏         | {step}/{batches} [{clock(elapsed)}<{clock(left)},  "
            f"0.00it/s, reduced_train_loss={13 - step / 10:.3f}, lr=1.5e-8, parameter_norm=5536.0, "
            f"gradient_norm=9.810, global_step={step - 1}.000, consumed_samples={step * 1024}.0, throughput=3.200, "
            "throughput_peak=3.200]")


def test_an_nxdt_job_is_read_through_its_engine(tmp_path, monkeypatch):
    "An NxDT job's log (`\\r`-separated updates) and event file, read by the monitor and `watch` through its engine."
    import os, subprocess, sys
    from torch.utils.tensorboard import SummaryWriter
    from nxpretrain.engines.base import get_engine
    from nxpretrain.launch.watch import watch
    from nxpretrain.recipes import get_recipe
    monkeypatch.setenv('NXPRETRAIN_HOME', str(tmp_path))
    run = tmp_path / 'exp' / 'llama3_70b_trn2'          # exp_manager.explicit_log_dir: the events land in it
    with SummaryWriter(str(run)) as w:
        for x in range(3):
            values = (13 - (x + 1) / 10, 1.5e-8, 5536.0, 9.81, float(x), (x + 1) * 1024.0, 3.2, 3.2, 0.0, 320.0)
            for tag, value in zip(NXDT_TAGS, values): w.add_scalar(tag, value, x)
    sc = monitor.scalars(run, get_engine('nxdt').tb_tags)
    assert list(sc.index) == [0, 1, 2] and sc['loss'].round(3).tolist() == [12.9, 12.8, 12.7], sc
    assert {'grad_norm', 'parameter_norm', 'throughput', 'train_step_timing'} <= set(sc.columns)
    log = tmp_path / 'slurm-7.out'
    # tqdm redraws with a carriage return before each update; the 4th is still being written
    log.write_text('[NeMo I 2025-09-12 10:00:00 exp_manager:246] Experiments will be logged at x\n' +
                   ''.join('\r' + _nxdt_line(s) for s in (1, 2, 3)) + '\r' + _nxdt_line(4)[:60])
    _record(tmp_path, 'local-0007', 'local', socket.gethostname())
    rec = json.loads((tmp_path / 'jobs.jsonl').read_text())
    rec.update(engine='nxdt', log=str(log))
    (tmp_path / 'jobs.jsonl').write_text(json.dumps(rec) + '\n')
    row = monitor.status_table('local-0007', run, recipe=get_recipe('llama3_70b_trn2')).rows[0]
    assert row[5:] == ['3/10000', '12.7000', '1.5e-08', f"{3.2 * 8192:.0f}", '0:00:00'], row  # ended: no time left
    p = monitor.progress(run, log=log.read_text(), recipe=get_recipe('llama3_70b_trn2'))
    assert p['eta_s'] == pytest.approx(9997 * 320.0), p
    assert watch('local-0007', timeout=2, poll=0.1).last['loss'] == 12.7           # the engine its record names
    env = {**os.environ, 'PYTHONPATH': str(Path(__file__).resolve().parents[1])}
    argv = ['watch', str(log), '--engine', 'nxdt', '--max-steps', '100', '--timeout', '0.5']
    out = subprocess.run([sys.executable, '-c', f"from nxpretrain.cli import main; main({argv!r})"],
                         capture_output=True, text=True, env=env).stdout
    assert 'step 3/100, 320.00 s/step, ETA 517.3 min | loss 12.7' in out, out


# Megatron-LM's TensorBoard scalars at e958b2ca, x = the iteration: 'learning-rate' (training.py:1412), 'batch-size'
# (:1423), the loss by its name, 'lm loss' (:1429), 'loss-scale' (:1435), 'grad-norm' (:1447), 'params-norm' (:1459)
MEGATRON_TAGS = ('learning-rate', 'batch-size', 'lm loss', 'loss-scale', 'grad-norm', 'params-norm')


def _megatron_line(it: int, total: int = 1000) -> str:
    "The line Megatron-LM's last rank prints every --log-interval iterations (training.py:1517-1565 at e958b2ca)."
    return (f" [2025-04-06 10:00:{it:02d}] iteration {it:8d}/{total:8d} | consumed samples: {it * 512:12d} | elapsed "
            f"time per iteration (ms): {22800.0:.1f} | throughput per GPU (TFLOP/s/GPU): {512.3:.1f} | learning rate: "
            f"{6e-5 * it / 2000:.6E} | global batch size: {512:5d} | lm loss: {11 - it / 10:.6E} | loss scale: "
            f"{1.0:.1f} | grad norm: {1.234:.3f} | number of skipped iterations: {0:3d} | number of nan iterations: "
            f"{0:3d} |")


def test_a_megatron_job_is_read_through_its_engine(tmp_path, monkeypatch):
    "A Megatron-LM job's log and event file in its exact formats, read by the monitor and `watch` through its engine."
    import os, subprocess, sys
    from torch.utils.tensorboard import SummaryWriter
    from nxpretrain.engines.base import get_engine
    from nxpretrain.launch.watch import watch
    from nxpretrain.recipes import get_recipe
    monkeypatch.setenv('NXPRETRAIN_HOME', str(tmp_path))
    run = tmp_path / 'gpt3_175b_gpu'                   # --tensorboard-dir is the run folder's tb/
    with SummaryWriter(str(run / 'tb')) as w:
        for it in (1, 2, 3):
            for tag, value in zip(MEGATRON_TAGS, (6e-5 * it / 2000, 512.0, 11 - it / 10, 1.0, 1.234, 5536.0)):
                w.add_scalar(tag, value, it)
    sc = monitor.scalars(run, get_engine('megatron').tb_tags)
    assert list(sc.index) == [1, 2, 3] and sc['loss'].round(3).tolist() == [10.9, 10.8, 10.7], sc
    assert {'lr', 'grad_norm', 'parameter_norm', 'batch-size'} <= set(sc.columns), sc.columns
    log = tmp_path / 'nxp-train-gpt3_175b_gpu-9.out'
    log.write_text('\n'.join(['using world size: 128, data-parallel size: 1, context-parallel size: 1', *map(
        _megatron_line, (1, 2, 3)), ' validation loss at iteration 3 | lm loss value: 1.070000E+01 | lm loss PPL: '
        '4.4E+04 | ']) + '\n')
    _record(tmp_path, 'local-0009', 'local', socket.gethostname())
    rec = json.loads((tmp_path / 'jobs.jsonl').read_text())
    rec.update(engine='megatron', log=str(log))
    (tmp_path / 'jobs.jsonl').write_text(json.dumps(rec) + '\n')
    recipe = get_recipe('gpt3_175b_gpu')
    row = monitor.status_table('local-0009', run, recipe=recipe).rows[0]
    tokens_per_s = 512 * 2048 / 22.8
    assert row[5:] == ['3/250000', '10.7000', '9e-08', f"{tokens_per_s:.0f}", '0:00:00'], row   # ended: no time left
    p = monitor.progress(run, log=log.read_text(), recipe=recipe)
    assert p['eta_s'] == pytest.approx((250000 - 3) * 22.8), p           # to the run's end, not the line's total
    last = watch('local-0009', timeout=2, poll=0.1).last
    assert (last['loss'], last['lr'], last['s_per_step']) == (10.7, 9e-08, 22.8), last
    env = {**os.environ, 'PYTHONPATH': str(Path(__file__).resolve().parents[1])}
    argv = ['watch', str(log), '--engine', 'megatron', '--timeout', '0.5']
    out = subprocess.run([sys.executable, '-c', f"from nxpretrain.cli import main; main({argv!r})"],
                         capture_output=True, text=True, env=env).stdout
    assert 'step 3/1000, 22.80 s/step, ETA 378.9 min | loss 10.7, lr 9e-08' in out, out
    # the stage notebook, as a user runs it on the head node: the job's table, its log, the framework's curves
    nb = tmp_path / 'monitor.ipynb'
    done = subprocess.run([sys.executable, '-m', 'papermill', str(ROOT / 'nbs/05_monitor.ipynb'), str(nb), '-k',
                           'python3', '-p', 'model', 'gpt3_175b_gpu', '-p', 'out_dir', str(tmp_path), '-p', 'job',
                           'local-0009', '-p', 'follow', 'True', '--no-progress-bar'],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = json.dumps(json.loads(nb.read_text())['cells'])
    assert 'local-0009' in text and '10.7000' in text and '9e-08' in text and 'iteration        3/    1000' in text
    assert 'image/png' in text and 'grad_norm' in text           # the curves and the numbers from its events
