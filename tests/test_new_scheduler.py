"""Adding a scheduler is one module, touching no file of the package: a package declares its launcher in the
`nxpretrain.launchers` entry-point group, a cluster profile names it (`scheduler`), and the three engines' jobs – a
native torchrun job, an NxD Training job and a Megatron-LM job – are written by it from their descriptions (argv, env,
per-node script, tasks, image and mounts) with no Slurm in them. Its scripts run: the Megatron-LM job's ranks each get
their number and read the flags file through the engine's own rank script."""
import dataclasses, json, os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]

# The whole scheduler: it runs a job's tasks as background processes of one bash script (one "node" here).
LAUNCHER = '''
import shlex
from pathlib import Path
from nxpretrain.launch.launcher import Launcher, register
from nxpretrain.jobs.description import export_lines, quote_argv, torchrun_argv


@register
class ShellLauncher(Launcher):
    scheduler, script_suffix = 'shell', 'job'

    def render(self, job):
        lines = ['#!/bin/bash', f"# shell job {job.name}", f"# image {job.image or '-'}",
                 f"# mounts {','.join(job.mounts) or '-'}", *export_lines(job.env),
                 f"cd {shlex.quote(str(job.out_dir))}",
                 'export MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 NNODES=1 NODE_RANK=0']
        if job.distributed:
            lines.append(quote_argv([*torchrun_argv(), '--standalone', '--nproc-per-node',
                                     str(job.devices_per_node), *job.argv]))
            return '\\n'.join(lines) + '\\n'
        for k in range(job.tasks_per_node if job.task_is_rank else 1):
            rank = f"RANK={k} LOCAL_RANK={k} WORLD_SIZE={job.tasks_per_node} " if job.task_is_rank else ''
            lines.append(f"{rank}{quote_argv(job.argv)} &")
        lines.append('rc=0; for p in $(jobs -p); do wait "$p" || rc=$?; done; exit "$rc"')
        return '\\n'.join(lines) + '\\n'

    def submit(self, job, after=()):
        job.script = job.script or self.render(job)
        job.script_path.write_text(job.script)
        return 'shell-1'

    def status(self, job_id): raise NotImplementedError
    def cancel(self, job_id, signal=None): pass
    def log(self, job_id, tail=20): return ''
'''

EXPORTS = '''
import dataclasses, json, sys
from pathlib import Path
from nxpretrain.clusters import PROFILES, profile
from nxpretrain.engines.base import get_engine
from nxpretrain.launch.job import export_jobs
from nxpretrain.recipes import get_recipe
out = Path(sys.argv[1])
for base in ('cpu', 'trn1.32xlarge', 'nd_h100_v5'):
    PROFILES[base + '-shell'] = dataclasses.replace(profile(base), name=base + '-shell', scheduler='shell',
                                                    devices_per_node=2 if base == 'nd_h100_v5' else
                                                    profile(base).devices_per_node)
runs = {'native': ('gpt3_tiny', 'cpu-shell'), 'nxdt': ('gpt3_23b', 'trn1.32xlarge-shell'),
        'megatron': ('gpt3_126m_p4de', 'nd_h100_v5-shell')}
report = {}
for engine, (name, prof) in runs.items():
    r = get_recipe(name, f"cluster.profile={prof}", 'cluster.nodes=1', f"engine={engine}",
                   *(['parallel.tp=1', 'parallel.pp=1', 'data.global_batch=2', 'data.micro_batch=1']
                     if engine == 'megatron' else []),
                   *(['parallel.tp=8', 'parallel.pp=1', 'data.global_batch=4', 'data.micro_batch=1']
                     if engine == 'nxdt' else []),
                   *(['data.global_batch=16'] if engine == 'native' else []))
    kw = {'data_root': str(out / 'data')} if engine != 'native' else {}
    if engine == 'megatron': kw['megatron_lm'] = str(out / 'Megatron-LM')
    jobs = export_jobs(get_engine(engine), r, out / engine, **kw)   # the engine describes, the plugin renders
    report[engine] = {k: {'scheduler': j.scheduler, 'script': str(j.script_path), 'text': j.script}
                      for k, j in jobs.items()}
print(json.dumps(report))
'''


