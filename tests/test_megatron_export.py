"""The Megatron-LM engine's exports: every GPU recipe's flags pass the contract read from Megatron-LM's source (and
megatron-core's own TransformerConfig and micro-batch calculator); a flags file broken the ways users break it is
refused with the check's file:line; rank.sh hands pretrain_gpt.py the flags file word for word; and on a real two-node
Slurm the job requeues itself after Megatron-LM's clean exit on SIGTERM, resumes from the tracker, and does not requeue
a step that failed. pretrain_gpt.py is a stand-in here (no GPU): it reads the flags, writes Megatron-LM's log lines,
checkpoint folders and tracker as its source does."""
import dataclasses, json, os, re, shlex, subprocess, time
from pathlib import Path
import pytest
from nxpretrain.recipes import get_recipe, load_catalog
from nxpretrain.config import override
from nxpretrain.clusters import PROFILES, profile
from nxpretrain.engines.base import engine_of
from nxpretrain.engines.megatron.job import export_megatron, parse_megatron_line, TRACKER, megatron_checkpoints
from nxpretrain.engines.megatron.contract import contract_problems, read_flags
from nxpretrain.testing.local_slurm import LocalSlurm, why_no_slurm
from nxpretrain.launch.launcher import submit, wait, tail, log_path, status, find_records
from nxpretrain.launch.slurm import SlurmLauncher
from nxpretrain.launch.job import render_jobs

GPU_RECIPES = sorted(n for n, r in load_catalog().items() if r.engine == "megatron")


def _export(tmp_path, name, *overrides, cluster=None):
    jobs = render_jobs(export_megatron(get_recipe(name), tmp_path / name, cluster, overrides,
                                       data_root=str(tmp_path / 'data'), megatron_lm=str(tmp_path / 'Megatron-LM')))
    return jobs['train']


def test_the_gpu_recipes_are_megatron_ones():
    assert {'gpt3_175b_gpu', 'gpt3_175b_p4de', 'gpt3_126m_p4de'} <= set(GPU_RECIPES), GPU_RECIPES


@pytest.mark.parametrize('name', GPU_RECIPES)
def test_every_gpu_recipe_passes_the_contract(tmp_path, name):
    job = _export(tmp_path, name)
    r = get_recipe(name)
    assert engine_of(r).check({'train': job}) == []
    flags = read_flags(job.out_dir / 'megatron.args')
    p = r.parallel
    assert flags['tensor-model-parallel-size'] == [str(p.tp)] and flags['pipeline-model-parallel-size'] == [str(p.pp)]
    assert flags['global-batch-size'] == [str(r.data.global_batch)]
    assert flags['train-iters'] == [str(r.trainer.max_steps)]
    assert flags['num-layers'] == [str(r.model.n_layers)] and flags['hidden-size'] == [str(r.model.hidden)]
    assert 'rampup-batch-size' not in flags and 'exit-signal-handler' in flags
    assert flags['ckpt-format'] == ['torch_dist']
    s = job.script
    assert '#SBATCH --signal=TERM@' in s and 'export CUDA_DEVICE_MAX_CONNECTIONS=1' in s
    assert f"#SBATCH --nodes={r.cluster.nodes}" in s and 'torchrun' not in s
    assert (job.out_dir / 'recipe.yaml').exists() and os.access(job.out_dir / 'rank.sh', os.X_OK)
    assert job.engine == 'megatron'             # the job index says who reads its log and checkpoints


def _broken(tmp_path, edit) -> list[str]:
    job = _export(tmp_path, 'gpt3_175b_gpu')
    f = job.out_dir / 'megatron.args'
    f.write_text(edit(f.read_text()))
    return contract_problems(f, job.nodes * job.devices_per_node, job.script)


def test_the_upstream_rampup_is_refused_with_its_line(tmp_path):
    out = _broken(tmp_path, lambda t: t + '--rampup-batch-size 16 16 5859375\n')
    assert any('rampup' in p and 'arguments.py:' in p for p in out), out


def test_heads_not_divisible_by_tp(tmp_path):
    out = _broken(tmp_path, lambda t: t.replace('--num-attention-heads 96', '--num-attention-heads 92'))
    assert any('num-attention-heads' in p or 'num_attention_heads' in p for p in out), out


def test_batch_not_divisible(tmp_path):
    out = _broken(tmp_path, lambda t: t.replace('--micro-batch-size 1\n', '--micro-batch-size 3\n'))
    assert any('global batch size (512) is not divisible by micro batch size (3)' in p for p in out), out


