"""`nxpretrain convert` against megatron-core 0.16.1 (PyPI) as the oracle, on this CPU:

- HF GPT and Llama-GQA models → `convert --to megatron` at TP 1 and 2 → megatron-core's own `dist_checkpointing.load`
  (strict: every key it asks for, nothing unexpected) and `load_state_dict(strict=True)` into its GPTModel, whose
  logits equal transformers' within 1e-5;
- a megatron-core save with Megatron-LM's args in common.pt (an AttnBackend enum among them) and no recipe.yaml
  anywhere → `nxpretrain convert --to hf` → a transformers model with megatron-core's logits;
- a recipe.yaml with a wrong head count beside that save → refused in one line, no output folder;
- `--transformer-impl transformer_engine` (Megatron-LM's GPU default): megatron-core's local-spec model finds every key
  it asks for, the save's only other key is the one TransformerEngine's spec adds (`format.yaml`), each `_extra_state`
  holds TE's empty uint8 tensor, the logits equal transformers', and the save reads back into HF; megatron-core
  cannot build the TE spec itself without transformer_engine (the NameError recorded)."""
import argparse, datetime, os, subprocess, sys
from pathlib import Path
import pytest, torch
from nxpretrain.models.args import ModelConfig
from mcore_ranks import run_ranks

pytest.importorskip('megatron.core')
ROOT = Path(__file__).resolve().parents[1]
SEQ = 16
GPT = ModelConfig(arch='gpt', n_layers=2, hidden=64, n_heads=4, vocab_size=100, seq_len=SEQ,
                  make_vocab_size_divisible_by=64)
LLAMA = ModelConfig(arch='llama', n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=96, vocab_size=100,
                    seq_len=SEQ, rope_theta=500000.0, tie_embeddings=False, make_vocab_size_divisible_by=64,
                    norm_eps=1e-5)
# name → (model, TP of the conversion, tied)
CASES = {'gpt_tp1': (GPT, 1), 'gpt_untied_tp2': (ModelConfig(**{**vars(GPT), 'tie_embeddings': False}), 2),
         'llama_tp1': (LLAMA, 1), 'llama_tp2': (LLAMA, 2)}
SAVES = {'llama_saved_tp2': (LLAMA, 2)}      # saved by megatron-core itself, Megatron-LM's args in common.pt
TE = {'llama_te_tp2': (LLAMA, 2), 'gpt_te_tp1': (GPT, 1)}   # written for TransformerEngine's spec


def tokens(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(0))


def hf_model(cfg: ModelConfig, seed: int = 0):
    "A transformers model of `cfg` with weights of order one (so a wrong head order shows)."
    import transformers
    from nxpretrain.models.hf_mapping import to_hf_config, randomize_
    from nxpretrain.models.registry import family
    hf_cfg = to_hf_config(cfg)
    model = getattr(transformers, family(cfg.arch).hf.architecture)(hf_cfg)
    return randomize_(model.float().eval(), std=0.5, seed=seed)


def megatron_model(cfg: ModelConfig, vocab: int, tp: int, pp: int = 1):
    "megatron-core's GPTModel of `cfg` (local spec) on the CPU, this rank's TP shard of its pipeline stage at PP `pp`."
    import torch.nn.functional as F
    sys.path.insert(0, str(ROOT / 'bench'))
    import mcore_gpt
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core import parallel_state
    mcore_gpt.init_megatron('cpu', tp, pp)
    llama = cfg.arch == 'llama'
    shape = dict(normalization='RMSNorm', gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                 num_query_groups=cfg.kv_heads) if llama else {}
    config = TransformerConfig(num_layers=cfg.n_layers, hidden_size=cfg.hidden, num_attention_heads=cfg.n_heads,
                               ffn_hidden_size=cfg.ffn, layernorm_epsilon=cfg.norm_eps, hidden_dropout=0.0,
                               attention_dropout=0.0, use_cpu_initialization=True, bias_activation_fusion=False,
                               bias_dropout_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
                               gradient_accumulation_fusion=False, tensor_model_parallel_size=tp,
                               pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32 if pp > 1 else None,
                               **shape)
    spec = specs.get_gpt_layer_local_spec(normalization='RMSNorm' if llama else 'LayerNorm')
    positions = dict(position_embedding_type='rope', rotary_base=int(cfg.rope_theta)) if llama else \
        dict(position_embedding_type='learned_absolute')
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=vocab, max_sequence_length=cfg.positions,
                    share_embeddings_and_output_weights=cfg.tie_embeddings, **positions,
                    pre_process=parallel_state.is_pipeline_first_stage(),
                    post_process=parallel_state.is_pipeline_last_stage()).eval()


def megatron_logits(model, vocab: int, tp: int) -> torch.Tensor:
    "megatron-core's logits on the tokens, gathered over TP."
    import torch.distributed as dist
    x = tokens(vocab)
    causal = torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool).triu(1)
    with torch.no_grad(): shard = model(x, torch.arange(SEQ)[None].expand_as(x), causal)
    parts = [torch.empty_like(shard) for _ in range(tp)]
    dist.all_gather(parts, shard.contiguous())
    return torch.cat(parts, -1)


