"""The whole training state, nxpretrain → Megatron-LM → nxpretrain, with megatron-core 0.16.1 (PyPI) as the oracle on
this CPU (its DDP wrapper and optimizer under `bench/mcore_gpt.cuda_on_cpu`, which names the CUDA-only calls):

- N steps of our engine on a `.bin/.idx` corpus; `nxpretrain convert step_N --to megatron`;
- megatron-core loads that save as Megatron-LM's `load_checkpoint` does: `dist_checkpointing.load` (strict: RAISE_ALL)
  of the model's and of the optimizer's sharded state, `load_state_dict(strict=True)`, the optimizer's and
  `OptimizerParamScheduler`'s `load_state_dict`; the iteration, `consumed_train_samples`, Adam's step and moments
  and the scheduler's position equal ours;
- it trains M more steps on the same corpus through its own `GPTDataset`: every loss equals the uninterrupted run's
  within the equality matrix's tolerance (`testing.layouts.TOLERANCE`), and a continuation with a fresh optimizer
  does not (the test can fail);
- its save after one of those steps (as Megatron-LM's `save_checkpoint` writes it) → `nxpretrain convert --to
  native` → our engine resumes and the remaining losses equal the uninterrupted run's.

At --pp 2 (gpt_pp2: the tied embedding on both stages; llama_gqa_pp2: untied) each rank builds its pipeline stage,
strict-loads its share, and the M steps go through megatron-core's own 1F1B schedule (`get_forward_backward_func`, p2p
over gloo) with `finalize_model_grads` (the tied embedding's gradient all-reduced between the stages: without it the
gpt_pp2 curve leaves by 4.7e-4, measured)."""
import datetime, json, os, subprocess, sys
from pathlib import Path
import numpy as np
import pytest, torch
from mcore_ranks import run_ranks

pytest.importorskip('megatron.core')
ROOT = Path(__file__).resolve().parents[1]
N, M = 3, 3                       # steps before the conversion, steps after it
STEPS, BATCH, MICRO, SEQ = N + M, 4, 2, 16
RECIPE = ['model.n_layers=2', 'model.hidden=64', 'model.n_heads=4', 'model.vocab_size=100', 'model.seq_len=16',
          'model.make_vocab_size_divisible_by=64', 'data.micro_batch=2', 'data.global_batch=4', 'trainer.threads=1',
          'trainer.eval_every=0', 'trainer.log_every=1', f'trainer.save_every={N}', 'parallel.precision=fp32',
          'optim.warmup_steps=2', 'optim.lr=3e-3', 'optim.min_lr=3e-4', f'trainer.max_steps={STEPS}']
# case → (recipe, its overrides, Megatron-LM's TP, PP): our run is TP 1, PP 1; megatron-core goes on at this layout
# (PP 2: each stage's GPTModel on its rank, its 1F1B schedule with p2p over gloo; GPT's embedding tied, Llama's not)
CASES = {'gpt_tp1': ('gpt3_tiny', ['model.max_position=null', 'model.ffn_hidden=null'], 1, 1),
         'gpt_pp2': ('gpt3_tiny', ['model.max_position=null', 'model.ffn_hidden=null'], 1, 2),
         'llama_gqa_tp2': ('llama3_tiny', ['model.n_kv_heads=2', 'model.ffn_hidden=96'], 2, 1),
         'llama_gqa_pp2': ('llama3_tiny', ['model.n_kv_heads=2', 'model.ffn_hidden=96'], 1, 2),
         'llama_bf16_tp2': ('llama3_tiny', ['model.n_kv_heads=2', 'model.ffn_hidden=96', 'parallel.precision=bf16'], 2,
                            1)}


def recipe(case: str, corpus: Path):
    from nxpretrain.recipes import get_recipe
    name, overrides, _, _ = CASES[case]
    return get_recipe(name, f'data.corpus={corpus}', 'data.tokenizer=demo', *RECIPE, *overrides)