def test_unknown_flag_and_bad_value(tmp_path):
    out = _broken(tmp_path, lambda t: t + '--no-such-flag 3\n')
    assert any('--no-such-flag' in p for p in out), out
    out = _broken(tmp_path, lambda t: t.replace('--ckpt-format torch_dist', '--ckpt-format zarr2'))
    assert any('ckpt-format' in p for p in out), out


def test_connections_must_be_one_with_tp(tmp_path):
    job = _export(tmp_path, 'gpt3_175b_gpu')
    script = job.script.replace('CUDA_DEVICE_MAX_CONNECTIONS=1', 'CUDA_DEVICE_MAX_CONNECTIONS=8')
    out = contract_problems(job.out_dir / 'megatron.args', job.nodes * job.devices_per_node, script)
    assert any('CUDA_DEVICE_MAX_CONNECTIONS' in p for p in out), out


def test_refusals_before_any_file_is_written(tmp_path):
    from nxpretrain.errors import RecipeError
    with pytest.raises(RecipeError, match='parallel.fsdp with engine=megatron'):
        _export(tmp_path, 'gpt3_126m_p4de', 'parallel.fsdp=true', 'parallel.zero1=false')
    with pytest.raises(RecipeError, match='Megatron-LM runs on NVIDIA GPUs'):
        _export(tmp_path, 'gpt3_126m_p4de', cluster='trn1.32xlarge')
    assert not (tmp_path / 'gpt3_126m_p4de').exists()


# A stand-in for pretrain_gpt.py with Megatron-LM's outward behaviour: the log line of training.py, iter_NNNNNNN
# folders and the tracker written after a save, resume from the tracker, and on SIGTERM (--exit-signal-handler) a save
# at the end of the iteration and exit status 0. It fails (status 3) when a file `fail` sits beside it.
STAND_IN = r'''
import json, os, signal, sys, time
from pathlib import Path
args, flags, key = sys.argv[1:], {}, None
for a in args:
    if a.startswith('--'): key = a[2:]; flags[key] = []
    else: flags[key].append(a)
here = Path(__file__).parent
(here / f"argv.{os.environ['RANK']}.json").write_text(json.dumps(args))
if (here / 'fail').exists(): sys.exit(3)
save, iters, every = Path(flags['save'][0]), int(flags['train-iters'][0]), int(flags['save-interval'][0])
tracker = save / 'latest_checkpointed_iteration.txt'
it = int(tracker.read_text()) if tracker.exists() else 0
print(f"resuming from iteration {it} on rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}", flush=True)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
def checkpoint(i):
    if os.environ['RANK'] != '0': return
    (save / f"iter_{i:07d}").mkdir(parents=True, exist_ok=True)
    tracker.write_text(str(i))
while it < iters:
    time.sleep(0.4)
    it += 1
    if os.environ['RANK'] == '0':
        print(f" [2026-01-01 00:00:00] iteration {it:8d}/{iters:8d} | consumed samples: {it * 8:12d} | elapsed time "
              f"per iteration (ms): 400.0 | learning rate: 1.000000E-04 | global batch size:     8 | lm loss: "
              f"{5 - it / 100:.6E} | loss scale: 1.0 | grad norm: 1.000 |", flush=True)
    if it % every == 0 or it == iters: checkpoint(it)
    if stop:
        checkpoint(it)
        print('exiting program after receiving SIGTERM.', flush=True)
        sys.exit(0)
'''


