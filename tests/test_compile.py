"""`trainer.compile=true` (regional torch.compile of each block) in the trainer: its losses agree with the eager run's,
two compiled runs are equal bit for bit (the second from the cache the first filled, compiling nothing), a DP2 compiled
run equals the one-process compiled run, a compiled run stopped and resumed equals the uninterrupted one, and the
compile stage's dry run fills the cache that the training run then reads."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from nxpretrain.recipes import get_recipe
from nxpretrain.config import override
from train_helpers import dist_train, close

ROOT = Path(__file__).resolve().parents[1]
STEPS, HALF = 4, 2
R = get_recipe('gpt3_tiny', 'data.corpus=synthetic', 'model.n_layers=2', 'model.hidden=64', 'model.seq_len=32',
               'data.micro_batch=2', 'data.global_batch=4', 'trainer.threads=1', 'trainer.save_every=2',
               'trainer.eval_every=0', 'trainer.log_every=1', 'parallel.precision=fp32', 'optim.warmup_steps=1',
               f'optim.decay_steps={STEPS}', 'trainer.compile=true')

# Each run in a fresh interpreter: dynamo's counters and in-memory caches are per process, so what a run reads from
# the cache on disk shows only there.
RUN = """
import json, sys, torch
from nxpretrain.config import from_yaml
from nxpretrain.train.trainer import train
from nxpretrain.parallel.compile import compile_counts
torch.set_num_threads(1)
res = train(from_yaml(sys.argv[1]), sys.argv[2], int(sys.argv[3]), progress=False)
print(json.dumps(dict(losses=res.losses, counts=compile_counts())))
"""


def run(recipe, out: Path, steps=STEPS, env=None) -> dict:
    from nxpretrain.config import to_yaml
    out.mkdir(parents=True, exist_ok=True)
    to_yaml(recipe, out / 'recipe.yaml')
    env = {**os.environ, 'PYTHONPATH': str(ROOT), **(env or {})}
    env.pop('TORCHINDUCTOR_CACHE_DIR', None)   # the recipe's trainer.compile_cache decides
    p = subprocess.run([sys.executable, '-c', RUN, str(out / 'recipe.yaml'), str(out), str(steps)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp('compile-cache')


@pytest.fixture(scope='module')
def compiled(cache, tmp_path_factory):
    return run(override(R, f'trainer.compile_cache={cache}'), tmp_path_factory.mktemp('first'))


def test_compiled_agrees_with_eager_and_is_reproducible_from_the_cache(compiled, cache, tmp_path):
    assert compiled['counts']['graphs'] >= 1 and compiled['counts']['cache_misses'] >= 1
    assert any((cache / 'inductor').iterdir()), 'nothing cached'
    eager = run(override(R, 'trainer.compile=false'), tmp_path / 'eager')
    close(compiled['losses'], eager['losses'], tol=1e-5)   # inductor fuses pointwise work: float32 rounding differs
    again = run(override(R, f'trainer.compile_cache={cache}'), tmp_path / 'again')
    assert again['counts']['cache_misses'] == 0 and again['counts']['cache_hits'] >= 1, again['counts']
    assert again['losses'] == compiled['losses']   # bit for bit, run to run


def test_compiled_resume_is_exact(cache, compiled, tmp_path):
    r = override(R, f'trainer.compile_cache={cache}')
    half = run(r, tmp_path / 'cut', HALF)
    rest = run(r, tmp_path / 'cut', STEPS)
    assert half['losses'] + rest['losses'] == compiled['losses']


def test_dp2_compiled_equals_one_process(cache, compiled, tmp_path):
    got = dist_train(override(R, 'parallel.dp=2', f'trainer.compile_cache={cache}'), tmp_path, STEPS)
    close(got.losses, compiled['losses'])


def test_compile_stage_fills_the_cache_the_training_run_reads(tmp_path):
    from nxpretrain.launch.compile_job import compile_stage
    cache = tmp_path / 'cache'
    r = override(R, f'trainer.compile_cache={cache}')
    rep = compile_stage(r, out_dir=tmp_path / 'stage', steps=2, show=lambda *a: None)
    assert rep.ok and rep.steps_reached == 2, str(rep)
    assert rep.cache_env['TORCHINDUCTOR_CACHE_DIR'] == str(cache / 'inductor')
    train = run(r, tmp_path / 'train', HALF)
    assert train['counts']['cache_misses'] == 0 and train['counts']['cache_hits'] >= 1, train['counts']



@pytest.mark.parametrize('compile', [False, True], ids=['eager', 'compiled'])
def test_dropout_is_reproducible_and_resumes_exactly(cache, tmp_path, compile):
    """With dropout, a run stopped and resumed draws the masks the uninterrupted run drew (a step's log line measures
    the matmul peak once per process: with a generator of its own). Compiled blocks draw inductor's own masks, not
    eager's, the same run to run."""
    r = override(R, f'trainer.compile_cache={cache}', 'model.dropout=0.1', f'trainer.compile={compile}')
    full = run(r, tmp_path / 'full')
    if compile: assert run(r, tmp_path / 'again')['losses'] == full['losses']
    half = run(r, tmp_path / 'cut', HALF)
    rest = run(r, tmp_path / 'cut', STEPS)
    assert half['losses'] + rest['losses'] == full['losses']


@pytest.mark.parametrize('name, script', [('gpt3_23b', 'train.sh'), ('bert_large', 'run_xla.sh')])
def test_compile_then_train_use_one_neuron_cache(tmp_path, monkeypatch, name, script):
    """`nxpretrain compile R` fills a Neuron cache and `nxpretrain train R` points its job at that same cache (seed 0's
    and seed 3's one shared cache), so the training job does not compile again for hours."""
    import yaml
    from nxpretrain.launch.compile_job import compile_stage
    from nxpretrain.stages import train_stage
    monkeypatch.chdir(tmp_path)
    rep = compile_stage(name, out_dir='runs/compile', show=lambda *a: None)
    filled = rep.cache_env['NEURON_COMPILE_CACHE_URL']
    assert filled == str(tmp_path / 'runs/neuron-cache') and Path(filled).is_dir()
    job = train_stage(name, out_dir='runs', dry_run=True, show=lambda *a: None)
    want = f"export NEURON_COMPILE_CACHE_URL=${{NEURON_COMPILE_CACHE_URL:-{filled}}}"
    assert want in (tmp_path / 'runs/compile' / script).read_text()      # what compile ran with
    assert want in (job.out_dir / script).read_text()                     # what train runs with
    if name == 'gpt3_23b':                                                # NxDT reads it from its YAML too
        assert yaml.safe_load(job.recipe_path.read_text())['compiler_cache_url'] == filled
    monkeypatch.setenv('NXPRETRAIN_STAGE', str(tmp_path / 'fsx'))         # on a stage folder: the stage's one cache
    rep = compile_stage(name, out_dir='runs/compile', show=lambda *a: None)
    filled = rep.cache_env['NEURON_COMPILE_CACHE_URL']
    assert filled == str(tmp_path / 'fsx/neuron-cache') and Path(filled).is_dir()
    job = train_stage(name, out_dir='runs', dry_run=True, show=lambda *a: None)
    want = f"export NEURON_COMPILE_CACHE_URL=${{NEURON_COMPILE_CACHE_URL:-{filled}}}"
    assert want in (tmp_path / 'fsx/compile' / script).read_text() and want in (job.out_dir / script).read_text()