def cli(*argv):
    code = f"from nxpretrain.cli import main; main({[str(a) for a in argv]!r})"
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, 'PYTHONPATH': str(ROOT)})


def megatron_setup(r, load: Path, optimizer_state: bool, tp: int, pp: int = 1):
    """megatron-core's GPTModel of `r` (this rank's pipeline stage), its DDP wrapper, optimizer and scheduler (made from
    the save's args as Megatron-LM's `get_megatron_optimizer` / `get_optimizer_param_scheduler` make them), loaded from
    the save `load` as `load_checkpoint` loads it; `optimizer_state=False`: the weights only, Adam afresh."""
    sys.path.insert(0, str(ROOT / 'tests'))
    from test_convert_megatron import megatron_model
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import get_megatron_optimizer, OptimizerConfig
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from nxpretrain.engines.megatron.format import megatron_vocab
    from megatron.core.transformer.module import Float16Module
    args = torch.load(load / 'common.pt', weights_only=False)['args']      # Megatron-LM reads it so
    model = megatron_model(r.model, megatron_vocab(r.model, tp), tp, pp).train()
    if args.bf16:          # --bf16: Megatron-LM's get_model wraps the model in Float16Module (its weights in bf16)
        model.config.bf16, model.config.params_dtype = True, torch.bfloat16
        model = Float16Module(model.config, model)
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    config = OptimizerConfig(optimizer='adam', lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
                             adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                             clip_grad=args.clip_grad, bf16=args.bf16,
                             params_dtype=torch.bfloat16 if args.bf16 else torch.float32,
                             use_distributed_optimizer=False)
    optimizer = get_megatron_optimizer(config, [ddp])
    B = args.global_batch_size
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=args.lr_warmup_init, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=args.lr_warmup_iters * B, lr_decay_steps=args.lr_decay_iters * B,
        lr_decay_style=args.lr_decay_style, start_wd=args.start_weight_decay, end_wd=args.end_weight_decay,
        wd_incr_steps=args.train_iters * B, wd_incr_style=args.weight_decay_incr_style)
    sharded = dict(model=model.sharded_state_dict())
    if optimizer_state: sharded['optimizer'] = optimizer.sharded_state_dict(sharded, is_loading=True)
    # with the optimizer: every key the checkpoint holds is asked for; without: --finetune's weights, its default
    strict = StrictHandling.RAISE_ALL if optimizer_state else StrictHandling.ASSUME_OK_UNEXPECTED
    state = dist_checkpointing.load(sharded, str(load), strict=strict)
    model.load_state_dict(state['model'], strict=True)
    if optimizer_state:
        optimizer.load_state_dict(state['optimizer'])
        scheduler.load_state_dict(state['opt_param_scheduler'])
    else: scheduler.step(increment=state['args'].consumed_train_samples)
    return model, ddp, optimizer, scheduler, state


POSITIONS = torch.arange(SEQ)[None]
CAUSAL = torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool).triu(1)