def test_rank_sh_passes_the_flags_word_for_word(tmp_path):
    job = _export(tmp_path, 'gpt3_126m_p4de')
    mlm = tmp_path / 'Megatron-LM'
    mlm.mkdir()
    (mlm / 'pretrain_gpt.py').write_text(STAND_IN)
    (mlm / 'fail').touch()     # stop after recording argv
    env = {**os.environ, 'RANK': '0', 'LOCAL_RANK': '0', 'WORLD_SIZE': '1'}   # what the launcher gives each task
    p = subprocess.run(['bash', str(job.out_dir / 'rank.sh')], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    argv = json.loads((mlm / 'argv.0.json').read_text())
    lines = [l.split() for l in (job.out_dir / 'megatron.args').read_text().splitlines() if not l.startswith('#')]
    assert argv == [w for line in lines for w in line]


SLURM = why_no_slurm()


@pytest.fixture
def gpu_shaped_two_nodes(monkeypatch):
    "Two local Slurm nodes, each standing in for a one-GPU node of the recipe's cluster (no gres, no container)."
    prof = dataclasses.replace(profile('p4de.24xlarge'), name='gpu-ci', devices_per_node=1, cpus_per_node=1, gres='',
                               container='', container_mounts='', env={})
    monkeypatch.setitem(PROFILES, 'gpu-ci', prof)
    with LocalSlurm('megatron2', nodes=2, netns=True, port=6827): yield prof


def _local_job(tmp_path, prof, *overrides):
    r = override(get_recipe('gpt3_126m_p4de'), 'cluster.nodes=2', 'cluster.time=00:30:00', 'parallel.tp=1',
                 'parallel.pp=1', 'data.micro_batch=1', 'data.global_batch=2', 'trainer.max_steps=30',
                 'trainer.save_every=5', 'optim.warmup_steps=3',
                 'optim.decay_steps=30', *overrides)
    job = render_jobs(export_megatron(r, tmp_path / 'job', prof, data_root=str(tmp_path / 'data'),
                                      megatron_lm=str(tmp_path / 'Megatron-LM')))['train']
    mlm = tmp_path / 'Megatron-LM'
    mlm.mkdir(exist_ok=True)
    (mlm / 'pretrain_gpt.py').write_text(STAND_IN)
    for line in job.script.splitlines():       # make what the job checks for, as the data stage and setup would
        if line.startswith('for need in '):
            for need in shlex.split(line.removeprefix('for need in ').removesuffix('; do')):
                path = Path(need.split('::')[0])
                assert path.is_absolute(), path
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
    return job


def _wait_iteration(job, jid, n, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        log = Path(log_path(jid))
        steps = [parse_megatron_line(l) for l in log.read_text(errors='replace').splitlines()] if log.exists() else []
        if [s for s in steps if s and s['step'] >= n]: return
        time.sleep(0.5)
    raise AssertionError(f"iteration {n} not reached: {status(jid)}\n{tail(jid, 40)}")


@pytest.mark.timeout(400)
@pytest.mark.skipif(bool(SLURM), reason=f"no local Slurm: {SLURM}")
def test_sigterm_saves_requeues_and_resumes(gpu_shaped_two_nodes, tmp_path):
    job = _local_job(tmp_path, gpu_shaped_two_nodes)
    jid = submit(job)
    assert find_records(jid)[0]['engine'] == 'megatron'
    _wait_iteration(job, jid, 7)
    subprocess.run(['scancel', '--signal=TERM', str(jid)], check=True)     # what --signal=TERM@ sends near the limit
    wait(jid, until={'PENDING'}, timeout=120)
    log = Path(log_path(jid)).read_text(errors='replace')
    assert 'exiting program after receiving SIGTERM.' in log and f"requeueing job {jid} (restart 1)" in log, log
    stopped = int((job.run_dir / 'checkpoints' / TRACKER).read_text())
    assert 7 <= stopped < 30
    SlurmLauncher().release(jid)
    s = wait(jid, timeout=200)
    assert s.state == 'COMPLETED', (s, tail(jid, 40))
    log = Path(log_path(jid)).read_text(errors='replace')
    assert (
        f"resuming from iteration {stopped} on rank 0 of 2" in log
        and f"resuming from iteration {stopped} on rank 1" in log
    )
    assert 'step ended with status 0 at iteration 30 of 30' in log
    assert megatron_checkpoints(job.run_dir / 'checkpoints')[-1].name == 'iter_0000030'
    argv0 = json.loads((tmp_path / 'Megatron-LM' / 'argv.1.json').read_text())
    assert argv0[argv0.index('--train-iters') + 1] == '30'


@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(SLURM), reason=f"no local Slurm: {SLURM}")
def test_a_failed_step_is_not_requeued(gpu_shaped_two_nodes, tmp_path):
    job = _local_job(tmp_path, gpu_shaped_two_nodes)
    (tmp_path / 'Megatron-LM' / 'fail').touch()
    jid = submit(job)
    s = wait(jid, timeout=200)
    log = Path(log_path(jid)).read_text(errors='replace')
    assert s.state == 'FAILED' and 'requeueing' not in log, (s, log)
    # both ranks exit 3; srun's --kill-on-bad-exit may SIGTERM the second before it does, and srun reports the highest
    # status of its tasks (3, or 143 for the killed one): either way the step failed and the job is not requeued
    assert re.search(r'step ended with status (3|143) at iteration 0 of 30', log), log


def test_a_missing_input_stops_the_job_in_one_line(tmp_path):
    job = _export(tmp_path, 'gpt3_126m_p4de')
    body = job.script[job.script.index('for need in'):job.script.index('srun ')]
    p = subprocess.run(['bash', '-c', body], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    first = p.stderr.splitlines()[0]
    assert first.startswith('nxpretrain: ') and 'pretrain_gpt.py is missing: git clone' in first, p.stderr
