"""Every Neuron/EFA environment variable, neuron_parallel_compile use and torchrun argument of our trn1 scripts, against
the script it comes from: NxD Training's examples/train.sh and train_setup.sh (commit 9169aa0), seed 4 (NxDT Llama),
seed 0 (neuronx-nemo-megatron GPT-3) and seed 3 (aws-neuron-samples run_dp_bert_large_hf_pretrain_bf16_s128.sh)."""
import os, re, subprocess
from pathlib import Path
import pytest, yaml
from nxpretrain.engines.nxdt.job import export_nxdt
from nxpretrain.config import from_yaml
from nxpretrain.launch.job import export_jobs, render_jobs

NXDT = 'aws-neuron/neuronx-distributed-training@9169aa0 examples/'
# (variable, value, source): the environment train.sh exports for NxD Training
NXDT_ENV = [
    ('FI_EFA_USE_DEVICE_RDMA', '1', NXDT + 'train_setup.sh:11'),
    ('FI_PROVIDER', 'efa', NXDT + 'train_setup.sh:12'),
    ('FI_EFA_FORK_SAFE', '1', NXDT + 'train_setup.sh:13'),
    ('NEMO_EXPM_VERSION', '${SLURM_JOB_ID:-0}', NXDT + 'train_setup.sh:26 ($SLURM_JOB_ID)'),
    ('XLA_DISABLE_FUNCTIONALIZATION', '0', NXDT + 'train_setup.sh:60'),
    ('HYDRA_FULL_ERROR', '1', NXDT + 'train_setup.sh:62'),
    ('MALLOC_ARENA_MAX', '128', NXDT + 'train_setup.sh:65'),
    ('CREATE_TB_LOGGER', 'True', NXDT + 'train_setup.sh:66'),
    ('CHECKPOINT_CALLBACK', 'True', NXDT + 'train_setup.sh:67'),
    ('NEURON_COMPILE_CACHE_URL', '<yaml compiler_cache_url>', NXDT + 'training_orchestrator.py:43 (from the YAML)'),
    ('COMPILE', '${COMPILE:-0}', NXDT + 'training_orchestrator.py:53 reads it; seed 4 exports COMPILE=1, then 0'),
]
# variables NxDT's orchestrator derives from the YAML (precision, compiler flags) and does not overwrite once set:
# exporting them in train.sh would override the YAML, so they must not appear
LEFT_TO_NXDT = [('XLA_USE_BF16', NXDT + 'training_orchestrator.py:104-131'),
                ('XLA_DOWNCAST_BF16', NXDT + 'training_orchestrator.py:104-131'),
                ('NEURON_RT_STOCHASTIC_ROUNDING_EN', NXDT + 'training_orchestrator.py:104-131'),
                ('NEURON_CC_FLAGS', NXDT + 'training_orchestrator.py:44 (appends compiler_flags)'),
                ('NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS', NXDT + 'training_orchestrator.py:41'),
                ('BUCKET_CAP_MB', NXDT + 'training_orchestrator.py:42'),
                ('NEURON_RT_EXEC_TIMEOUT', NXDT + 'training_orchestrator.py:45'),
                ('NEURON_FUSE_SOFTMAX', NXDT + 'training_orchestrator.py:35-36')]
# (torchrun argument, value on node 3 of 16, source)
TORCHRUN = [('--nproc_per_node', '32', NXDT + "train.sh:10-11,16 (the YAML's trainer.devices)"),
            ('--nnodes', '16', NXDT + 'train.sh:16 ($NTASKS = $SLURM_NTASKS, one task per node: = $SLURM_NNODES)'),
            ('--node_rank', '3', NXDT + 'train.sh:16 ($NODEID = $SLURM_NODEID)'),
            ('--master_addr', 'trn-node-1', NXDT + 'train_setup.sh:63 (first host of the allocation)'),
            ('--master_port', '41000', NXDT + 'train_setup.sh:64'),
            ('--config-path', '<export>/conf', NXDT + 'train.sh:25'),
            ('--config-name', '<recipe>_config', NXDT + 'train.sh:26')]
