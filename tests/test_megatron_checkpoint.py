"""Megatron-LM's torch_dist checkpoints read as nxpretrain's GPT: megatron-core 0.16.1 (PyPI) saves its own GPTModel
on CPU with its own `dist_checkpointing.save` – at TP 1 from one process and at TP 2 from two gloo processes – into
a job folder laid out as a Megatron-LM job writes it; `read_megatron_checkpoint` + `build_model` + `load_state_dict`
then give megatron-core's logits. Also: tied and untied heads, the local spec's norm names, per-layer keys, a bf16
save, a vocabulary Megatron-LM pads further than we do, and one-line errors for the folders and recipes that do not
fit. megatron-core cannot build its TransformerEngine spec without TransformerEngine, but its local spec saves the
norms under TE's names anyway; the local names are tested on a save whose keys are renamed."""
import datetime, os, pickle, shutil, sys, zlib
from pathlib import Path
import pytest, torch
from mcore_ranks import run_ranks
from nxpretrain.config import to_yaml
from nxpretrain.errors import CheckpointError, RecipeError
from nxpretrain.engines.megatron.checkpoint import (LOCAL_NORMS, TE_NORMS, TRACKER, megatron_padded_vocab,
                                                   read_megatron_checkpoint)
from nxpretrain.models.args import padded_vocab
from nxpretrain.models.registry import build_model
from nxpretrain.recipes import get_recipe

pytest.importorskip('megatron.core')
BENCH = Path(__file__).resolve().parents[1] / 'bench'
SHAPE = ('model.n_layers=2', 'model.hidden=64', 'model.n_heads=4', 'model.seq_len=16', 'model.dropout=0.0')
ITERATION = 10


def small_recipe(tp: int, tied: bool, vocab: int = 100, divisible: int = 64, *more):
    "A small GPT-3 recipe of the Megatron-LM engine (gpt3_125m's), trained at tensor-parallel `tp`."
    padding = f'model.make_vocab_size_divisible_by={divisible}'
    return get_recipe('gpt3_125m', *SHAPE, f'model.vocab_size={vocab}', padding,
                      f'model.tie_embeddings={str(tied).lower()}', f'parallel.tp={tp}', *more)


# name → (recipe, how the save differs); TP 1 saves come from one process, TP 2 saves from two
SAVES_TP1 = {'tied': (small_recipe(1, True), ''), 'untied': (small_recipe(1, False), ''),
             'local_names': (small_recipe(1, True), 'local_names'), 'per_layer': (small_recipe(1, False), 'per_layer'),
             'bf16': (small_recipe(1, True), 'bf16')}
# vocabulary 60 at TP 2: Megatron-LM pads to a multiple of 64 × 2 = 128 rows, nxpretrain to lcm(64, 2) = 64
SAVES_TP2 = {'tp2_tied': (small_recipe(2, True, vocab=60), ''), 'tp2_untied': (small_recipe(2, False), '')}


def tokens(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))


def randomize(model, tp_rank: int):
    "Every parameter random; a TP shard from its rank's own seed, a replicated one equal on every rank."
    for name, p in model.named_parameters():
        sharded = getattr(p, 'tensor_model_parallel', False)
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()) + (7919 * tp_rank if sharded else 0))
        p.data.copy_(torch.randn(p.shape, generator=g) * 0.3)


def rename_norms(sharded_state_dict):
    "The save's norm keys under megatron-core's local spec module names instead of TransformerEngine's."
    for sh in sharded_state_dict.values():
        for te, local in zip(TE_NORMS, LOCAL_NORMS): sh.key = sh.key.replace(te, local)


