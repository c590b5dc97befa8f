"""The job around the framework, as a site needs it: site options (account, QoS, excluded nodes, free-form sbatch and
srun options) from the CLI, a recipe or a profile, shell-quoted into the job; `--kill-on-bad-exit=1 --wait=60` on the
srun that starts the ranks; every path of a cluster job under the stage folder (`NXPRETRAIN_STAGE`), the data where
`NXPRETRAIN_DATA` says; and on a real two-node Slurm, a job that excludes one node runs on the other."""
import dataclasses, os, re, subprocess, sys
from pathlib import Path
import pytest
from nxpretrain.clusters import PROFILES, profile
from nxpretrain.config import ClusterConfig
from nxpretrain.testing.local_slurm import LocalSlurm, why_no_slurm

ROOT = Path(__file__).resolve().parents[1]


def cli(tmp_path, *argv, **env):
    "`nxpretrain ARGV` in `tmp_path`, with the tests' own home; (exit status, output)."
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'NXPRETRAIN_HOME': str(tmp_path / 'home'), **env}
    for k in ('NXPRETRAIN_STAGE', 'NXPRETRAIN_DATA'):
        if k not in env or env[k] is None: env.pop(k, None)
    p = subprocess.run([sys.executable, '-c', f"from nxpretrain.cli import main; main({list(argv)!r})"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300)
    return p.returncode, p.stdout + p.stderr


def test_site_options_from_the_cli_reach_the_job(tmp_path):
    rc, out = cli(tmp_path, 'train', 'gpt3_175b_gpu', 'cluster.account=a1', 'cluster.qos=q1', 'cluster.exclude=n9',
                  "cluster.reservation=maint; rm -rf /", 'cluster.srun=[--cpu-bind=none]', '--dry-run',
                  NXPRETRAIN_STAGE=None, NXPRETRAIN_DATA=None)
    assert rc == 0, out
    script = (tmp_path / 'runs/jobs/gpt3_175b_gpu/train.sbatch').read_text()
    lines = script.splitlines()
    for want in ('#SBATCH --account=a1', '#SBATCH --qos=q1', '#SBATCH --exclude=n9',
                 "#SBATCH --reservation='maint; rm -rf /'"):
        assert want in lines, want
    srun = next(l for l in lines if l.startswith('srun '))
    assert srun.startswith('srun --kill-on-bad-exit=1 --wait=60 --cpu-bind=none '), srun
    # sbatch reads an #SBATCH line's quotes as the shell does: the value is one word
    import shlex
    assert shlex.split("--reservation='maint; rm -rf /'") == ['--reservation=maint; rm -rf /']


def test_a_profiles_site_options_and_the_recipes_add_up(tmp_path, monkeypatch):
    from nxpretrain.launch.job import make_job, make_array_job
    monkeypatch.setitem(PROFILES, 'site', dataclasses.replace(profile('cpu'), name='site', account='lab', qos='low',
                                                              sbatch=['--mail-type=END']))
    job = make_job('gpt3_tiny', 'site', tmp_path / 'job', ['cluster.qos=high', 'data.global_batch=16'])
    lines = job.script.splitlines()
    assert {'#SBATCH --account=lab', '#SBATCH --qos=high', '#SBATCH --mail-type=END'} <= set(lines), lines
    assert '#SBATCH --qos=low' not in lines
    assert any(l.startswith('srun --label --wait=60 ') for l in lines)      # the trainer's step: see 56_slurm
    data = make_array_job('demo', ['true'], tmp_path / 'data', 2, ClusterConfig(profile='site', exclude='n3'))
    assert {'#SBATCH --account=lab', '#SBATCH --exclude=n3'} <= set(data.script.splitlines())
    rc, out = cli(tmp_path, 'train', 'gpt3_175b_gpu', 'cluster.sbatch=[mail]', '--dry-run')
    assert rc != 0 and "cluster.sbatch: 'mail' is not an option" in out, out


def _paths(text: str) -> set[str]:
    "Absolute paths in `text` (not the // of an address)."
    return {m.rstrip("'\":,;)") for m in re.findall(r"(?<![\w.$/:])/(?!/)[A-Za-z0-9_./+%@-]+", text)}


def test_every_path_of_the_job_is_under_the_stage(tmp_path):
    stage = tmp_path / 'fsx' / 'stage'
    rc, out = cli(tmp_path, 'train', 'gpt3_175b_gpu', '--dry-run', NXPRETRAIN_STAGE=str(stage), NXPRETRAIN_DATA=None)
    assert rc == 0, out
    job = stage / 'jobs' / 'gpt3_175b_gpu'
    texts = [(job / f).read_text() for f in ('train.sbatch', 'rank.sh', 'megatron.args')]
    seed_mounts = ('/opt/microsoft', '/var/tmp')              # seed 2's own: its topology file, its scratch
    outside = {p for t in texts for p in _paths(t) if not p.startswith(str(stage)) and not p.startswith(seed_mounts)}
    assert outside <= {'/bin/bash', '/usr/bin/env', '/dev/null'}, outside     # the shebangs, the shell's
    script = texts[0]
    assert f"--container-image={stage}/pytorch+25.03+py3.sqsh" in script
    assert f"--container-mounts={stage}:{stage},/opt/microsoft:/opt/microsoft,/var/tmp:/var/tmp " in script
    assert f"--data-path 1.0 {stage}/data/" in texts[2] and f"--save {job}/gpt3_175b_gpu/checkpoints" in texts[2]
    assert not (tmp_path / 'runs').exists()
    # --stage wins over the environment
    rc, out = cli(tmp_path, 'train', 'gpt3_175b_gpu', '--dry-run', '--stage', str(tmp_path / 'lustre'),
                  NXPRETRAIN_STAGE=str(stage))
    assert rc == 0 and (tmp_path / 'lustre/jobs/gpt3_175b_gpu/train.sbatch').exists(), out


def test_train_reads_the_data_where_nxpretrain_data_says(tmp_path):
    rc, out = cli(tmp_path, 'train', 'gpt3_175b_gpu', '--dry-run', NXPRETRAIN_DATA=str(tmp_path / 'data'),
                  NXPRETRAIN_STAGE=None)
    assert rc == 0, out
    args = (tmp_path / 'runs/jobs/gpt3_175b_gpu/megatron.args').read_text()
    assert f"--data-path 1.0 {tmp_path}/data/" in args and f"--vocab-file {tmp_path}/data/gpt2/vocab.json" in args


def test_setup_and_compile_judge_and_write_under_the_stage(tmp_path):
    "`setup --stage` looks for the job's image, checkout and data under it; `compile` writes its job and cache there."
    stage = tmp_path / 'lustre'
    rc, out = cli(tmp_path, 'setup', 'gpt3_175b_gpu', '--stage', str(stage), '--json', NXPRETRAIN_STAGE=None,
                  NXPRETRAIN_DATA=None)
    import json
    paths = [s['path'] for s in json.loads(out)['steps']]
    assert rc == 0 and paths and all(p.startswith(str(stage)) for p in paths), out
    assert f"{stage}/pytorch+25.03+py3.sqsh" in paths and not (tmp_path / 'runs').exists(), paths
    rc, out = cli(tmp_path, 'compile', 'llama3_70b', NXPRETRAIN_STAGE=str(stage), NXPRETRAIN_DATA=None)
    assert (stage / 'compile/train.sh').exists() and (stage / 'neuron-cache').is_dir(), out
    assert f"NEURON_COMPILE_CACHE_URL={stage}/neuron-cache" in (stage / 'compile/train.sh').read_text() + out


def test_the_stage_notebooks_take_a_stage(tmp_path):
    "papermill's `-p stage X` puts 04_train's job under X (03_compile's parameter goes the same way: compile_stage)."
    for nb in ('03_compile', '04_train'):
        p = subprocess.run([sys.executable, '-m', 'papermill', '--help-notebook', str(ROOT / 'nbs' / f'{nb}.ipynb')],
                           capture_output=True, text=True, timeout=120)
        assert "stage: str (default '')" in p.stdout, p.stdout + p.stderr
    stage = tmp_path / 'fsx'
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'NXPRETRAIN_HOME': str(tmp_path / 'home')}
    env.pop('NXPRETRAIN_STAGE', None)
    env.pop('NXPRETRAIN_DATA', None)
    p = subprocess.run([sys.executable, '-m', 'papermill', str(ROOT / 'nbs/04_train.ipynb'), str(tmp_path / 'o.ipynb'),
                        '-p', 'model', 'gpt3_175b_gpu', '-p', 'stage', str(stage), '-k', 'python3'], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    args = (stage / 'jobs/gpt3_175b_gpu/megatron.args').read_text()
    assert f"--data-path 1.0 {stage}/data/" in args and f"--save {stage}/jobs/gpt3_175b_gpu/" in args, args


SLURM = why_no_slurm()


@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(SLURM), reason=f"no local Slurm: {SLURM}")
def test_an_excluded_node_is_not_used(tmp_path):
    from nxpretrain.launch.job import make_array_job
    from nxpretrain.launch.launcher import submit, wait
    with LocalSlurm('i33site', nodes=2, port=6871):
        logs = {}
        for excluded in ('node1', 'node2'):
            job = make_array_job('where', ['bash', '-c', 'echo "ran on $SLURMD_NODENAME"'], tmp_path / excluded, 1,
                                 ClusterConfig(profile='ci', exclude=excluded))
            assert f"#SBATCH --exclude={excluded}" in job.script
            s = wait(submit(job), timeout=120)
            assert s.state == 'COMPLETED', s
            logs[excluded] = ''.join(p.read_text() for p in (tmp_path / excluded / 'logs').iterdir())
    assert 'ran on node2' in logs['node1'] and 'ran on node1' in logs['node2'], logs
