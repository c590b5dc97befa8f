"""Seed 1 (NeMo GPT-3 on 16 p4de.24xlarge, enroot/pyxis): its recipes validate and plan, their jobs run in a container
with the seed's mounts (seed 1's EFA layer on the NGC PyTorch that Megatron-LM e958b2ca runs on) and pass `sbatch
--test-only` on a controller shaped like the cluster, and the data recipe reads pre-made `.bin/.idx` prefixes as they
are (a small copy of the layout trains two steps)."""
import numpy as np
import pytest
from nxpretrain.recipes import get_recipe
from nxpretrain.config import override
from nxpretrain.validate import validate
from nxpretrain.plan import plan
from nxpretrain.clusters import profile
from nxpretrain.launch.job import make_job, render_jobs
from nxpretrain.launch.slurm import SlurmLauncher
from nxpretrain.testing.local_slurm import LocalSlurm, why_no_slurm

SEED1 = ('gpt3_175b_p4de', 'gpt3_126m_p4de')
IMAGE = '/apps/pytorch+25.03+py3-efa.sqsh'   # seed 1's EFA layer on the PyTorch Megatron-LM e958b2ca runs on


@pytest.mark.parametrize('name', SEED1)
def test_recipes_validate_and_plan(name):
    r = validate(get_recipe(name))
    p = plan(r)
    assert not p.problems, str(p)
    assert p.engine == 'Megatron-LM' and p.fits, str(p)     # NeMo ran on Megatron; so do its recipes
    # NeMo's 512 micro-batches × 12 virtual stages through our engine: only the receive buffers of the passes in
    # flight are alive (nxpretrain.parallel.stage)
    native = plan(override(r, 'engine=native'))
    assert native.fits and native.memory.buffers < 3 * 2**30, str(native)
    assert r.data.blend[1::2] == [f'/fsx/data/the_pile_gpt3/my-gpt3_{i:02d}_text_document' for i in range(30)]
    assert 'departs from NeMo' in r.notes and r.cluster.profile == 'p4de.24xlarge'
    assert p.world == r.cluster.nodes * 8


def test_175b_has_nemos_numbers():
    r = get_recipe('gpt3_175b_p4de')
    m, par, o = r.model, r.parallel, r.optim
    assert (m.n_layers, m.hidden, m.n_heads, m.seq_len, m.init_std) == (96, 12288, 96, 2048, 0.006)
    assert (par.tp, par.pp, par.virtual_pp, r.data.global_batch, r.cluster.nodes) == (4, 8, 12, 2048, 16)
    assert (o.lr, o.min_lr, o.warmup_steps, o.decay_steps, r.trainer.max_steps) == (0.9e-4, 0.9e-5, 115, 62500, 75000)
    assert plan(r).dp == 4


@pytest.mark.parametrize('name', SEED1)
def test_job_runs_in_the_seeds_container(tmp_path, name):
    job = make_job(name, None, tmp_path / name)
    assert f"--container-image={IMAGE}" in job.script
    assert "--container-mounts=/fsx:/fsx,/apps:/apps" in job.script
    assert '#SBATCH --gres=gpu:8' in job.script and f"#SBATCH --nodes={get_recipe(name).cluster.nodes}" in job.script
    assert 'export FI_PROVIDER=efa' in job.script


@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(why_no_slurm()), reason=f"no local Slurm: {why_no_slurm()}")
def test_sbatch_test_only_accepts_the_jobs(tmp_path):
    prof = profile('p4de.24xlarge')
    with LocalSlurm.shaped_like(prof, 16, name='seed1', port=6930):
        for name in SEED1:
            job = make_job(name, None, tmp_path / name)
            answer = SlurmLauncher().check(job)
            assert f"using {get_recipe(name).cluster.nodes * prof.cpus_per_node} processors" in answer, answer


def test_premade_prefixes_train_as_they_are(tmp_path):
    "The seed's pre-made layout (my-gpt3_NN_text_document pairs) is read, not re-tokenised: a two-prefix copy trains."
    from nxpretrain.data.indexed import IndexedWriter, IndexedDataset
    from nxpretrain.train.trainer import train
    rng = np.random.default_rng(0)
    prefixes = []
    for i in range(2):
        prefix = str(tmp_path / 'the_pile_gpt3' / f'my-gpt3_{i:02d}_text_document')
        with IndexedWriter(prefix, np.uint16, 50257) as w:
            lengths = rng.integers(50, 200, 60)
            w.add_documents(rng.integers(0, 50257, int(lengths.sum())), lengths)
        prefixes.append(prefix)
    before = {p: (open(p + '.bin', 'rb').read(), open(p + '.idx', 'rb').read()) for p in prefixes}
    r = get_recipe('gpt3_126m_p4de', 'model.n_layers=2', 'model.hidden=64', 'model.n_heads=4', 'model.seq_len=64',
                   'model.max_position=64', 'data.micro_batch=2', 'data.global_batch=2', 'trainer.eval_every=0',
                   'trainer.save_every=0', 'trainer.threads=1', 'parallel.precision=fp32', 'optim.warmup_steps=1',
                   'cluster.profile=local', 'engine=native', 'cluster.nodes=1', 'data.split=98,1,1',
                   f"data.blend=[{', '.join(f'0.5, {p}' for p in prefixes)}]", f'data.corpus={prefixes[0]}')
    res = train(r, str(tmp_path / 'run'), 2, progress=False)
    assert len(res.losses) == 2 and all(np.isfinite(res.losses))
    assert abs(res.losses[0] - np.log(50304)) < 1.0                 # a fresh GPT-2-vocabulary model on these tokens
    assert before == {p: (open(p + '.bin', 'rb').read(), open(p + '.idx', 'rb').read()) for p in prefixes}
    assert sorted(q.name for q in (tmp_path / 'the_pile_gpt3').iterdir() if q.suffix in ('.bin', '.idx')) == [
        'my-gpt3_00_text_document.bin',
        'my-gpt3_00_text_document.idx',
        'my-gpt3_01_text_document.bin',
        'my-gpt3_01_text_document.idx',
    ]
    assert IndexedDataset(prefixes[1]).num_tokens > 0


@pytest.mark.parametrize('name', SEED1)
def test_missing_image_hint_builds_pytorch_25_03_with_the_efa_layer(tmp_path, name):
    "The job's check names the image Megatron-LM e958b2ca runs in, under its own file name, and how to build it."
    import shlex, subprocess, sys
    from nxpretrain.engines.megatron.contract import load_contract
    from nxpretrain.engines.megatron.job import export_megatron
    job = render_jobs(export_megatron(get_recipe(name), tmp_path / name))['train']   # the job `train` submits
    line = next(l for l in job.script.splitlines() if l.startswith('for need in '))
    needs = dict(n.split('::', 1) for n in shlex.split(line.removeprefix('for need in ').removesuffix('; do')))
    hint = needs[IMAGE]
    assert 'docker build -t nxpretrain/pytorch:25.03-py3-efa' in hint and 'pytorch:25.03' in hint
    assert hint.endswith(f"enroot import -o {IMAGE} dockerd://nxpretrain/pytorch:25.03-py3-efa"), hint
    p = subprocess.run([sys.executable, '-m', 'nxpretrain.engines.images', 'dockerfile', IMAGE.rsplit('/', 1)[1]],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    seed2_image = load_contract()['setup_script']['image'].replace('#', '/')       # the image seed 2 runs e958b2ca in
    assert f"FROM {seed2_image}\n" in p.stdout
    assert './configure --prefix=/opt/amazon/efa' in p.stdout and 'aws-ofi-nccl' in p.stdout
