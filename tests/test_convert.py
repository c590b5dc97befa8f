"""`nxpretrain convert` between HF, nxpretrain, Megatron-LM torch_dist and NxD with torch alone: every pair of formats
gives back the same tensors bit for bit (GPT and Llama-GQA), NxD files are read with no Neuron or torch-xla package,
unsafe pickles are refused before anything runs, and a failed conversion leaves no folder."""
import importlib.util, itertools, os, pickle, subprocess, sys
from pathlib import Path
import pytest, torch
from safetensors.torch import load_file
from nxpretrain.errors import CheckpointError, NxpError
from nxpretrain.models.args import ModelConfig
from nxpretrain.convert.convert import convert, read_model, source_format
from nxpretrain.launch.job import render_jobs

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ModelConfig(arch='llama', n_layers=3, hidden=32, n_heads=8, n_kv_heads=2, ffn_hidden=40, vocab_size=100,
                    seq_len=16, tie_embeddings=False, make_vocab_size_divisible_by=16)
GPT = ModelConfig(arch='gpt', n_layers=2, hidden=32, n_heads=4, vocab_size=100, seq_len=16,
                  make_vocab_size_divisible_by=16)
# format → (TP, PP) written; NxD only for Llama (NxDT's GPT is Megatron-style)
LAYOUTS = {'megatron': (2, 1), 'native': (2, 1), 'nxdt': (4, 3)}


def hf_folder(cfg: ModelConfig, out: Path) -> Path:
    import transformers
    from nxpretrain.models.hf_mapping import to_hf_config, randomize_
    from nxpretrain.models.registry import family
    model = getattr(transformers, family(cfg.arch).hf.architecture)(to_hf_config(cfg))
    randomize_(model, std=0.5, seed=1).save_pretrained(out)
    return out


def same_hf(a: Path, b: Path):
    x, y = load_file(a / 'model.safetensors'), load_file(b / 'model.safetensors')
    assert sorted(x) == sorted(y)
    assert [k for k in x if not torch.equal(x[k], y[k])] == []


@pytest.mark.parametrize('cfg', [GPT, LLAMA], ids=['gpt', 'llama'])
def test_every_pair_of_formats_is_bit_identical(cfg, tmp_path):
    hf = hf_folder(cfg, tmp_path / 'hf')
    formats = [f for f in LAYOUTS if f != 'nxdt' or cfg.arch == 'llama']
    for f in formats:                                     # HF → f → HF
        convert(hf, f, tmp_path / f, *LAYOUTS[f])
        assert source_format(tmp_path / f) == f
        convert(tmp_path / f, 'hf', tmp_path / f'{f}_hf')
        same_hf(hf, tmp_path / f'{f}_hf')
    for a, b in itertools.permutations(formats, 2):       # HF → a → b → HF
        convert(tmp_path / a, b, tmp_path / f'{a}_{b}', *LAYOUTS[b])
        convert(tmp_path / f'{a}_{b}', 'hf', tmp_path / f'{a}_{b}_hf')
        same_hf(hf, tmp_path / f'{a}_{b}_hf')


def test_the_model_is_read_from_each_format(tmp_path):
    hf = hf_folder(LLAMA, tmp_path / 'hf')
    for f, (tp, pp) in LAYOUTS.items():
        convert(hf, f, tmp_path / f, tp, pp)
        src = read_model(tmp_path / f)
        assert (src.cfg.n_heads, src.cfg.kv_heads, src.cfg.ffn, src.cfg.rope_theta, src.layout) == (8, 2, 40, 10000.0,
                                                                                                  (tp, pp)), f