SBATCH = [('--exclusive', None, 'seed 4: sbatch --exclusive'), ('--nodes', '16', 'seed 4: --nodes 16'),
          ('--cpus-per-task', '128', 'seed 4: --cpus-per-task 128')]


def exports_of(script: str) -> dict:
    return dict(re.findall(r'^export ([A-Za-z_][A-Za-z0-9_]*)=(.*)$', script, re.M))


def _export(d: Path, name: str):
    "(folder, jobs, YAML as a dict) of recipe `name` exported under `d`, its data folder in place."
    jobs = render_jobs(export_nxdt(name, d / 'run', data_root=d / 'data'))
    cfg = yaml.safe_load(jobs['train'].recipe_path.read_text())
    Path(cfg['data']['train_dir']).mkdir(parents=True)
    return d, jobs, cfg


@pytest.fixture(scope='module')
def run(tmp_path_factory): return _export(tmp_path_factory.mktemp('trn1'), 'llama3_70b')


def _node3(d: Path, compile_: str) -> list[str]:
    "train.sh as node 3 of a 16-node Slurm job runs it, with stand-ins for scontrol, torchrun, neuron_parallel_compile."
    return _run_node(d, compile_)[0]


def _run_node(d: Path, compile_: str, node: str = '3', nodes: str = '16') -> tuple[list[str], str]:
    "(the commands train.sh ran, its output) as node `node` of a Slurm job runs it, with the Neuron tools stubbed."
    bin_ = d / 'bin'
    bin_.mkdir(exist_ok=True)
    (bin_ / 'examples').mkdir(exist_ok=True)
    tools = {'scontrol': 'printf "trn-node-1\\ntrn-node-2\\n"', 'torchrun': 'echo "torchrun $*" >> "$ARGV_LOG"',
             'neuron_parallel_compile': 'echo "neuron_parallel_compile" >> "$ARGV_LOG"; exec "$@"'}
    for name, body in tools.items():
        (bin_ / name).write_text(f'#!/bin/sh\n{body}\n')
        (bin_ / name).chmod(0o755)
    log = d / f'argv{compile_}'
    log.unlink(missing_ok=True)
    env = {**os.environ, 'PATH': f"{bin_}:{os.environ['PATH']}", 'ARGV_LOG': str(log),
           'NXDT_EXAMPLES': str(bin_ / 'examples'), 'COMPILE': compile_, 'SLURM_JOB_NODELIST': f'trn-node-[1-{nodes}]',
           'SLURM_NNODES': nodes, 'SLURM_NODEID': node, 'SLURM_JOB_ID': '77'}
    done = subprocess.run([str(d / 'run/train.sh')], env=env, check=True, capture_output=True, text=True)
    return log.read_text().splitlines(), done.stdout


def test_train_sh_environment_is_nxdts(run):
    d, jobs, cfg = run
    exported = exports_of((d / 'run/train.sh').read_text())
    want = {k: v for k, v, _ in NXDT_ENV}
    want['NEURON_COMPILE_CACHE_URL'] = '${NEURON_COMPILE_CACHE_URL:-' + cfg['compiler_cache_url'] + '}'
    assert exported == want, {
        k: (exported.get(k), want.get(k)) for k in set(exported) | set(want) if exported.get(k) != want.get(k)
    }
    for var, source in LEFT_TO_NXDT: assert var not in exported, (var, source)


@pytest.mark.parametrize('arg, value, source', TORCHRUN)
def test_torchrun_arguments_are_nxdts(run, arg, value, source):
    d, jobs, cfg = run
    line = next(l for l in _node3(d, '0') if l.startswith('torchrun'))
    argv = line.split()
    value = value.replace('<export>', str(d / 'run')).replace('<recipe>', 'llama3_70b')
    assert argv[argv.index(arg) + 1] == value, (arg, source, line)
    assert argv[argv.index('--nproc_per_node') + 1] == str(cfg['trainer']['devices'])


