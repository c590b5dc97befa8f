"""`setup RECIPE` judged on the job's partition, `setup RECIPE --prepare` on a real local Slurm, and the refusal of
`train --cluster` before sbatch. The GPU node's tools stand in on PATH (what srun and sbatch pass to the tasks):
`nvidia-smi` lists one GPU, `enroot import` writes its source into the image file, `curl` writes its URL into the
file it names; a local git repository with two commits stands in for Megatron-LM, pinned at the first."""
import contextlib, dataclasses, io, json, os, subprocess, time
from pathlib import Path
import pytest
from nxpretrain.clusters import PROFILES, profile
from nxpretrain.cli import main
from nxpretrain.engines.megatron import job as megatron_job
from nxpretrain.errors import LaunchError
from nxpretrain.launch import provision as prep
from nxpretrain.stages import load_recipe, train_stage
from nxpretrain.testing.local_slurm import LocalSlurm, why_no_slurm

SLURM = why_no_slurm()
CLUSTER = 'gpu-setup-ci:debug'
STAND_INS = {
    'nvidia-smi': 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-stand-in)"\n',
    'enroot': '[ "$1" = import ] && [ "$2" = -o ] && [ ! -e "$3" ] || { echo "enroot stand-in: $*" >&2; exit 1; }\n'
              'echo "$4" > "$3"\n',
    'curl': 'while [ $# -gt 1 ]; do [ "$1" = -o ] && out=$2; shift; done\necho "$1" > "$out"\n',
}