def test_nxd_files_are_read_with_no_neuron_package(tmp_path):
    for name in ('torch_xla', 'neuronx_distributed', 'torch_neuronx'): assert importlib.util.find_spec(name) is None
    hf = hf_folder(LLAMA, tmp_path / 'hf')
    run = tmp_path / 'nxdt_run'
    convert(hf, 'nxdt', run / 'step=0.ckpt', tp=4, pp=1, hw_backend='trn2', xser=True)
    tag = run / 'step=0.ckpt'
    assert {p.name for p in tag.iterdir()} >= {'checkpoint', 'done', 'model', 'config.json'}
    assert len(list((tag / 'model').glob('dp_rank_00_tp_rank_0?_pp_rank_00.pt'))) == 4
    # K/V heads (2) replicated twice for TP 4: each rank holds one K head of head_dim 4 rows
    f = tag / 'model' / 'dp_rank_00_tp_rank_01_pp_rank_00.pt'
    k = torch.load(f'{f}.tensors/tensor_3.pt', weights_only=True)     # embedding, norm, q, then k
    assert k.shape == (4, 32)
    convert(run, 'hf', tmp_path / 'back')
    same_hf(hf, tmp_path / 'back')
    assert 'torch_xla' not in sys.modules
    (tag / 'done').unlink()                             # a save cut short: its marker missing
    with pytest.raises(CheckpointError, match='partial save'): read_model(tag)


def test_unsafe_pickles_are_refused_before_anything_runs(tmp_path):
    from nxpretrain.engines.megatron.args import read_common
    marker = tmp_path / 'ran'
    class Trap:
        def __reduce__(self): return (Path.touch, (marker,))
    torch.save({'args': Trap()}, tmp_path / 'common.pt')
    with pytest.raises(CheckpointError, match='refusing to load it'): read_common(tmp_path / 'common.pt')
    (tmp_path / 'plain.pt').write_bytes(pickle.dumps({'args': Trap()}))
    with pytest.raises(CheckpointError, match='not a zip'): read_common(tmp_path / 'plain.pt')
    assert not marker.exists()