def test_neuron_parallel_compile_only_in_the_compile_job(run):
    d, jobs, cfg = run
    assert _node3(d, '1')[0] == 'neuron_parallel_compile'      # NXDT train.sh:19-22
    assert not any('neuron_parallel_compile' in l for l in _node3(d, '0'))
    assert 'export COMPILE=1' in jobs['compile'].script and 'export COMPILE=0' in jobs['train'].script


@pytest.mark.parametrize('flag, value, source', SBATCH)
def test_sbatch_lines_are_seed4s(run, flag, value, source):
    d, jobs, cfg = run
    for job in jobs.values():
        line = f"#SBATCH {flag}" + (f"={value}" if value else '')
        assert line in job.script.splitlines(), (flag, source)
    assert 'srun ' in jobs['train'].script


SEED3 = 'seed 3: aws-neuron-samples torch-neuronx/training/dp_bert_hf_pretrain/'
# (variable, value, source): the environment run_xla.sh exports for BERT on the XLA device
SEED3_ENV = [
    ('NEURON_RT_EXEC_TIMEOUT', '600', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:7'),
    ('NEURON_RT_STOCHASTIC_ROUNDING_SEED', '0', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:8'),
    (
        'TF_GRPC_DEFAULT_OPTIONS',
        'grpc.keepalive_time_ms=60000,grpc.keepalive_timeout_ms=14400000,grpc.http2.max_pings_without_data=0,'
        'grpc.http2.min_ping_interval_without_data_ms=600000',
        SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:9',
    ),
    ('FI_EFA_USE_DEVICE_RDMA', '1', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:67'),
    ('FI_PROVIDER', 'efa', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:68'),
    ('FI_EFA_FORK_SAFE', '1', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:69'),
    ('BUCKET_CAP_MB', '512', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:70'),
    ('XLA_TRANSFER_SEED_ASYNC', '1', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:71'),
    ('NEURON_CC_FLAGS', '"${NEURON_CC_FLAGS:-} --model-type=transformer --retry_failed_compilation"',
     SEED3 + 'dp_bert_large_hf_pretrain_hdf5.py:80 (appends)'),
    ('NEURON_COMPILE_CACHE_URL', '<shared cache>',
     SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:81 (used when set)'),
]
SEED3_TORCHRUN = [
    ('--nproc_per_node', '32', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:56,77 (32 NeuronCores)'),
    ('--nnodes', '16', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:72,77 ($SLURM_NTASKS, one task per node: '
                              '= $SLURM_NNODES)'),
    ('--node_rank', '3', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:73,77 ($SLURM_NODEID)'),
    ('--master_addr', 'trn-node-1', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:74 (first host of the '
                                            'allocation)'),
    ('--master_port', '2022', SEED3 + 'run_dp_bert_large_hf_pretrain_bf16_s128.sh:75'),
]


@pytest.fixture(scope='module')
def bert(tmp_path_factory):
    from nxpretrain.engines.base import get_engine
    from nxpretrain.recipes import get_recipe
    d = tmp_path_factory.mktemp('bert')
    return d, export_jobs(get_engine('native'), get_recipe('bert_large'), d / 'run', cache_url=str(d / 'cache'))


def test_bert_run_script_environment_is_seed3s(bert):
    d, jobs = bert
    exported = exports_of((d / 'run/run_xla.sh').read_text())
    want = {k: v for k, v, _ in SEED3_ENV}
    want['NEURON_COMPILE_CACHE_URL'] = '${NEURON_COMPILE_CACHE_URL:-' + str(d / 'cache') + '}'
    assert exported == want, {
        k: (exported.get(k), want.get(k)) for k in set(exported) | set(want) if exported.get(k) != want.get(k)
    }
    assert not (d / 'run/conf').exists()                       # no NxD Training config for BERT


def test_bert_torchrun_and_compile_are_seed3s(bert):
    d, jobs = bert
    bin_ = d / 'bin'
    bin_.mkdir(exist_ok=True)
    for name, body in {'scontrol': 'printf "trn-node-1\\ntrn-node-2\\n"'}.items():
        (bin_ / name).write_text(f'#!/bin/sh\n{body}\n')
        (bin_ / name).chmod(0o755)
    script = (d / 'run/run_xla.sh').read_text()
    python = script.split(' -m torch.distributed.run')[0].rsplit('\n', 1)[1]
    (d / 'run/run_xla.sh').write_text(script.replace(python + ' -m torch.distributed.run', 'echo torchrun'))
    env = {**os.environ, 'PATH': f"{bin_}:{os.environ['PATH']}", 'SLURM_JOB_NODELIST': 'trn-node-[1-16]',
           'SLURM_NTASKS': '16', 'SLURM_NNODES': '16', 'SLURM_NODEID': '3'}
    out = subprocess.run(
        [str(d / 'run/run_xla.sh')], env=env, check=True, capture_output=True, text=True
    ).stdout.split()
    for arg, value, source in SEED3_TORCHRUN: assert out[out.index(arg) + 1] == value, (arg, source, out)
    assert out[out.index('-m') + 1:out.index('-m') + 3] == ['nxpretrain.train.entry', '--recipe']
    assert from_yaml(d / 'run/recipe.yaml').trainer.device == 'xla' and '--max-steps' not in out
    # neuron_parallel_compile sets NEURON_EXTRACT_GRAPHS_ONLY: the seed's 5 traced steps
    traced = subprocess.run([str(d / 'run/run_xla.sh')], env={**env, 'NEURON_EXTRACT_GRAPHS_ONLY': '1'}, check=True,
                            capture_output=True, text=True).stdout.split()
    assert traced[traced.index('--max-steps') + 1] == '5'
    # ... with placeholder values: in a folder of their own, resuming and saving nothing, which the training job
    # (runs/, auto-resume) would otherwise resume from
    from nxpretrain.recipes import get_recipe
    from nxpretrain.train.entry import parser
    entry = lambda argv: parser().parse_intermixed_args(argv[argv.index('nxpretrain.train.entry') + 1:])
    a, t = entry(traced), entry(out)
    assert (a.max_steps, a.out_dir, t.max_steps, t.out_dir) == (5, str(d / 'run/runs/compile'), None,
                                                                str(d / 'run/runs')), (traced, out)
    tr = get_recipe(a.recipe, *a.overrides).trainer
    assert (tr.resume, tr.save_every, tr.save_every_minutes, t.overrides) == (False, 0, 0, [])
    # seed 3: sbatch --exclusive --nodes=16 --wrap "srun neuron_parallel_compile ./run...sh", then the same without it
    # (with the step options every job's srun has: one failed node ends the step)
    step = f"srun --kill-on-bad-exit=1 --wait=60 neuron_parallel_compile {d / 'run/run_xla.sh'}"
    assert step in jobs['compile'].script
    assert 'neuron_parallel_compile' not in jobs['train'].script and '#SBATCH --exclusive' in jobs['train'].script
    assert '#SBATCH --nodes=16' in jobs['compile'].script


# seed 4 on trn2 (seed:150-152, 177-182, 242-247; NxDT examples/conf/hf_llama3_70B_trn2_config.yaml:6-8): 8 nodes of
# 64 ranks at LNC 2, the same train.sh and train_setup.sh as trn1 (NxDT sets no LNC variable or flag: trn2.md §4)
TRN2_TORCHRUN = [('--nproc_per_node', '64', NXDT + "train.sh:10-11,16 (trainer.devices: 64)"),
                 ('--nnodes', '8', 'seed 4: sbatch --nodes 8 on trn2'), ('--node_rank', '3', NXDT + 'train.sh:16')]
# our one addition: the runtime's LNC said out loud, equal to trainer.lnc (2 is the trn2 runtime's default anyway;
# the -lnc1 profile needs 1 there, as compiler and runtime LNC must match: Neuron docs, Logical NeuronCore config)
TRN2_ENV = [('NEURON_LOGICAL_NC_CONFIG', '2', 'nxpretrain: trainer.lnc of the trn2.48xlarge profile')]


@pytest.fixture(scope='module')
def trn2(tmp_path_factory): return _export(tmp_path_factory.mktemp('trn2'), 'llama3_70b_trn2')


def test_trn2_scripts_are_seed4s(trn2):
    d, jobs, cfg = trn2
    exported = exports_of((d / 'run/train.sh').read_text())
    want = {**{k: v for k, v, _ in NXDT_ENV}, **{k: v for k, v, _ in TRN2_ENV}}
    want['NEURON_COMPILE_CACHE_URL'] = '${NEURON_COMPILE_CACHE_URL:-' + cfg['compiler_cache_url'] + '}'
    assert exported == want
    for var, source in LEFT_TO_NXDT: assert var not in exported, (var, source)
    argv = next(l for l in _run_node(d, '0', nodes='8')[0] if l.startswith('torchrun')).split()
    for arg, value, source in TRN2_TORCHRUN: assert argv[argv.index(arg) + 1] == value, (arg, source, argv)
    assert _run_node(d, '1', nodes='8')[0][0] == 'neuron_parallel_compile'      # as on trn1: NXDT train.sh:19-22
    for job in jobs.values():
        for line in ('#SBATCH --nodes=8', '#SBATCH --cpus-per-task=128', '#SBATCH --exclusive'):
            assert line in job.script.splitlines(), (line, 'seed 4: sbatch --exclusive --nodes 8 --cpus-per-task 128')


def _tags(ckpt: Path, steps_done: dict) -> None:
    "Checkpoint tag folders of NxD's form, oldest first; a step mapped to True got its `done` marker."
    for step, done in steps_done.items():
        tag = ckpt / f"llama3_70b--step={step}-consumed_samples={step * 1024}.0.ckpt"
        (tag / 'model').mkdir(parents=True)
        (tag / 'checkpoint').write_text('1')
        if done: (tag / 'done').write_text('1')


def test_train_sh_removes_checkpoints_nxd_never_finished(run):
    """NxDT resumes from the newest *.ckpt folder by time, `done` or not (NxDT utils/exp_manager.py:370-385, NxD
    trainer/checkpoint.py:190-195 writes `done` last): before a training run node 0 removes the unfinished ones, says
    so in one line, and the engine counts and requeues on whole ones only."""
    from nxpretrain.engines.base import get_engine
    from nxpretrain.recipes import get_recipe
    d, jobs, cfg = run
    engine, log_dir = get_engine('nxdt'), Path(cfg['exp_manager']['explicit_log_dir'])
    tag = lambda step: f"llama3_70b--step={step}-consumed_samples={step * 1024}.0.ckpt"
    _tags(log_dir / 'checkpoints', {10: True, 20: False, 30: False})
    assert 'removed' not in _run_node(d, '1', node='0')[1]      # a compile run saves nothing and removes nothing
    assert 'removed' not in _run_node(d, '0', node='3')[1]      # only the first node removes
    assert engine.checkpoints(log_dir) == [log_dir / 'checkpoints' / tag(10)]      # the engine counts whole ones only
    said = [l for l in _run_node(d, '0', node='0')[1].splitlines() if 'removed' in l]
    assert said == [f"nxpretrain: removed 2 checkpoint(s) NxD never marked done: {tag(20)} {tag(30)}"]
    assert sorted(p.name for p in (log_dir / 'checkpoints').iterdir()) == [tag(10)]
    assert engine.requeue(log_dir, get_recipe('llama3_70b'))                       # step 10 of 30000: go on
    assert not engine.requeue(log_dir, get_recipe('llama3_70b', 'trainer.max_steps=10'))