def _git(*args, cwd=None) -> str:
    return subprocess.run(['git', *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def gpu_node(tmp_path, monkeypatch):
    "A one-node local Slurm whose node looks like a one-GPU node of seed 2's profile, and a stand-in Megatron-LM."
    bin_ = tmp_path / 'bin'
    bin_.mkdir()
    for name, body in STAND_INS.items():
        (bin_ / name).write_text('#!/bin/bash\n' + body)
        (bin_ / name).chmod(0o755)
    monkeypatch.setenv('PATH', f"{bin_}:{os.environ['PATH']}")          # sbatch and srun pass it to the tasks
    src = tmp_path / 'megatron-src'
    src.mkdir()
    (src / 'pretrain_gpt.py').write_text('# stand-in\n')
    env = ['-c', 'user.name=t', '-c', 'user.email=t@t']
    _git('init', '-q', '-b', 'main', cwd=src)
    _git(*env, 'add', '.', cwd=src)
    _git(*env, 'commit', '-q', '-m', 'pinned', cwd=src)
    pinned = _git('rev-parse', 'HEAD', cwd=src)
    (src / 'pretrain_gpt.py').write_text('# stand-in, a later commit\n')
    _git(*env, 'commit', '-q', '-am', 'later', cwd=src)
    _git('clone', '-q', '--bare', str(src), str(tmp_path / 'Megatron-LM.git'))
    repo = {'repo': str(tmp_path / 'Megatron-LM.git'), 'commit': pinned, 'script': 'pretrain_gpt.py'}
    monkeypatch.setattr(megatron_job, 'megatron_checkout', lambda: repo)      # the engine's own checkout facts
    stage = tmp_path / 'stage'
    prof = dataclasses.replace(profile('nd_h100_v5'), name='gpu-setup-ci', devices_per_node=1, cpus_per_node=1,
                               gres='', container=str(stage / 'pytorch+25.03+py3.sqsh'), container_mounts='', env={},
                               stage='')   # no site stage: the job lives under runs/ here (test_job_site_stage's)
    monkeypatch.setitem(PROFILES, prof.name, prof)
    monkeypatch.setenv('NXPRETRAIN_HOME', str(tmp_path / 'home'))
    monkeypatch.chdir(tmp_path)                    # the job reads runs/data here, as train writes it
    corpus = tmp_path / 'corpus' / 'tiny_text_document'
    corpus.parent.mkdir()
    for suffix in ('.bin', '.idx'): corpus.with_suffix(suffix).touch()   # the data stage's part
    overrides = ['cluster.nodes=1', 'parallel.tp=1', 'parallel.pp=1', 'parallel.sequence_parallel=false',
                 f'data.corpus={corpus}', 'data.tokenizer=gpt2']
    with LocalSlurm('setup1', nodes=1, port=6961): yield dict(prof=prof, overrides=overrides, repo=repo, stage=stage)


def _run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: rc = main(list(argv)) or 0
        except SystemExit as e: rc = e.code
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.timeout(600)
@pytest.mark.skipif(bool(SLURM), reason=f"no local Slurm: {SLURM}")
def test_train_refuses_then_prepare_makes_each_step_as_a_job_and_setup_says_ready(gpu_node):
    o = gpu_node['overrides']
    r = load_recipe('gpt3_175b_gpu', o)
    check = prep.setup_check(r, CLUSTER)
    assert check.slurm and check.judged.endswith('of partition debug (srun)'), check.judged   # not the head node
    assert [g.split(':')[0] for g in check.missing] == ['image', 'framework', 'tokenizer'], check.missing
    # train --cluster: the same check before sbatch, one line per missing thing with its command; nothing submitted
    rc, out, err = _run('train', 'gpt3_175b_gpu', *o, '--cluster', CLUSTER)
    lines = err.strip().splitlines()
    assert rc == 2 and lines[0].startswith('nxpretrain train: gpt3_175b_gpu is not ready on node '), err
    assert f"nxpretrain setup gpt3_175b_gpu --cluster {CLUSTER} --prepare" in lines[0]
    assert [l.split(':')[0].strip() for l in lines[1:]] == ['image', 'framework', 'tokenizer'], lines
    image = gpu_node['prof'].container
    assert lines[1] == (f"  image: {image} is missing: mkdir -p {gpu_node['stage']} && enroot import -o {image} "
                        "'docker://nvcr.io#nvidia/pytorch:25.03-py3'")
    assert all(' is missing' in l and ': ' in l for l in lines[1:])
    assert not Path('runs/jobs/gpt3_175b_gpu/jobs.jsonl').exists()          # no record: sbatch never ran
    # setup --prepare: each step a Slurm job on the partition, then ready
    rc, out, err = _run('setup', 'gpt3_175b_gpu', *o, '--cluster', CLUSTER, '--prepare')
    said = [l for l in out.splitlines() if l.startswith('set-up: ')]
    assert rc == 0 and [s.split(' as Slurm job ')[0] for s in said] == ['set-up: image', 'set-up: framework',
                                                                         'set-up: tokenizer'], out + err
    assert all(s.endswith(' on debug') for s in said) and 'ready      nothing is missing' in out, out
    kinds = [json.loads(l)['kind'] for l in Path('runs/jobs/gpt3_175b_gpu/setup/jobs.jsonl').read_text().splitlines()]
    assert kinds == ['setup-image', 'setup-framework', 'setup-tokenizer']
    assert Path(image).read_text() == 'docker://nvcr.io#nvidia/pytorch:25.03-py3\n'     # what enroot imported
    mlm = Path('runs/jobs/gpt3_175b_gpu/Megatron-LM').absolute()
    assert _git('rev-parse', 'HEAD', cwd=mlm) == gpu_node['repo']['commit']              # the pinned commit
    assert Path('runs/data/gpt2/merges.txt').read_text().startswith('https://huggingface.co/gpt2/')
    rc, out, err = _run('setup', 'gpt3_175b_gpu', *o, '--cluster', CLUSTER)
    assert rc == 0 and 'ready      nothing is missing' in out and 'of partition debug (srun)' in out, out + err
    # a checkout at another commit is not the framework the job pins
    _git('checkout', '-q', 'main', cwd=mlm)
    again = prep.setup_check(r, CLUSTER)
    assert [g.split(':')[0] for g in again.missing] == ['framework'], again.missing


def test_without_slurm_setup_judges_the_head_node_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv('SLURM_CONF', str(tmp_path / 'none.conf'))
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run('setup', 'gpt3_175b_gpu', '--json')
    d = json.loads(out)
    assert rc == 0 and d['judged'].startswith('the head node ') and 'no Slurm answers' in d['judged']
    assert not d['ready'] and [s['what'] for s in d['steps']] == ['image', 'framework', 'tokenizer', 'corpus']
    rc, out, err = _run('setup', 'gpt3_tiny')                 # it trains on this machine: this machine is judged
    assert rc == 0 and out.splitlines()[-1].split() == ['ready', 'nothing', 'is', 'missing', 'here'], out


def test_a_step_that_fails_names_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv('SLURM_CONF', str(tmp_path / 'none.conf'))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(megatron_job, 'megatron_checkout', lambda: {'repo': str(tmp_path / 'nothing.git'),
                                                                    'commit': '0' * 40, 'script': 'pretrain_gpt.py'})
    r = load_recipe('gpt3_175b_gpu', ['data.tokenizer=demo', 'data.corpus=demo'])
    r = dataclasses.replace(r, cluster=dataclasses.replace(r.cluster, profile='p5.48xlarge'))   # no container
    with pytest.raises(LaunchError, match=r'framework: .* failed here \(exit \d+\); log: .*setup-framework.log'):
        prep.prepare(r, None, show=lambda *_: None)


@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(SLURM), reason=f"no local Slurm: {SLURM}")
def test_a_busy_partition_is_judged_from_here_and_says_so(gpu_node):
    "No node free within the wait: the files are judged here, the devices not, and the answer says so."
    r = load_recipe('gpt3_175b_gpu', gpu_node['overrides'])
    busy = subprocess.run(['sbatch', '--parsable', '--exclusive', '--partition=debug', '--output=/dev/null',
                           '--wrap=sleep 120'], capture_output=True, text=True, check=True).stdout.strip()
    try:
        t0 = time.time()
        while subprocess.run(['squeue', '-h', '-j', busy, '-o', '%T'], capture_output=True, text=True).stdout.strip() \
                != 'RUNNING':
            assert time.time() - t0 < 60, 'the job that keeps the node busy never started'
            time.sleep(0.2)
        steps = prep.setup_steps(*prep.resolve_cluster(r, CLUSTER))
        probe = prep.run_probe(steps, 'debug', wait_s=1)
        assert probe.slurm and not probe.devices and probe.where.startswith('the head node '), probe
        assert 'no node of partition debug answered within 1 s' in probe.where, probe.where
        gaps = prep.probe_gaps(gpu_node['prof'], probe, steps)
        assert [g.split(':')[0] for g in gaps] == ['image', 'framework', 'tokenizer'], gaps   # no device line
    finally:
        subprocess.run(['scancel', busy], check=False)