def test_a_failed_conversion_leaves_nothing(tmp_path):
    """A run whose tokenizer is not in the data folder beside it fails in one line (never looked for in the current
    directory) and leaves no folder; so does an --out that exists."""
    from nxpretrain.recipes import get_recipe
    hf = hf_folder(GPT, tmp_path / 'hf')
    run = get_recipe('gpt3_tiny', 'model.n_layers=2', 'model.hidden=32', 'model.n_heads=4', 'model.vocab_size=100',
                     'model.seq_len=16', 'model.make_vocab_size_divisible_by=16', 'model.max_position=null',
                     'model.ffn_hidden=null', 'model.norm_eps=1e-5', 'model.tie_embeddings=true',
                     'data.corpus=demo', 'data.tokenizer=gpt2')
    convert(hf, 'native', tmp_path / 'runs' / 'native', recipe=run)   # a run of that recipe, its data in runs/data
    (tmp_path / 'runs' / 'data').mkdir()
    (tmp_path / 'gpt2').mkdir()                        # in the current directory: never used
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    env.pop('NXPRETRAIN_DATA', None)
    argv = ['convert', str(tmp_path / 'runs' / 'native'), '--to', 'hf', '--out', str(tmp_path / 'out')]
    p = subprocess.run([sys.executable, '-c', f"from nxpretrain.cli import main; main({argv!r})"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path, env=env)
    assert p.returncode == 2, p.stderr[-2000:]
    assert '\n' not in p.stderr.strip() and 'runs/data/gpt2' in p.stderr, p.stderr
    assert sorted(q.name for q in tmp_path.iterdir()) == ['gpt2', 'hf', 'runs']
    with pytest.raises(NxpError, match='exists'): convert(hf, 'native', tmp_path / 'runs' / 'native')


def test_continual_pretraining_job_starts_from_converted_weights_with_no_placeholder(tmp_path):
    "`nxpretrain train llama3_70b init_from=HF_DIR --dry-run`: the job starts from the folder one named command fills."
    import yaml
    from nxpretrain.models.hf_mapping import to_hf_config
    from nxpretrain.recipes import get_recipe
    hf = tmp_path / 'Meta-Llama-3-70B'
    hf.mkdir()
    to_hf_config(get_recipe('llama3_70b').model).to_json_file(str(hf / 'config.json'))
    argv = ['train', 'llama3_70b', f'init_from={hf}', '--dry-run', '--out', str(tmp_path / 'runs')]
    p = subprocess.run([sys.executable, '-c', f"from nxpretrain.cli import main; main({argv!r})"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert p.returncode == 0, p.stderr[-2000:]
    job = tmp_path / 'runs' / 'jobs' / 'llama3_70b'
    init = job / 'init' / 'Meta-Llama-3-70B-nxdt-tp32-pp8'
    conf = yaml.safe_load(next((job / 'conf').glob('*.yaml')).read_text())
    assert conf['exp_manager']['resume_from_checkpoint'] == str(init) and conf['model']['weight_init_only'] is True
    script = (job / 'train.sh').read_text()
    assert 'HF_MODEL_ID' not in script and 'HF_MODEL_ID' not in p.stdout
    assert (f'nxpretrain convert {hf} --to nxdt --out {init} --tp 32 --pp 8 --hw-backend trn1 --kv-multiplier 4 '
            '--fuse-qkv') in script
    assert not init.exists()                                         # a dry run converts nothing


def test_init_from_converts_once_in_the_jobs_layout(tmp_path):
    from nxpretrain.convert.init_from import prepare_init_from
    from nxpretrain.recipes import get_recipe
    hf = hf_folder(LLAMA, tmp_path / 'hf')
    r = get_recipe('llama3_tiny', 'engine=nxdt', 'cluster.profile=trn1.32xlarge', 'parallel.tp=4', 'parallel.pp=1',
                   'parallel.kv_replicator=2', 'model.n_layers=3', 'model.hidden=32', 'model.n_heads=8',
                   'model.n_kv_heads=2', 'model.ffn_hidden=40', 'model.vocab_size=100', 'model.seq_len=16',
                   'model.tie_embeddings=false', 'model.make_vocab_size_divisible_by=16', 'model.rope_theta=10000',
                   'model.norm_eps=1e-5')
    folder = prepare_init_from(r, hf, tmp_path / 'job')
    assert (folder / 'done').is_file() and (folder / 'model' / 'dp_rank_00_tp_rank_03_pp_rank_00.pt.tensors').is_dir()
    mtime = (folder / 'done').stat().st_mtime
    assert prepare_init_from(r, hf, tmp_path / 'job') == folder and (folder / 'done').stat().st_mtime == mtime
    convert(folder, 'hf', tmp_path / 'back')
    same_hf(hf, tmp_path / 'back')


def test_a_llama_recipe_on_megatron_lm_passes_the_contract(tmp_path):
    "engine=megatron with arch=llama: Megatron-LM's SwiGLU, RMSNorm, GQA and RoPE flags pass the contract replay."
    from nxpretrain.engines.base import engine_of
    from nxpretrain.engines.megatron.job import export_megatron
    from nxpretrain.engines.megatron.contract import read_flags
    from nxpretrain.recipes import get_recipe
    r = get_recipe('llama3_8b', 'engine=megatron', 'cluster.profile=p5.48xlarge')
    jobs = render_jobs(export_megatron(r, tmp_path / 'job', None, (), data_root=str(tmp_path / 'data'),
                                       megatron_lm=str(tmp_path / 'Megatron-LM')))
    assert engine_of(r).check(jobs) == []
    flags = read_flags(tmp_path / 'job' / 'megatron.args')
    assert flags['num-query-groups'] == ['8'] and flags['normalization'] == ['RMSNorm'] and 'swiglu' in flags
    assert flags['position-embedding-type'] == ['rope'] and flags['rotary-base'] == ['500000']
    assert flags['tokenizer-type'] == ['HuggingFaceTokenizer'] and 'disable-bias-linear' in flags


def test_a_megatron_lm_job_starts_from_converted_weights(tmp_path):
    "init_from on Megatron-LM: the HF weights converted into a release save, named by --pretrained-checkpoint."
    from nxpretrain.convert.init_from import prepare_init_from
    from nxpretrain.engines.base import engine_of
    from nxpretrain.engines.megatron.job import export_megatron
    from nxpretrain.engines.megatron.contract import read_flags
    from nxpretrain.recipes import get_recipe
    hf = hf_folder(LLAMA, tmp_path / 'hf')
    r = get_recipe('llama3_8b', 'engine=megatron', 'cluster.profile=p5.48xlarge', 'parallel.tp=2', 'parallel.pp=1',
                   'parallel.kv_replicator=1', 'model.n_layers=3', 'model.hidden=32', 'model.n_heads=8',
                   'model.n_kv_heads=2', 'model.ffn_hidden=40', 'model.vocab_size=100', 'model.seq_len=16',
                   'model.tie_embeddings=false', 'model.make_vocab_size_divisible_by=16', 'model.rope_theta=10000',
                   'model.norm_eps=1e-5', 'cluster.nodes=1', 'data.global_batch=64', 'data.micro_batch=1')
    folder = prepare_init_from(r, hf, tmp_path / 'job')
    assert (folder / 'latest_checkpointed_iteration.txt').read_text() == 'release'
    jobs = render_jobs(export_megatron(r, tmp_path / 'job', None, (), data_root=str(tmp_path / 'data'),
                                       megatron_lm=str(tmp_path / 'Megatron-LM'), init_from=str(folder),
                                       init_from_hf=str(hf)))
    assert engine_of(r).check(jobs) == []
    assert read_flags(tmp_path / 'job' / 'megatron.args')['pretrained-checkpoint'] == [str(folder)]
    assert (f'nxpretrain convert {hf} --to megatron --out {folder} --tp 2 --pp 1 --transformer-impl '
            'transformer_engine') in jobs['train'].script                  # the spec the job's Megatron-LM builds
    from torch.distributed.checkpoint import FileSystemReader
    keys = FileSystemReader(str(folder / 'release')).read_metadata().state_dict_metadata
    assert 'decoder.final_layernorm._extra_state/shard_0_1' in keys       # TransformerEngine's spec
    convert(folder, 'hf', tmp_path / 'back')
    same_hf(hf, tmp_path / 'back')


def test_evaluate_and_export_hf_read_an_nxdt_run(tmp_path):
    "An NxDT export's checkpoint tag is read by its engine (conf/config.json, the recipe's trn1 order): equal to HF."
    from nxpretrain.config import to_yaml
    from nxpretrain.evaluate import load_model
    from nxpretrain.engines.base import engine_for_checkpoint
    from nxpretrain.recipes import get_recipe
    import transformers
    hf = hf_folder(LLAMA, tmp_path / 'hf')
    r = get_recipe('llama3_tiny', 'engine=nxdt', 'cluster.profile=trn1.32xlarge', 'parallel.tp=4', 'parallel.pp=1',
                   'parallel.kv_replicator=2', 'model.n_layers=3', 'model.hidden=32', 'model.n_heads=8',
                   'model.n_kv_heads=2', 'model.ffn_hidden=40', 'model.vocab_size=100', 'model.seq_len=16',
                   'model.tie_embeddings=false', 'model.make_vocab_size_divisible_by=16', 'model.rope_theta=10000',
                   'model.norm_eps=1e-5', 'data.corpus=synthetic')
    run = tmp_path / 'run'
    (run / 'conf').mkdir(parents=True)
    to_yaml(r, run / 'recipe.yaml')
    tag = run / 'exp' / 'llama3_tiny' / 'checkpoints' / 'llama3_tiny--step=10-consumed_samples=640.0.ckpt'
    convert(hf, 'nxdt', tag, tp=4, hw_backend='trn1', fuse_qkv=True)
    (tag / 'config.json').rename(run / 'conf' / 'config.json')       # where the NxDT export keeps it
    (tag / 'nxpretrain_nxd.json').unlink()                           # as NxDT itself leaves the tag
    assert engine_for_checkpoint(tag).name == 'nxdt'
    model, recipe = load_model(tag)
    x = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    theirs = transformers.LlamaForCausalLM.from_pretrained(hf).eval()
    with torch.no_grad(): ours, want = model(x)[..., :100], theirs(x).logits
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5)


LLAMA_RECIPE = ('model.n_layers=3', 'model.hidden=32', 'model.n_heads=8', 'model.n_kv_heads=2', 'model.ffn_hidden=40',
                'model.vocab_size=100', 'model.seq_len=16', 'model.tie_embeddings=false',
                'model.make_vocab_size_divisible_by=16', 'model.rope_theta=10000', 'model.norm_eps=1e-5',
                'data.corpus=synthetic', 'data.micro_batch=4', 'data.global_batch=4', 'parallel.precision=fp32',
                'trainer.threads=1', 'trainer.eval_every=0', 'trainer.save_every=0')


def test_native_training_starts_from_hf_weights(tmp_path):
    """`nxpretrain train R init_from=HF_DIR` on the native engine: converted once into the run's folder, then step 1's
    loss is transformers' loss of the HF model on the same batch (step 0, a fresh optimizer)."""
    import transformers
    from nxpretrain.stages import train_stage
    from nxpretrain.recipes import get_recipe
    from nxpretrain.train.trainer import build_datasets, micro_batches
    from nxpretrain.models.args import padded_vocab
    hf = hf_folder(LLAMA, tmp_path / 'hf')
    res = train_stage('llama3_tiny', overrides=[*LLAMA_RECIPE, f'init_from={hf}'], max_steps=2,
                      out_dir=str(tmp_path / 'runs'), show=lambda *a: None)
    assert res.start_step == 0 and len(res.losses) == 2
    assert (tmp_path / 'runs' / 'llama3_tiny' / 'init' / 'hf-native-tp1-pp1' / 'step_0').is_dir()
    r = get_recipe('llama3_tiny', *LLAMA_RECIPE)
    batch = next(iter(micro_batches(build_datasets(r, 8)[0], 0, 4, 4)))
    theirs = transformers.LlamaForCausalLM.from_pretrained(hf).eval()
    with torch.no_grad(): logits = theirs(batch['tokens']).logits
    # the trainer's softmax spans the padded vocabulary (112 rows, as Megatron-LM's): the padding rows are zero
    logits = torch.nn.functional.pad(logits, (0, padded_vocab(r.model) - 100))
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch['labels'].flatten()).item()
    assert abs(res.losses[0] - want) < 1e-5, (res.losses[0], want)
    fresh = train_stage('llama3_tiny', overrides=list(LLAMA_RECIPE), max_steps=1, out_dir=str(tmp_path / 'fresh'),
                        show=lambda *a: None)
    assert abs(fresh.losses[0] - want) > 0.1                          # a fresh init gives another loss


def test_native_init_from_a_wrong_shape_is_one_line_before_anything_runs(tmp_path):
    hf = hf_folder(LLAMA, tmp_path / 'hf')
    argv = ['train', 'llama3_tiny', *LLAMA_RECIPE, 'model.ffn_hidden=48', f'init_from={hf}', '--out',
            str(tmp_path / 'runs')]
    p = subprocess.run([sys.executable, '-c', f"from nxpretrain.cli import main; main({argv!r})"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert p.returncode == 2, p.stderr[-2000:]
    assert '\n' not in p.stderr.strip() and 'ffn: 40 vs 48' in p.stderr, p.stderr
    assert not (tmp_path / 'runs' / 'llama3_tiny').exists()


def test_import_hf_and_export_hf_are_converts_two_hf_cases(tmp_path):
    """`import-hf` and `export-hf` are `convert`'s HF cases: their help says so, the round trip is bit-identical, the
    model is read from the checkpoint, and an export that fails (its folder exists) is one line and writes nothing."""
    from nxpretrain.cli import _parser
    hf = hf_folder(LLAMA, tmp_path / 'hf')
    help_text = _parser().format_help()
    assert 'convert --to hf: write a checkpoint' in help_text and 'convert --to native: turn a Hugging' in help_text
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    def cli(*argv):
        return subprocess.run([sys.executable, '-c', f"from nxpretrain.cli import main; main({list(argv)!r})"],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    p = cli('import-hf', str(hf), str(tmp_path / 'native'))
    assert p.returncode == 0 and p.stdout.strip().endswith(str(tmp_path / 'native' / 'step_0')), p.stderr[-2000:]
    assert read_model(tmp_path / 'native').cfg.kv_heads == 2
    p = cli('export-hf', str(tmp_path / 'native' / 'step_0'), str(tmp_path / 'back'))
    assert p.returncode == 0, p.stderr[-2000:]
    same_hf(hf, tmp_path / 'back')
    p = cli('export-hf', str(tmp_path / 'native' / 'step_0'), str(tmp_path / 'back'))
    assert p.returncode == 2 and '\n' not in p.stderr.strip() and 'exists' in p.stderr, p.stderr
    assert sorted(q.name for q in tmp_path.iterdir()) == ['back', 'hf', 'native']


def test_the_training_state_goes_through_the_engine_that_carries_it(tmp_path):
    """`convert` names no engine's own module: it asks the engines of both formats whether one carries the source's
    training state (`Engine.carries_state`), and has that one write it; `weights_only` skips the question."""
    from test_imports import graph
    from nxpretrain.engines.base import ENGINES, Engine, register_engine
    own = {m for m in graph()['nxpretrain.convert.convert'] if m.startswith('nxpretrain.engines.')}
    assert own == {'nxpretrain.engines.base'}
    carried = []

    class Relay(Engine):      # a framework whose saves carry their whole state into its own format
        name, framework = 'relay', 'a relay'
        export = parse_progress = checkpoints = requeue = calibration = memory = lambda self, *a, **k: None
        def carries_state(self, src, fmt, to): return (fmt, to) == ('relay', 'relay')
        def convert_state(self, src, fmt, to, out, tp=1, pp=1, recipe=None):
            carried.append((Path(src).name, fmt, to, tp, pp))
            return Path(out)

    register_engine(Relay)
    try:
        assert convert(tmp_path / 'save', 'relay', tmp_path / 'out', tp=2, src_format='relay') == tmp_path / 'out'
        assert carried == [('save', 'relay', 'relay', 2, 1)]
        with pytest.raises(NxpError, match='a relay checkpoints are not read here'):
            convert(tmp_path / 'save', 'relay', tmp_path / 'out', src_format='relay', weights_only=True)
        assert len(carried) == 1
    finally: ENGINES.pop('relay')


def test_native_init_from_on_trn1s_xla_path_is_refused_before_any_conversion(tmp_path):
    """trn1's XLA run (the native engine on an `xla` profile) starts from its own init only: `init_from` is refused in
    one line before the HF weights are converted, and no job folder is written."""
    hf = hf_folder(LLAMA, tmp_path / 'hf')
    argv = ['train', 'llama3_tiny', *LLAMA_RECIPE, 'cluster.profile=trn1.32xlarge', 'data.global_batch=128',
            f'init_from={hf}', '--out', str(tmp_path / 'runs')]
    p = subprocess.run([sys.executable, '-c', f"from nxpretrain.cli import main; main({argv!r})"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert p.returncode == 2, p.stderr[-2000:]
    assert '\n' not in p.stderr.strip(), p.stderr
    assert 'init_from on trn1.32xlarge' in p.stderr and 'drop init_from, or use engine=nxdt' in p.stderr, p.stderr
    assert not (tmp_path / 'runs').exists(), sorted(str(q) for q in (tmp_path / 'runs').rglob('*'))


def test_a_native_job_on_slurm_without_its_converted_weights_stops_in_one_line(tmp_path):
    """A native job on Slurm that starts from converted weights checks them at the top of its script, as the local
    launcher does: with `init/…/step_0` missing it exits 2 with the `nxpretrain convert` command (shell-quoted) in one
    line, before the rendezvous or srun; with them there, it goes on."""
    import shlex
    from nxpretrain.engines.base import get_engine
    from nxpretrain.launch.job import export_jobs
    from nxpretrain.recipes import get_recipe
    init, hf = tmp_path / 'init' / 'my hf-native-tp1-pp1', '/models/my hf'
    job = export_jobs(get_engine('native'), get_recipe('gpt3_tiny', 'data.global_batch=32'), tmp_path / 'job', 'cpu@2',
                      init_from=str(init), init_from_hf=hf)['train']
    assert job.scheduler == 'slurm' and job.distributed
    start = job.script.index('for need in')
    check = job.script[start:job.script.index('\ndone\n', start) + 6]
    assert job.script.index(check) < job.script.index('MASTER_ADDR') < job.script.index('srun ')
    p = subprocess.run(['bash', '-c', check], capture_output=True, text=True, timeout=30)
    want = (f"nxpretrain: {init}/step_0 is missing: convert the HF weights (any CPU): nxpretrain convert "
            f"{shlex.quote(hf)} --to native --out {shlex.quote(str(init))} --tp 1 --pp 1")
    assert (p.returncode, p.stderr) == (2, want + '\n'), p.stderr
    (init / 'step_0').mkdir(parents=True)
    p = subprocess.run(['bash', '-c', check + 'echo on'], capture_output=True, text=True, timeout=30)
    assert (p.returncode, p.stdout, p.stderr) == (0, 'on\n', ''), p.stderr


def test_convert_to_megatron_keeps_a_megatron_sources_transformer_impl(tmp_path):
    """`nxpretrain convert SAVE --to megatron` of a Megatron-LM save keeps the spec its args record (TransformerEngine's
    `_extra_state` keys, `args.transformer_impl`) unless `--transformer-impl` says otherwise; HF is 'local'."""
    from nxpretrain.engines.megatron.args import read_common
    from nxpretrain.train.checkpoint import safe_reader
    hf = hf_folder(LLAMA, tmp_path / 'hf')
    convert(hf, 'megatron', tmp_path / 'te', tp=2, transformer_impl='transformer_engine')
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    def cli(*argv):
        return subprocess.run([sys.executable, '-c', f"from nxpretrain.cli import main; main({list(argv)!r})"],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    def impl_and_keys(out):
        d = out / 'release'
        keys = {k for k in safe_reader(d).read_metadata().state_dict_metadata if k.endswith('_extra_state/shard_0_1')}
        return read_common(d / 'common.pt')['args'].transformer_impl, keys
    for argv, out in ((('--tp', '1'), 'kept'), (('--transformer-impl', 'local'), 'local'), ((), 'from_hf')):
        src = hf if out == 'from_hf' else tmp_path / 'te'
        p = cli('convert', str(src), '--to', 'megatron', '--out', str(tmp_path / out), *argv)
        assert p.returncode == 0, p.stderr[-2000:]
    te = impl_and_keys(tmp_path / 'te')
    assert te == ('transformer_engine', {'decoder.final_layernorm._extra_state/shard_0_1'})
    assert impl_and_keys(tmp_path / 'kept') == te
    assert impl_and_keys(tmp_path / 'local') == impl_and_keys(tmp_path / 'from_hf') == ('local', set())
    convert(tmp_path / 'kept', 'hf', tmp_path / 'back')
    same_hf(hf, tmp_path / 'back')