def save_megatron(out: str, saves: dict) -> dict:
    """In a fresh gloo world of TP ranks: per save, megatron-core's GPTModel of the recipe (random weights), its logits
    (gathered over TP) and its torch_dist save with megatron-core's own `dist_checkpointing.save` + tracker."""
    sys.path.insert(0, str(BENCH))
    import mcore_gpt
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    logits = {}
    for name, (r, variant) in saves.items():
        tp = r.parallel.tp
        model, spec = mcore_gpt.megatron_gpt(r.model, megatron_padded_vocab(r.model, tp), 'cpu', tp)
        mcore_gpt.cpu_save_shims()
        randomize(model.eval(), parallel_state.get_tensor_model_parallel_rank())
        x = tokens(r.model.vocab_size)
        causal = torch.ones(1, 1, 16, 16, dtype=torch.bool).triu(1)
        if variant == 'bf16': model.bfloat16().float()   # the weights the bf16 save holds, run in fp32
        with torch.no_grad(): shard = model(x, torch.arange(16)[None].expand_as(x), causal)
        parts = [torch.empty_like(shard) for _ in range(tp)]
        dist.all_gather(parts, shard.contiguous())
        logits[name] = torch.cat(parts, -1)
        if variant == 'bf16': model.bfloat16()
        metadata = {'non_homogeneous_layers': True} if variant == 'per_layer' else None
        sharded = model.sharded_state_dict(metadata=metadata)
        if variant == 'local_names': rename_norms(sharded)
        checkpoints = Path(out) / name / r.name / 'checkpoints'
        dist_checkpointing.save(sharded, str(checkpoints / f'iter_{ITERATION:07d}'))
        if dist.get_rank() == 0: (checkpoints / TRACKER).write_text(str(ITERATION))
    return logits


def write_jobs(out: Path, saves: dict):
    "Each save's job folder as Megatron-LM's job leaves it: OUT/recipe.yaml and OUT/<recipe>/checkpoints/iter_N/."
    for name, (r, _) in saves.items():
        (out / name / r.name / 'checkpoints' / f'iter_{ITERATION:07d}').mkdir(parents=True)
        to_yaml(r, out / name / 'recipe.yaml')


