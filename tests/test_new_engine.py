"""Adding an engine is one module, touching no file of the package: a package declares it in the `nxpretrain.engines`
entry-point group, and then a recipe names it (`engine=stub`), the plan uses its calibration and memory, the train
stage runs its job on this machine, the job index records it, and `nxpretrain watch` reads its log through it."""
import json, os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]

# The whole engine: a trainer of its own (a loop printing its progress), its log format, its checkpoints and numbers.
ENGINE = '''
import sys
from pathlib import Path
from nxpretrain.engines.base import Engine, register_engine
from nxpretrain.jobs.description import Job, job_name
from nxpretrain.steptime import Calibration

LOOP = """for i in range(1, 4): print(f"stub it {i}/3 loss {4 - i / 2} sec 0.5", flush=True)"""


@register_engine
class StubEngine(Engine):
    name, framework = 'stub', 'Stub trainer'
    checkpoint_format = 'none'

    def problems(self, recipe, world):
        return [] if recipe.model.arch == 'gpt' else [f"engine=stub with model.arch={recipe.model.arch}: gpt only"]

    def export(self, recipe, out_dir, cluster=None, **options):
        out = Path(out_dir)
        (out / 'logs').mkdir(parents=True, exist_ok=True)
        (out / 'loop.py').write_text(LOOP)
        job = Job(job_name(recipe.name, 'train'), 'train', [sys.executable, str(out / 'loop.py')], out,
                  distributed=False, scheduler=options.get('scheduler', 'slurm'), log=str(out / 'logs' / '%j.out'),
                  engine=self.name)
        return {'train': job}

    def parse_progress(self, line):
        words = line.split()
        if words[:2] != ['stub', 'it']: return None
        step, total = map(int, words[2].split('/'))
        return {'step': step, 'total': total, 'loss': float(words[4]), 's_per_step': float(words[6]),
                'remaining_s': (total - step) * float(words[6])}

    def checkpoints(self, folder): return []

    def requeue(self, folder, recipe): return False

    def calibration(self, device): return Calibration(0.25, 'the stub trainer, measured nowhere')

    def memory(self, recipe, dp):
        from nxpretrain.parallel.memory import engine_memory
        return engine_memory(recipe, dp)
'''


@pytest.fixture
def plugin(tmp_path):
    "A folder on PYTHONPATH holding the engine's module and the metadata of the package that declares it."
    site = tmp_path / 'site'
    (site / 'stub_engine-1.0.dist-info').mkdir(parents=True)
    (site / 'stub_engine.py').write_text(ENGINE)
    (site / 'stub_engine-1.0.dist-info' / 'METADATA').write_text(
        'Metadata-Version: 2.1\nName: stub-engine\nVersion: 1.0\n'
    )
    (site / 'stub_engine-1.0.dist-info' / 'entry_points.txt').write_text(
        '[nxpretrain.engines]\nstub = stub_engine:StubEngine\n')
    return {**os.environ, 'PYTHONPATH': os.pathsep.join([str(site), str(ROOT)]), 'NXPRETRAIN_HOME': str(tmp_path)}


def cli(env, *argv, cwd=None):
    return subprocess.run([sys.executable, '-c', f"from nxpretrain.cli import main; main({list(argv)!r})"],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_a_plugin_engine_plans_trains_and_is_watched(plugin, tmp_path):
    p = cli(plugin, 'plan', 'gpt3_tiny', 'engine=stub')
    assert p.returncode == 0, p.stderr
    assert 'Stub trainer (stub)' in p.stdout and 'the stub trainer, measured nowhere' in p.stdout, p.stdout
    p = cli(plugin, 'train', 'gpt3_tiny', 'engine=stub', cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert 'stub it 3/3 loss 2.5 sec 0.5' in p.stdout, p.stdout
    records = [json.loads(line) for line in (tmp_path / 'jobs.jsonl').read_text().splitlines()]
    assert [r['engine'] for r in records] == ['stub'], records
    p = cli(plugin, 'watch', records[0]['id'], '--timeout', '5')
    assert 'step 3/3, 0.50 s/step, ETA 0.0 min | loss 2.5' in p.stdout, p.stdout + p.stderr


def test_the_plugin_refuses_in_one_line(plugin):
    p = cli(plugin, 'plan', 'llama3_tiny', 'engine=stub')
    assert p.returncode == 2 and p.stderr.strip().endswith('engine=stub with model.arch=llama: gpt only'), p.stderr


def test_an_engine_nobody_declares(plugin):
    p = cli(plugin, 'plan', 'gpt3_tiny', 'engine=deepspeed')
    assert p.returncode == 2 and "engine='deepspeed': no such engine; choose one of megatron, native, nxdt" in p.stderr