def load_and_save(out: str, world: int):
    """In this rank of a gloo world of `world`: each converted case loaded by megatron-core (strict), its logits; each
    save case made by megatron-core with Megatron-LM's args, its logits."""
    import zlib
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.validation import StrictHandling
    from megatron.core.transformer.enums import AttnBackend
    from nxpretrain.engines.megatron.format import megatron_args, megatron_vocab
    sys.path.insert(0, str(ROOT / 'bench'))
    import mcore_gpt
    mcore_gpt.cpu_save_shims()
    logits = {}
    for name, (cfg, tp) in CASES.items():
        if tp != world: continue
        model = megatron_model(cfg, megatron_vocab(cfg, tp), tp)
        state = dist_checkpointing.load(model.sharded_state_dict(), str(Path(out) / name / 'release'),
                                        strict=StrictHandling.RAISE_ALL)
        common = {k: state.pop(k) for k in ('args', 'checkpoint_version', 'iteration')}   # common.pt's
        assert common['args'].tensor_model_parallel_size == tp and common['checkpoint_version'] == 3.0
        model.load_state_dict(state, strict=True)
        logits[name] = megatron_logits(model, cfg.vocab_size, tp)
    for name, (cfg, tp) in TE.items():                  # the local spec's model: what it asks for, what else is there
        if tp != world: continue
        model = megatron_model(cfg, megatron_vocab(cfg, tp), tp)
        state, ckpt_only, model_only = dist_checkpointing.load(model.sharded_state_dict(), str(Path(out) / name /
                                                               'release'), strict=StrictHandling.RETURN_ALL)
        logits[f'{name} ckpt_only'], logits[f'{name} model_only'] = sorted(ckpt_only), sorted(model_only)
        extra = [v for k, v in state.items() if k.endswith('._extra_state')]
        logits[f'{name} extra_state'] = [(str(v.dtype), v.numel()) if torch.is_tensor(v) else repr(v) for v in extra]
        for k in [k for k in state if k.endswith('._extra_state')]: state[k] = None   # the local spec's own value
        for k in ('args', 'checkpoint_version', 'iteration'): state.pop(k)
        model.load_state_dict(state, strict=True)
        logits[name] = megatron_logits(model, cfg.vocab_size, tp)
    for name, (cfg, tp) in SAVES.items():
        if tp != world: continue
        model = megatron_model(cfg, megatron_vocab(cfg, tp), tp)
        rank = parallel_state.get_tensor_model_parallel_rank()
        for n, p in model.named_parameters():
            sharded = getattr(p, 'tensor_model_parallel', False)
            g = torch.Generator().manual_seed(zlib.crc32(n.encode()) + (7919 * rank if sharded else 0))
            norm = 'norm' in n
            p.data.copy_(torch.randn(p.shape, generator=g) * (0.05 if norm else 0.15) + (1 if norm else 0))
        logits[name] = megatron_logits(model, cfg.vocab_size, tp)
        args = argparse.Namespace(**vars(megatron_args(cfg, tp, 1)), attention_backend=AttnBackend.auto,
                                  params_dtype=torch.float32, tokenizer_type='NullTokenizer')
        checkpoints = Path(out) / name / 'checkpoints'
        common = dict(args=args, checkpoint_version=3.0, iteration=10)
        dist_checkpointing.save(model.sharded_state_dict() | common, str(checkpoints / 'iter_0000010'))
        if dist.get_rank() == 0: (checkpoints / 'latest_checkpointed_iteration.txt').write_text('10')
    return logits


def worker(rank: int, world: int, port: int, out: str):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.distributed.init_process_group('gloo', rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        logits = load_and_save(out, world)
        if rank == 0: torch.save(logits, Path(out) / f'logits_world{world}.pt')
    finally: torch.distributed.destroy_process_group()


def spawn(world: int, out: Path, timeout: float = 180) -> dict:
    "megatron-core's logits of the cases at TP `world`, from `world` fresh processes (megatron keeps global state)."
    run_ranks(worker, (str(out),), world, ['megatron.core.models.gpt.gpt_model', 'megatron.core.dist_checkpointing'],
              timeout, f"megatron-core at world {world}")
    return torch.load(out / f'logits_world{world}.pt', weights_only=True)


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
    "(folder, {case: transformers' logits}, {case: megatron-core's logits}): HF models converted, loaded by mcore."
    from nxpretrain.convert.convert import convert
    out = tmp_path_factory.mktemp('convert_megatron')
    theirs = {}
    for name, (cfg, tp) in CASES.items():
        model = hf_model(cfg)
        model.save_pretrained(out / f'{name}_hf')
        with torch.no_grad(): theirs[name] = model(tokens(cfg.vocab_size)).logits
        convert(out / f'{name}_hf', 'megatron', out / name, tp=tp)
    for name, (cfg, tp) in TE.items():
        model = hf_model(cfg, seed=1)
        model.save_pretrained(out / f'{name}_hf')
        with torch.no_grad(): theirs[name] = model(tokens(cfg.vocab_size)).logits
        convert(out / f'{name}_hf', 'megatron', out / name, tp=tp, transformer_impl='transformer_engine')
    for name in SAVES: (out / name / 'checkpoints' / 'iter_0000010').mkdir(parents=True)
    return out, theirs, spawn(1, out) | spawn(2, out)


@pytest.mark.parametrize('name', list(CASES))
def test_megatron_core_loads_what_convert_writes_strictly_with_transformers_logits(converted, name):
    out, theirs, megatron = converted
    cfg, _ = CASES[name]
    assert (out / name / 'latest_checkpointed_iteration.txt').read_text() == 'release'
    torch.testing.assert_close(megatron[name][..., :cfg.vocab_size], theirs[name], atol=1e-5, rtol=0)


def cli(*argv, cwd=None):
    code = f"from nxpretrain.cli import main; main({[str(a) for a in argv]!r})"
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, 'PYTHONPATH': str(ROOT)})