def save_worker(rank: int, world: int, port: int, out: str, saves: dict):
    "One rank of a gloo world that saves `saves` (megatron-core's writer forks its own workers: not a daemon)."
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.distributed.init_process_group('gloo', rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        logits = save_megatron(out, saves)
        if rank == 0: torch.save(logits, Path(out) / f'logits_world{world}.pt')
    finally: torch.distributed.destroy_process_group()


def spawn_saves(world: int, out: Path, saves: dict, timeout: float = 120) -> dict:
    "megatron-core's logits of `saves`, saved by `world` fresh processes (megatron-core keeps global state)."
    preload = ['megatron.core.models.gpt.gpt_model', 'megatron.core.dist_checkpointing']
    run_ranks(save_worker, (str(out), saves), world, preload, timeout, f"megatron-core's saves at world {world}")
    return torch.load(out / f'logits_world{world}.pt', weights_only=True)


@pytest.fixture(scope='module')
def jobs(tmp_path_factory):
    "(folder of the job folders, {save: megatron-core's logits})."
    out = tmp_path_factory.mktemp('megatron_jobs')
    write_jobs(out, SAVES_TP1 | SAVES_TP2)
    return out, spawn_saves(1, out, SAVES_TP1) | spawn_saves(2, out, SAVES_TP2)


def our_logits(path, vocab: int):
    "Our GPT built from the recipe, loaded from the Megatron-LM checkpoint at `path`: its logits on the tokens."
    r, names, take = read_megatron_checkpoint(path)
    model = build_model(r.model, padded_vocab(r.model, r.parallel.tp)).eval()
    model.load_state_dict({n: take(n) for n in names})
    with torch.no_grad(): return model(tokens(vocab))


def one_line_error(kind, fn) -> str:
    with pytest.raises(kind) as e: fn()
    assert '\n' not in str(e.value), str(e.value)
    return str(e.value)


@pytest.mark.parametrize('name', [*SAVES_TP1, *SAVES_TP2])
def test_our_gpt_from_megatron_checkpoint_gives_megatron_logits(jobs, name):
    out, logits = jobs
    r = (SAVES_TP1 | SAVES_TP2)[name][0]
    ours = our_logits(out / name / r.name / 'checkpoints', r.model.vocab_size)
    rows = padded_vocab(r.model, r.parallel.tp)     # the rows beyond are Megatron-LM's extra padding
    torch.testing.assert_close(ours, logits[name][..., :rows], atol=1e-5, rtol=0)


def test_the_reader_sees_the_layout_megatron_core_saves(jobs):
    out, _ = jobs
    from nxpretrain.train.checkpoint import safe_reader
    d = out / 'tp2_tied' / 'gpt3_125m' / 'checkpoints' / f'iter_{ITERATION:07d}'
    assert {p.name for p in d.iterdir()} >= {'.metadata', 'metadata.json', 'common.pt', '__0_0.distcp', '__1_0.distcp'}
    saved = safe_reader(d).read_metadata().state_dict_metadata
    qkv = saved['decoder.layers.self_attention.linear_qkv.weight']
    assert tuple(qkv.size) == (2, 3 * 64, 64) and qkv.properties.dtype == torch.float32
    # one chunk per layer and TP rank: the layer axis leads, TP splits the rows
    assert sorted(tuple(c.offsets) for c in qkv.chunks) == [(0, 0, 0), (0, 96, 0), (1, 0, 0), (1, 96, 0)]
    assert tuple(saved['embedding.word_embeddings.weight'].size) == (128, 64)
    assert 'decoder.layers.self_attention.linear_qkv.layer_norm_weight' in saved and 'output_layer.weight' not in saved
    _, names, take = read_megatron_checkpoint(d)
    assert take('tok_embeddings.weight').shape == (64, 64) and 'output.weight' in names
    _, _, take = read_megatron_checkpoint(out / 'bf16' / 'gpt3_125m')    # the run folder: the tracker's save
    assert take('layers.1.attention.wv.weight').dtype == torch.bfloat16


def test_common_pt_is_never_unpickled(jobs, tmp_path):
    out, _ = jobs
    job = tmp_path / 'job'
    shutil.copytree(out / 'tied', job)
    marker = tmp_path / 'unpickled'
    class Trap:
        def __reduce__(self): return (Path.touch, (marker,))
    common = job / 'gpt3_125m' / 'checkpoints' / f'iter_{ITERATION:07d}' / 'common.pt'
    common.write_bytes(pickle.dumps(Trap()))
    _, names, take = read_megatron_checkpoint(job / 'gpt3_125m' / 'checkpoints')
    for n in names: take(n)
    assert not marker.exists()


def test_bad_folders_fail_in_one_line_before_reading(jobs, tmp_path):
    out, _ = jobs
    job = tmp_path / 'job'
    shutil.copytree(out / 'tied', job)
    checkpoints = job / 'gpt3_125m' / 'checkpoints'
    save = checkpoints / f'iter_{ITERATION:07d}'
    assert 'neither a Megatron-LM save' in one_line_error(CheckpointError, lambda: read_megatron_checkpoint(job))
    partial = checkpoints / 'iter_0000020'
    shutil.copytree(save, partial)
    (partial / '.metadata').unlink()
    (checkpoints / TRACKER).write_text('20')
    assert 'a partial save' in one_line_error(CheckpointError, lambda: read_megatron_checkpoint(checkpoints))
    (checkpoints / TRACKER).write_text('30')
    run = job / 'gpt3_125m'
    assert 'iter_0000030: no such folder' in one_line_error(CheckpointError, lambda: read_megatron_checkpoint(run))
    (checkpoints / TRACKER).write_text('release')
    assert 'names no iteration' in one_line_error(CheckpointError, lambda: read_megatron_checkpoint(checkpoints))
    torch_format = checkpoints / 'iter_0000040'
    (torch_format / 'mp_rank_00').mkdir(parents=True)
    assert '--ckpt-format torch' in one_line_error(CheckpointError, lambda: read_megatron_checkpoint(torch_format))
    lonely = tmp_path / 'copied' / 'iter_0000010'
    shutil.copytree(save, lonely)
    assert 'no recipe.yaml' in one_line_error(RecipeError, lambda: read_megatron_checkpoint(lonely))
    (save / '__0_1.distcp').unlink()
    assert '__0_1.distcp: no bytes' in one_line_error(CheckpointError, lambda: read_megatron_checkpoint(save))


def test_a_recipe_that_does_not_fit_fails_in_one_line(jobs):
    out, _ = jobs
    tied, untied = (out / name / 'gpt3_125m' / 'checkpoints' for name in ('tied', 'untied'))
    def error(path, *overrides, tied=True):
        recipe = small_recipe(1, tied, 100, 64, *overrides)
        return one_line_error(CheckpointError, lambda: read_megatron_checkpoint(path, recipe))
    wider = error(tied, 'model.hidden=128')
    assert 'word_embeddings.weight is [128, 64], the model of recipe= needs [128, 128]' in wider
    assert 'layer_norm_weight is [2, 64], the model of recipe= needs [3, 64]' in error(tied, 'model.n_layers=3')
    assert 'embedding.word_embeddings.weight is [128, 64]' in error(tied, 'model.vocab_size=200')
    assert "no 'output_layer.weight'" in error(tied, tied=False)
    assert 'model.tie_embeddings=false' in error(untied)
    llama = get_recipe('llama3_tiny')
    assert "model.arch='llama'" in one_line_error(RecipeError, lambda: read_megatron_checkpoint(tied, llama))


def test_unsafe_metadata_is_refused(jobs, tmp_path):
    out, _ = jobs
    save = tmp_path / 'iter_0000010'
    shutil.copytree(out / 'tied' / 'gpt3_125m' / 'checkpoints' / f'iter_{ITERATION:07d}', save)
    (save / '.metadata').write_bytes(pickle.dumps(os.getcwd))    # a pickle naming a function, not DCP metadata
    job = get_recipe('gpt3_125m', *SHAPE, 'model.vocab_size=100', 'model.make_vocab_size_divisible_by=64')
    assert 'refusing to load it' in one_line_error(CheckpointError, lambda: read_megatron_checkpoint(save, job))


def test_metadata_with_seed2s_mcore_data_is_read(jobs, tmp_path):
    "Megatron-LM at e958b2ca also pickles `mcore_data` (plain dicts of shapes) into .metadata: still safe to read."
    from nxpretrain.train.checkpoint import safe_reader
    out, _ = jobs
    save = tmp_path / 'iter_0000010'
    shutil.copytree(out / 'tied' / 'gpt3_125m' / 'checkpoints' / f'iter_{ITERATION:07d}', save)
    metadata = safe_reader(save).read_metadata()
    metadata.mcore_data = {'optimizer.distributed.dp_group_idx_0.gp_0.fp32_param':
                           {'nd_reformulated_orig_global_shape': torch.Size([2, 192, 64])}}
    (save / '.metadata').write_bytes(pickle.dumps(metadata))
    _, names, take = read_megatron_checkpoint(save, SAVES_TP1['tied'][0])
    _, _, take_original = read_megatron_checkpoint(out / 'tied' / 'gpt3_125m' / 'checkpoints')
    assert all(torch.equal(take(n), take_original(n)) for n in names)


@pytest.mark.parametrize('name', ['tied', 'tp2_untied'])
def test_evaluate_and_export_hf_take_a_megatron_checkpoint(jobs, tmp_path, name):
    """The engine that wrote the folder is found from it: evaluation loads it, export-hf makes a transformers model of
    it."""
    import subprocess
    from transformers import GPT2LMHeadModel
    from nxpretrain.evaluate import load_model
    from data_helpers import train_bpe, demo_documents
    out, logits = jobs
    r = (SAVES_TP1 | SAVES_TP2)[name][0]
    save = out / name / r.name / 'checkpoints' / f'iter_{ITERATION:07d}'
    rows = padded_vocab(r.model, r.parallel.tp)
    model, recipe = load_model(save)
    assert recipe.engine == 'megatron' and recipe.parallel.tp == r.parallel.tp
    with torch.no_grad(): ours = model(tokens(r.model.vocab_size))
    torch.testing.assert_close(ours, logits[name][..., :rows], atol=1e-5, rtol=0)
    hf = tmp_path / 'hf'
    root = Path(__file__).resolve().parents[1]
    gpt2 = tmp_path / 'runs' / 'data' / 'gpt2'        # the GPT-2 files the job read (--vocab-file, --merge-file)
    gpt2.mkdir(parents=True)
    train_bpe(demo_documents()[:200], 300).tok.model.save(str(gpt2))
    argv = ['export-hf', str(save), str(hf), '--data-dir', str(gpt2.parent)]   # the job's data root, not the cwd's
    p = subprocess.run([sys.executable, '-c', f"from nxpretrain.cli import main; main({argv!r})"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, 'PYTHONPATH': str(root)})
    assert p.returncode == 0, p.stderr[-2000:]
    with torch.no_grad(): theirs = GPT2LMHeadModel.from_pretrained(hf).eval()(tokens(r.model.vocab_size)).logits
    torch.testing.assert_close(theirs[..., :r.model.vocab_size], logits[name][..., :r.model.vocab_size], atol=1e-5,
                               rtol=0)
    assert (hf / 'tokenizer.json').exists() and (hf / 'generation_config.json').exists()