def pipeline_step(ddp, micro: list) -> float:
    """One iteration's forwards and backwards of the micro-batches `micro` through megatron-core's own schedule
    (`get_forward_backward_func`: 1F1B, p2p over gloo; `finalize_model_grads` as Megatron-LM's `train` sets it: the
    gradient sync and the tied embedding's all-reduce between the stages); its loss on the last stage, else NaN."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func
    ddp.config.finalize_model_grads_func = finalize_model_grads
    def forward_step(batches, model):
        x, y = next(batches)
        def loss_func(out):          # the schedule divides it by the number of micro-batches, in place
            loss = out.sum() / (MICRO * SEQ)
            return loss, {'loss': loss.detach().clone()}
        return model(x, POSITIONS.expand_as(x), CAUSAL, labels=y), loss_func
    reduced = get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(micro), model=[ddp],
                                          num_microbatches=len(micro), seq_length=SEQ, micro_batch_size=MICRO)
    return sum(d['loss'].item() for d in reduced) / len(micro) if reduced else float('nan')


def megatron_steps(ddp, optimizer, scheduler, dataset, consumed: int, steps: int, after_step=None) -> tuple:
    """(losses, learning rates) of `steps` Megatron-LM iterations from sample `consumed`: its micro-batches, its step
    (at PP > 1 through its pipeline schedule; the losses are the last stage's)."""
    from megatron.core import parallel_state
    losses, lrs = [], []
    for k in range(steps):
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        micro = []
        for start in range(consumed, consumed + BATCH, MICRO):   # Megatron-LM's sampler: consecutive samples
            items = [dataset[i] for i in range(start, start + MICRO)]
            micro.append(tuple(torch.stack([torch.as_tensor(it[key]) for it in items]).long()
                               for key in ('tokens', 'labels')))
        if parallel_state.get_pipeline_model_parallel_world_size() > 1: total = pipeline_step(ddp, micro)
        else:
            total = 0.0
            for x, y in micro:
                loss = ddp(x, POSITIONS.expand_as(x), CAUSAL, labels=y).sum() / (BATCH * SEQ)
                loss.backward()
                total += loss.item()
            ddp.finish_grad_sync()
        lrs.append(optimizer.param_groups[0]['lr'])
        updated, _, _ = optimizer.step()
        assert updated
        scheduler.step(increment=BATCH)
        consumed += BATCH
        losses.append(total)
        if after_step is not None: after_step(k + 1, consumed)
    return losses, lrs


def megatron_save(model, optimizer, scheduler, args, iteration: int, folder: Path):
    "What Megatron-LM's `save_checkpoint` writes (generate_state_dict, checkpointing.py:649-700; no RNG): iter_N."
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    d = folder / f'iter_{iteration:07d}'
    if dist.get_rank() == 0: d.mkdir(parents=True)
    dist.barrier()
    state = dict(args=args, checkpoint_version=3.0, iteration=iteration, model=model.sharded_state_dict())
    state['optimizer'] = optimizer.sharded_state_dict(state)
    state['opt_param_scheduler'] = scheduler.state_dict()
    dist_checkpointing.save(state, str(d))
    if dist.get_rank() == 0: (folder / 'latest_checkpointed_iteration.txt').write_text(str(iteration))


def moment_sums(optimizer) -> dict:
    """Each Adam moment's sum of absolute values over the whole model (TP shards summed, replicated tensors once,
    pipeline stages summed, the tied embedding once: the last stage's output-layer copy is left out)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    first = parallel_state.get_tensor_model_parallel_rank() == 0
    first_stage = parallel_state.is_pipeline_first_stage()
    sums = torch.zeros(2, dtype=torch.float64)
    for o in optimizer.chained_optimizers:
        for p, s in o.optimizer.state.items():
            if getattr(p, 'shared_embedding', False) and not first_stage: continue
            if getattr(p, 'tensor_model_parallel', False) or first:
                sums += torch.stack([s[m].double().abs().sum() for m in ('exp_avg', 'exp_avg_sq')])
    dist.all_reduce(sums)
    return dict(zip(('exp_avg', 'exp_avg_sq'), sums.tolist()))


def master_values(optimizer) -> dict:
    """bf16 runs: every fp32 master weight's value, sorted, over the whole model (TP shards gathered, replicated
    tensors once, zero padding rows left out), and whether each bf16 model weight is its master weight rounded."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    first = parallel_state.get_tensor_model_parallel_rank() == 0
    values, rounded = [], True
    for o in optimizer.chained_optimizers:
        for model_group, main_group in zip(o.float16_groups, o.fp32_from_float16_groups):
            for p, main in zip(model_group, main_group):
                rounded &= p.dtype == torch.bfloat16 and torch.equal(p.detach(), main.detach().bfloat16())
                if getattr(p, 'tensor_model_parallel', False) or first: values.append(main.detach().flatten())
    mine = torch.cat(values)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    merged = torch.cat(everyone)
    return dict(master=merged[merged != 0].sort().values, rounded=rounded)