def test_a_megatron_core_save_with_no_recipe_converts_to_transformers(converted, tmp_path):
    from transformers import LlamaForCausalLM
    out, _, megatron = converted
    cfg, _ = SAVES['llama_saved_tp2']
    assert not list(out.rglob('recipe.yaml'))
    p = cli('convert', out / 'llama_saved_tp2' / 'checkpoints', '--to', 'hf', '--out', tmp_path / 'hf', cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    with torch.no_grad(): hf = LlamaForCausalLM.from_pretrained(tmp_path / 'hf').eval()(tokens(cfg.vocab_size)).logits
    torch.testing.assert_close(hf, megatron['llama_saved_tp2'][..., :cfg.vocab_size], atol=1e-5, rtol=0)


def test_a_wrong_head_count_beside_the_save_is_refused_in_one_line(converted, tmp_path):
    import shutil
    from nxpretrain.config import to_yaml
    from nxpretrain.recipes import get_recipe
    out, _, _ = converted
    job = tmp_path / 'job'
    shutil.copytree(out / 'llama_saved_tp2', job)
    wrong = get_recipe('llama3_tiny', 'model.n_layers=2', 'model.hidden=64', 'model.n_heads=8', 'model.n_kv_heads=2',
                       'model.ffn_hidden=96', 'model.vocab_size=100', 'model.tie_embeddings=false',
                       'model.rope_theta=500000', 'model.make_vocab_size_divisible_by=64', 'model.norm_eps=1e-5')
    to_yaml(wrong, job / 'checkpoints' / 'iter_0000010' / 'recipe.yaml')
    p = cli('convert', job / 'checkpoints', '--to', 'hf', '--out', tmp_path / 'hf', cwd=tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    line = p.stderr.strip()
    assert '\n' not in line and 'n_heads: 4 vs 8' in line, line
    assert not (tmp_path / 'hf').exists() and [q.name for q in tmp_path.iterdir()] == ['job']


@pytest.mark.parametrize('name', list(TE))
def test_a_transformer_engine_save_holds_megatron_cores_keys_and_tes_extra_state(converted, name, tmp_path):
    from safetensors.torch import load_file
    from nxpretrain.convert.convert import convert
    from nxpretrain.engines.megatron.args import megatron_facts
    from nxpretrain.engines.megatron.args import read_common
    out, theirs, megatron = converted
    cfg, _ = TE[name]
    te = megatron_facts()['transformer_engine']
    assert megatron[f'{name} model_only'] == []                                # every key megatron-core asks for
    assert megatron[f'{name} ckpt_only'] == [f'{m}._extra_state' for m in te['model_extra_state']]
    assert megatron[f'{name} extra_state'] == [('torch.uint8', 0)] * 4 * cfg.n_layers   # TE's, with no FP8
    torch.testing.assert_close(megatron[name][..., :cfg.vocab_size], theirs[name], atol=1e-5, rtol=0)
    assert read_common(out / name / 'release' / 'common.pt')['args'].transformer_impl == 'transformer_engine'
    convert(out / name, 'hf', tmp_path / 'hf')                                  # a TE-spec save read into HF
    a, b = load_file(out / f'{name}_hf' / 'model.safetensors'), load_file(tmp_path / 'hf' / 'model.safetensors')
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_megatron_core_cannot_build_the_te_spec_without_transformer_engine():
    "What stops reading the TE key set from megatron-core's own spec on this CPU, as format.yaml records it."
    import importlib.util
    from nxpretrain.engines.megatron.args import megatron_facts
    if importlib.util.find_spec('transformer_engine') is not None: pytest.skip('transformer_engine is installed')
    from megatron.core.models.gpt import gpt_layer_specs
    with pytest.raises(NameError) as e: gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    assert megatron_facts()['transformer_engine']['without_te'].startswith(f"NameError: {e.value}")