@pytest.fixture
def plugin(tmp_path):
    "A folder on PYTHONPATH holding the launcher's module and the metadata of the package that declares it."
    site = tmp_path / 'site'
    (site / 'shell_launcher-1.0.dist-info').mkdir(parents=True)
    (site / 'shell_launcher.py').write_text(LAUNCHER)
    (site / 'shell_launcher-1.0.dist-info' / 'METADATA').write_text(
        'Metadata-Version: 2.1\nName: shell-launcher\nVersion: 1.0\n')
    (site / 'shell_launcher-1.0.dist-info' / 'entry_points.txt').write_text(
        '[nxpretrain.launchers]\nshell = shell_launcher:ShellLauncher\n')
    return {**os.environ, 'PYTHONPATH': os.pathsep.join([str(site), str(ROOT)]), 'NXPRETRAIN_HOME': str(tmp_path)}


def test_a_plugin_scheduler_writes_every_engines_job(plugin, tmp_path):
    p = subprocess.run([sys.executable, '-c', EXPORTS, str(tmp_path / 'out')], capture_output=True, text=True,
                       env=plugin, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(report) == {'native', 'nxdt', 'megatron'} and set(report['nxdt']) == {'compile', 'train'}
    for engine, jobs in report.items():
        for kind, j in jobs.items():
            text = j['text']
            assert j['scheduler'] == 'shell' and j['script'].endswith(f"{kind}.job"), (engine, kind)
            assert text.startswith('#!/bin/bash\n# shell job'), (engine, kind, text[:200])
            for slurm in ('#SBATCH', 'srun', 'scontrol'): assert slurm not in text, (engine, kind, slurm)
            assert subprocess.run(['bash', '-n', j['script']]).returncode == 0
    assert '--nproc-per-node 2' in report['native']['train']['text']          # the cpu profile's 2 devices
    assert 'export COMPILE=1' in report['nxdt']['compile']['text'] and 'train.sh' in report['nxdt']['train']['text']
    mega = report['megatron']['train']['text']
    assert '# image /shared/stage/pytorch+25.03+py3.sqsh' in mega and '/opt/microsoft:/opt/microsoft' in mega
    assert 'RANK=1 LOCAL_RANK=1 WORLD_SIZE=2' in mega and 'export CUDA_DEVICE_MAX_CONNECTIONS=1' in mega


def test_the_plugin_runs_the_megatron_ranks(plugin, tmp_path):
    "The Megatron-LM job's two ranks run through the plugin's script: each reads the flags file by its rank number."
    p = subprocess.run([sys.executable, '-c', EXPORTS, str(tmp_path / 'out')], capture_output=True, text=True,
                       env=plugin, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    script = Path(json.loads(p.stdout.strip().splitlines()[-1])['megatron']['train']['script'])
    mlm = tmp_path / 'out' / 'Megatron-LM'
    mlm.mkdir(parents=True)
    (mlm / 'pretrain_gpt.py').write_text(
        'import json, os, sys\nfrom pathlib import Path\n'
        "Path(__file__).with_name(f\"argv.{os.environ['RANK']}.json\").write_text(json.dumps(sys.argv[1:]))\n")
    run = subprocess.run(['bash', str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, 'PATH': f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert run.returncode == 0, run.stderr
    argv = [json.loads((mlm / f"argv.{k}.json").read_text()) for k in (0, 1)]
    assert argv[0] == argv[1] and argv[0][argv[0].index('--tensor-model-parallel-size') + 1] == '1'


def test_an_unknown_scheduler_names_the_group(plugin):
    code = "from nxpretrain.launch.launcher import get_launcher; get_launcher('pbs')"
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=plugin, timeout=120)
    assert 'nxpretrain.launchers' in p.stderr and 'shell' not in p.stderr.splitlines()[-1].split('known:')[0]