def continue_in_megatron(out: str, case: str):
    "A gloo rank: load the converted save, check what was loaded, train M steps, save after the first; a control."
    import torch.distributed as dist
    sys.path.insert(0, str(ROOT / 'bench'))
    sys.path.insert(0, str(ROOT / 'tests'))
    import mcore_gpt
    from test_data_megatron import _megatron_gpt
    out, (_, _, tp, pp), rank = Path(out), CASES[case], dist.get_rank()
    r = recipe(case, out.parent / 'data' / 'corpus')
    mcore_gpt.cpu_save_shims()
    mcore_gpt.init_megatron('cpu', tp, pp)
    dataset = _megatron_gpt(out.parent / 'data' / 'corpus', SEQ, r.data.split, r.trainer.seed,
                            (STEPS * BATCH, None, None), out / 'mcache')[0]        # rank 0 builds it
    res = {}
    with mcore_gpt.cuda_on_cpu():
        model, ddp, optimizer, scheduler, state = megatron_setup(r, out / 'megatron' / f'iter_{N:07d}', True, tp, pp)
        args = state['args']
        adam = [s for o in optimizer.chained_optimizers for s in o.optimizer.state.values()]   # torch AdamW's
        from megatron.core import parallel_state
        gpt = getattr(model, 'module', model)                # under Float16Module with --bf16
        layers = [None] * dist.get_world_size()           # each rank's stage: its layers' global numbers
        dist.all_gather_object(layers, [layer.layer_number for layer in gpt.decoder.layers])
        res['loaded'] = dict(tp=parallel_state.get_tensor_model_parallel_world_size(),
                             pp=parallel_state.get_pipeline_model_parallel_world_size(), layers=layers,
                             args_layout=(args.tensor_model_parallel_size, args.pipeline_model_parallel_size),
                             qkv=tuple(gpt.decoder.layers[0].self_attention.linear_qkv.weight.shape),
                             iteration=state['iteration'], consumed=args.consumed_train_samples,
                             num_steps=scheduler.num_steps, lr=optimizer.param_groups[0]['lr'],
                             steps=sorted({float(s['step']) for s in adam}), **moment_sums(optimizer),
                             **(master_values(optimizer) if args.bf16 else {}))
        def save_first(k, consumed):
            if k != 1: return
            args.consumed_train_samples = consumed
            megatron_save(model, optimizer, scheduler, args, N + 1, out / 'megatron_run')
        res['losses'], res['lrs'] = megatron_steps(ddp, optimizer, scheduler, dataset, args.consumed_train_samples,
                                                   M, save_first)
        _, ddp, optimizer, scheduler, state = megatron_setup(r, out / 'megatron' / f'iter_{N:07d}', False, tp, pp)
        res['fresh_losses'], _ = megatron_steps(ddp, optimizer, scheduler, dataset, N * BATCH, M)
    if rank == dist.get_world_size() - 1: torch.save(res, out / 'megatron.pt')     # the last stage has the losses


def worker(rank: int, world: int, port: int, out: str, case: str):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group('gloo', rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try: continue_in_megatron(out, case)
    finally: torch.distributed.destroy_process_group()


def spawn(out: Path, case: str, timeout: float = 240) -> dict:
    "What `continue_in_megatron` found, from fresh processes (megatron-core keeps global state), one per TP × PP rank."
    run_ranks(worker, (str(out), case), CASES[case][2] * CASES[case][3], ['megatron.core.models.gpt.gpt_model'],
              timeout, 'megatron-core')
    return torch.load(out / 'megatron.pt', weights_only=True)


def write_corpus(prefix: Path):
    from nxpretrain.data.indexed import IndexedWriter
    rng = np.random.RandomState(0)
    lengths = rng.randint(5, 40, size=60)
    with IndexedWriter(prefix, vocab_size=100) as w:
        w.add_documents(rng.randint(0, 100, size=int(lengths.sum())), lengths)


def steps_of(run: Path, name: str) -> dict:
    return {s['step']: s for s in map(json.loads, (run / name / 'steps.jsonl').read_text().splitlines())}


def relative(a: float, b: float) -> float: return abs(a - b) / abs(b)


def loss_tolerance(case: str) -> float:
    """fp32: the equality matrix's. bf16: Megatron-LM's bf16 model (weights, activations, residual in bf16) and our
    autocast (bf16 matmuls; norms, softmax, residual in fp32) compute the same weights' loss differently; measured here
    (llama_bf16_tp2): 9.2e-6 at the loaded weights before any step (the forwards alone), ≤ 1.14e-5 over the steps
    after, in either direction. 1e-4 leaves ~9× headroom; the fresh-Adam control leaves the curve by 3.1e-3 and 7.5e-3
    (above 100 × the fp32 tolerance, 10 × this one)."""
    from nxpretrain.testing.layouts import TOLERANCE
    return 10 * TOLERANCE['loss_err'] if 'bf16' in case else TOLERANCE['loss_err']


@pytest.fixture(scope='module')
def corpus(tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp('convert_state') / 'data' / 'corpus'
    write_corpus(prefix)
    return prefix


@pytest.fixture(scope='module', params=list(CASES))
def runs(request, corpus):
    "(folder, our checkpoint at step N, the uninterrupted run's steps, megatron-core's findings, our resumed steps)."
    from nxpretrain.train.trainer import train
    case, out = request.param, corpus.parent.parent / request.param
    r = recipe(case, corpus)
    train(r, str(out / 'ref'), STEPS, progress=False)
    ref = steps_of(out / 'ref', r.name)
    ours = out / 'ref' / r.name / 'checkpoints' / f'step_{N}'
    p = cli('convert', ours, '--to', 'megatron', '--out', out / 'megatron', '--tp', CASES[case][2], '--pp',
            CASES[case][3])
    assert p.returncode == 0, p.stderr[-3000:]
    megatron = spawn(out, case)
    p = cli('convert', out / 'megatron_run', '--to', 'native', '--out', out / 'back')
    assert p.returncode == 0, p.stderr[-3000:]
    train(r, str(out / 'resumed'), STEPS, resume_from=str(out / 'back' / f'step_{N + 1}'), progress=False)
    return out, ours, ref, megatron, steps_of(out / 'resumed', r.name)


def test_megatron_core_loads_the_whole_state_strictly_with_our_values(runs):
    out, checkpoint, ref, megatron, _ = runs
    from nxpretrain.engines.megatron.training_state import read_native_state, MOMENTS
    ours = read_native_state(checkpoint)
    loaded = megatron['loaded']
    cfg, (_, _, tp, pp) = ours.model.cfg, CASES[out.name]
    assert (loaded['tp'], loaded['pp']) == loaded['args_layout'] == (tp, pp)
    per_stage = cfg.n_layers // pp                       # rank = stage × TP + TP rank; layer numbers from 1
    assert loaded['layers'] == [list(range(r // tp * per_stage + 1, (r // tp + 1) * per_stage + 1))
                                for r in range(tp * pp)], loaded['layers']
    assert loaded['qkv'] == ((cfg.n_heads + 2 * cfg.kv_heads) * cfg.head_dim // tp, cfg.hidden)
    assert (out / 'megatron' / 'latest_checkpointed_iteration.txt').read_text() == str(N)
    assert (loaded['iteration'], loaded['consumed'], loaded['num_steps']) == (N, N * BATCH, N * BATCH)
    assert loaded['steps'] == [float(N)]
    assert loaded['lr'] == pytest.approx(ref[N + 1]['lr'], rel=1e-12)
    # sums over every moment: equal whatever the order of the elements (QKV fused, layers stacked)
    sums = {m: sum(float(ours.moments[m](n).double().abs().sum()) for n in ours.model.names) for m in MOMENTS}
    assert loaded['exp_avg'] == pytest.approx(sums['exp_avg'], rel=1e-12)
    assert loaded['exp_avg_sq'] == pytest.approx(sums['exp_avg_sq'], rel=1e-12)
    if ours.recipe.parallel.precision == 'bf16':      # our fp32 weights are its fp32 master weights, bit for bit
        master = torch.cat([ours.model.take(n).flatten() for n in ours.model.names])
        assert torch.equal(loaded['master'], master[master != 0].sort().values)
        assert loaded['rounded']                      # and its bf16 weights are them rounded


def test_megatron_core_goes_on_with_the_uninterrupted_loss_curve(runs):
    from nxpretrain.testing.layouts import TOLERANCE
    out, _, ref, megatron, _ = runs
    errors = [relative(a, ref[N + 1 + k]['loss']) for k, a in enumerate(megatron['losses'])]
    assert max(errors) < loss_tolerance(out.name), (errors, megatron['losses'], ref)
    assert megatron['lrs'] == pytest.approx([ref[N + 1 + k]['lr'] for k in range(M)], rel=1e-12)
    # the control: a fresh Adam from the same weights and schedule leaves the curve (Adam's state is what carries)
    fresh = [relative(a, ref[N + 1 + k]['loss']) for k, a in enumerate(megatron['fresh_losses'])]
    assert max(fresh[1:]) > 100 * TOLERANCE['loss_err'], fresh


def test_our_engine_resumes_megatron_cores_save_with_the_uninterrupted_loss_curve(runs):
    out, _, ref, _, resumed = runs
    state = json.loads((out / 'back' / f'step_{N + 1}' / 'trainer_state.json').read_text())
    assert (state['step'], state['consumed_samples']) == (N + 1, (N + 1) * BATCH)
    # a --bf16 save (its fp32_param our weights) comes back as a bf16 recipe
    assert state['recipe']['parallel']['precision'] == ('bf16' if 'bf16' in out.name else 'fp32')
    assert sorted(resumed) == list(range(N + 2, STEPS + 1)), sorted(resumed)
    errors = [relative(resumed[s]['loss'], ref[s]['loss']) for s in resumed]
    assert max(errors) < loss_tolerance(out.name), (errors, resumed, ref)


def test_a_schedule_megatron_lm_has_not_is_refused_in_one_line(runs, tmp_path):
    "A save inside its warmup (where Megatron-LM's warmup rises along another line than ours): refused, nothing left."
    import dataclasses
    from nxpretrain.engines.megatron.training_state import read_native_state, write_megatron_state
    from nxpretrain.errors import RecipeError
    from nxpretrain.train.model_source import atomic_folder
    state = read_native_state(runs[1])
    r = state.recipe
    warm = state._replace(recipe=dataclasses.replace(r, optim=dataclasses.replace(r.optim, warmup_steps=N + 2)))
    with pytest.raises(RecipeError, match=rf'^step {N} is inside the warmup \(optim.warmup_steps={N + 2}, '
                                          r'optim.decay=cosine\).*\(--weights-only\)$'):
        with atomic_folder(tmp_path / 'megatron') as tmp: write_megatron_state(warm, tmp)
    assert list(tmp_path.iterdir()) == []


def test_a_zero1_run_is_refused_before_anything_is_written(runs, tmp_path):
    """parallel.zero1=true: Megatron-LM's job trains with --use-distributed-optimizer, whose sharded optimizer layout
    is not written (state.yaml: optimizer.distributed_optimizer): one line, and nothing in the output folder."""
    import dataclasses
    from nxpretrain.engines.megatron.training_state import read_native_state, write_megatron_state
    from nxpretrain.errors import RecipeError
    from nxpretrain.train.model_source import atomic_folder
    state = read_native_state(runs[1])
    r = state.recipe
    zero1 = state._replace(recipe=dataclasses.replace(r, parallel=dataclasses.replace(r.parallel, zero1=True)))
    with pytest.raises(RecipeError, match=r'^\S+: parallel.zero1=true .*--use-distributed-optimizer.*'
                                          r'\(--weights-only\)$'):
        with atomic_folder(tmp_path / 'megatron') as tmp: write_megatron_state(zero1, tmp)
    assert list(tmp_path.iterdir()) == []
