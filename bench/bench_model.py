"""Single-process training-step speed of nxpretrain's GPT against HF transformers' GPT2LMHeadModel (and with
`--megatron` megatron-core's GPTModel), side by side.

Same config (`--size 30m`, the default: ≈30M parameters, 8 layers × 512, 8 heads, vocabulary 8192, sequence 256;
`--size 1.3b`: GPT-3 XL's 24 layers × 2048, 16 heads, GPT-2's vocabulary, sequence 2048, for a GPU), same weights,
same data, same optimizer, same threads and precision. The plain loops step as HF's `Trainer` does by default
(transformers with torch ≥ 2.8: fused AdamW, gradient clipping at 1.0); the engine rows are nxpretrain's trainer step
itself. Steps of the two models alternate, so load from other processes hits both alike; the median step time of each
is reported with the ratio, the measured matmul peaks of the machine and MFU (model FLOPs, `nxpretrain.perf`
convention). bf16 autocast rows run only where the device has fast bf16 matmuls (a CPU without AVX-512-BF16/AMX
multiplies bf16 ~50× slower than fp32; then the bf16 rows are skipped and said so).

python bench/bench_model.py                       # fp32 and (if fast) bf16, 2 threads python bench/bench_model.py
--precision fp32 --steps 5 --compile   # also the trainer step with trainer.compile=true python bench/bench_model.py
--attention           # also SDPA against the dense attention core, at 1, 2 and 4 × seq python bench/bench_model.py
--megatron            # also megatron-core's GPTModel (bench/mcore_gpt.py) python bench/bench_model.py --size 1.3b
--precision bf16 --megatron --compile   # on a GPU (the default device there)

On a GPU every row runs on CUDA unchanged; the MFU is also given against the datasheet's dense bf16 peak
(`--datasheet-tflops`, 989 for an H100 or H200).

The process keeps freed memory as nxpretrain's trainer does on a CPU (`nxpretrain.train.allocator`), for every row,
HF's included; `--glibc-default` leaves glibc's malloc as it is, to see what that is worth."""
import argparse, copy, statistics, time, sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
import torch.nn.functional as F
from nxpretrain.recipes import get_recipe
from nxpretrain.models.args import padded_vocab
from nxpretrain.config import override
from nxpretrain.parallel.kernels import attention_kernel, loss_chunk_tokens
from nxpretrain.models.registry import build_model
from nxpretrain.models.blocks import count_parameters
from nxpretrain.models.hf_mapping import to_hf_config, from_hf_state_dict
from nxpretrain.perf import measure_matmul_tflops, model_flops_per_token, step_profile
from nxpretrain.train.allocator import keep_freed_memory
from nxpretrain.machine import cpu_flags

SIZES = {'30m': dict(layers=8, hidden=512, heads=8, vocab=8192, seq=256, batch=8),
         '1.3b': dict(layers=24, hidden=2048, heads=16, vocab=50257, seq=2048, batch=8)}
DATASHEET_BF16_TFLOPS = {'H100': 989.0, 'H200': 989.0}   # dense, SXM

def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu', choices=['cpu', 'cuda'])
    p.add_argument('--size', default='30m', choices=list(SIZES), help='model and batch; the flags below override it')
    p.add_argument('--threads', type=int, default=2)
    for name in ('batch', 'seq', 'layers', 'hidden', 'heads', 'vocab'): p.add_argument(f'--{name}', type=int)
    p.add_argument('--megatron', action='store_true', help="also megatron-core's GPTModel (same config and weights, "
                                                           "its own loss)")
    p.add_argument('--datasheet-tflops', type=float, help='dense bf16 peak of the GPU (default: known for H100 and '
                                                          'H200)')
    p.add_argument('--steps', type=int, default=4, help='timed steps per model and precision')
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--precision', default='fp32,bf16', help='comma-separated: fp32, bf16 (autocast)')
    p.add_argument('--compile', action='store_true', help="also time the trainer's step with trainer.compile=true "
                                                          "(inductor)")
    p.add_argument('--force-bf16', action='store_true', help='run bf16 rows even where bf16 matmuls are slow')
    p.add_argument('--peak-seconds', type=float, default=2.0)
    p.add_argument('--profile', action='store_true', help='also print where each step spends its time (torch.profiler)')
    p.add_argument('--attention', action='store_true', help="also time the attention cores alone: torch's SDPA "
                                                            "against the dense core")
    p.add_argument('--glibc-default', action='store_true',
                   help="leave glibc's malloc as it is (the trainer keeps freed memory)")
    a = p.parse_args()
    for name, value in SIZES[a.size].items():
        if getattr(a, name) is None: setattr(a, name, value)
    return a

def logits_loss(forward):
    "The mean cross-entropy of the logits `forward` gives, as HF's Trainer computes it."
    return lambda x, y: F.cross_entropy(forward(x).flatten(0, 1).float(), y.flatten())

def trainer(loss_fn, model, tokens, bf16):
    "A step as HF's Trainer takes it by default: fused AdamW (adamw_torch_fused), gradients clipped at 1.0."
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    def step():
        with torch.autocast(tokens.device.type, torch.bfloat16, enabled=bf16):
            loss = loss_fn(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step

def megatron_trainer(cfg, vocab_size, ours, tokens, bf16):
    "megatron-core's GPTModel with `ours`' weights, in the same loop as HF's, its loss computed by megatron-core."
    from mcore_gpt import megatron_gpt, load_weights, megatron_loss
    device = tokens.device.type
    model, spec = megatron_gpt(cfg, vocab_size, device)
    load_weights(model, cfg, ours.state_dict(), spec)
    print(
        f"megatron-core GPTModel: {spec} layer spec" + ('' if device == 'cuda' else ', CPU shims (bench/mcore_gpt.py)')
    )
    return trainer(megatron_loss(model.train(), tokens.shape[1] - 1, device), model, tokens, bf16)

def row_makers(a, cfg, V, ours, hf, tokens, bf16, recipe, state) -> dict:
    "{row name: a function that builds the row's model on the device and returns its step}; HF's row is the baseline."
    dev = tokens.device
    def plain(model, forward=None):
        model = copy.deepcopy(model).to(dev)
        return trainer(logits_loss(forward(model) if forward else model), model, tokens, bf16)
    hf_logits = lambda m: (lambda t: m(input_ids=t, use_cache=False).logits)
    makers = {'nxpretrain GPT': lambda: plain(ours), 'HF GPT2LMHeadModel': lambda: plain(hf, hf_logits)}
    if a.megatron and bf16 and dev.type == 'cpu':
        # its linear layers' backward restores CUDA's autocast state only: under a CPU's it multiplies bf16 by fp32
        print("megatron-core GPTModel, bf16: skipped on a CPU (its linear layers' backward knows CUDA's autocast only)")
    elif a.megatron:
        makers['megatron-core GPTModel'] = lambda: megatron_trainer(cfg, V, ours, tokens, bf16)
    engine = lambda compile: engine_trainer(copy.deepcopy(ours).to(dev), tokens, bf16, recipe, state, compile)
    makers['nxpretrain trainer step (engine, world of one)'] = lambda: engine(False)
    if a.compile: makers['nxpretrain trainer step, compiled blocks'] = lambda: engine(True)
    return makers

def warm_up(a, name, step) -> float:
    "The loss of the last of `a.warmup` steps (compiling, where the row compiles)."
    t0 = time.perf_counter()
    for _ in range(a.warmup): loss = step()
    if 'compiled' in name: print(f"  compile + {a.warmup} warm-up steps: {time.perf_counter() - t0:.1f} s")
    return loss

def timed(step) -> tuple:
    "(wall seconds, CPU seconds) of one step."
    t0, c0 = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - t0, time.process_time() - c0

def alternating(a, makers) -> tuple:
    "Every row built, then their steps alternated A B A B …: (wall times, CPU times, losses, profiles) per row."
    steps = {k: make() for k, make in makers.items()}
    losses = {k: warm_up(a, k, s) for k, s in steps.items()}
    times, cpu = {k: [] for k in steps}, {k: [] for k in steps}
    for _ in range(a.steps):
        for k, s in steps.items():
            wall, used = timed(s)
            times[k].append(wall)
            cpu[k].append(used)
    profiled = {k: step_profile(s) for k, s in steps.items()} if a.profile else {}
    return times, cpu, losses, profiled

def one_at_a_time(a, makers) -> tuple:
    "Each row built, warmed up, timed and freed before the next (a GPU's memory holds one): as `alternating`."
    times, cpu, losses = {}, {}, {}
    for k, make in makers.items():
        step = make()
        losses[k] = warm_up(a, k, step)
        times[k], cpu[k] = map(list, zip(*(timed(step) for _ in range(a.steps))))
        del step
        torch.cuda.empty_cache()
    return times, cpu, losses, {}

def rate(tflops: float) -> str:
    "A matmul rate as people quote it: GFLOP/s below one TFLOP/s (CPUs), else TFLOP/s."
    return f"{tflops * 1e3:.1f} GFLOP/s" if tflops < 1 else f"{tflops:.1f} TFLOP/s"

def engine_trainer(model, tokens, bf16, recipe, state, compile=False):
    """The trainer's step: the parallel engine in a world of one (loss over global counts, global norm, clipping, fused
    AdamW)."""
    from nxpretrain.parallel.parallelize import parallelize
    import nxpretrain.train.step  # noqa: F401 – the step methods of ParallelModel
    r = override(recipe, f'data.micro_batch={tokens.shape[0]}', f'data.global_batch={tokens.shape[0]}',
                 f"parallel.precision={'bf16' if bf16 else 'fp32'}", 'optim.lr=1e-4', 'optim.weight_decay=0.0',
                 f'trainer.compile={compile}')
    pm = parallelize(model, r, state)
    opt = pm.build_optimizer()   # the recipe's AdamW, fused in a world of one
    def step():
        loss = pm.forward_backward(tokens[:, :-1], tokens[:, 1:])
        pm.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step

DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16}

def bf16_skipped(a, peaks) -> bool:
    "bf16 rows are skipped where bf16 matmuls are slower than fp32 ones, unless --force-bf16."
    return peaks['bf16'] < peaks['fp32'] and not a.force_bf16

def attention_table(a, heads, peaks):
    "Forward + backward of one block's attention (batch × heads × seq × head_dim): torch's SDPA against the dense core."
    from nxpretrain.models.dense_attention import dense_attention
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    print(f"\n| precision | batch × heads × seq × head_dim | SDPA ms | dense ms | SDPA ÷ dense |")
    print("| --- | --- | --- | --- | --- |")
    for prec in ('fp32', 'bf16'):
        if prec == 'bf16' and bf16_skipped(a, peaks): continue
        for seq in (a.seq, 2 * a.seq, 4 * a.seq):
            batch = max(1, a.batch * a.seq // seq)   # the same tokens per step
            shape = (batch, seq, heads, a.hidden // heads)
            q, k, v = (
                torch.randn(shape, dtype=DTYPES[prec], device=a.device).transpose(1, 2).requires_grad_()
                for _ in range(3)
            )
            up = torch.randn_like(q)
            ms = {}
            for name, core in (('sdpa', sdpa), ('dense', dense_attention)):
                core(q, k, v).backward(up)
                times = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    core(q, k, v).backward(up)
                    times.append(time.perf_counter() - t0)
                ms[name] = statistics.median(times) * 1e3
            print(f"| {prec} | {batch} × {heads} × {seq} × {a.hidden // heads} | {ms['sdpa']:.1f} | {ms['dense']:.1f} "
                  f"| {ms['sdpa'] / ms['dense']:.2f} |")

def print_profiles(profiles: dict):
    "A markdown table: share of each step's wall time per kind of work, one column per (precision, model)."
    kinds = [k for k in next(iter(profiles.values())) if k != 'step_s']
    print('\n| kind | ' + ' | '.join(f'{p} {m}' for p, m in profiles) + ' |')
    print('| --- |' + ' --- |' * len(profiles))
    for kind in kinds: print(f'| {kind} | ' + ' | '.join(f'{v[kind]:.1%}' for v in profiles.values()) + ' |')
    print('| step, s | ' + ' | '.join(f"{v['step_s']:.3f}" for v in profiles.values()) + ' |')

def main():
    a = parse()
    import transformers as T
    T.logging.set_verbosity_error()
    torch.set_num_threads(a.threads)
    dev = a.device
    kept = dev == 'cpu' and not a.glibc_default and keep_freed_memory()   # as the trainer on a CPU: every row, HF's too
    recipe = get_recipe('gpt3_tiny', f'model.n_layers={a.layers}', f'model.hidden={a.hidden}',
                        f'model.n_heads={a.heads}', f'model.vocab_size={a.vocab}', f'model.seq_len={a.seq}',
                        'model.dropout=0.0')
    cfg = recipe.model
    from nxpretrain.parallel.state import parallel_session
    session = parallel_session(recipe, dev)
    state = session.__enter__()  # a world of one for the engine rows
    V = padded_vocab(cfg)
    print(f"CPU flags: {cpu_flags()}; load average "
          f"{os.getloadavg()[0]:.2f} (on a shared machine these are not idle-machine figures)")
    print(f"torch {torch.__version__}, transformers {T.__version__}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {a.threads} threads, batch {a.batch} × seq {a.seq}, device "
          f"{dev}")
    gpu = torch.cuda.get_device_name() if dev == 'cuda' else None
    datasheet = a.datasheet_tflops or next((v for k, v in DATASHEET_BF16_TFLOPS.items() if gpu and k in gpu), None)
    if gpu: print(f"GPU: {gpu}; datasheet dense bf16 peak {datasheet or 'unknown (--datasheet-tflops)'} TFLOP/s")
    print("host allocator: "
          f"{'freed memory kept (as the trainer on a CPU), for every row' if kept else 'glibc default'}")
    peaks = {p: measure_matmul_tflops(DTYPES[p], dev, seconds=a.peak_seconds) for p in ('fp32', 'bf16')}
    print(f"measured matmul peak: fp32 {rate(peaks['fp32'])}, bf16 {rate(peaks['bf16'])}")
    torch.manual_seed(0)
    hf = T.GPT2LMHeadModel(to_hf_config(cfg)).train()
    ours = build_model(cfg).train()
    ours.load_state_dict(from_hf_state_dict(cfg, hf.state_dict()))   # same weights
    n = count_parameters(ours)
    fpt = model_flops_per_token(cfg, V)
    print(f"model: {n / 1e6:.1f}M parameters (HF {hf.num_parameters() / 1e6:.1f}M), {fpt / 1e6:.1f} MFLOP per token "
          "(6·N + attention)")
    tokens = torch.randint(0, cfg.vocab_size, (a.batch, a.seq + 1), device=dev)
    rows, profiles = [], {}
    for prec in a.precision.split(','):
        bf16 = prec == 'bf16'
        if bf16 and bf16_skipped(a, peaks):
            print(f"bf16: skipped – this device's bf16 matmul peak ({rate(peaks['bf16'])}) is below fp32's "
                  f"({rate(peaks['fp32'])}); bf16 autocast would only slow training down here (--force-bf16 runs it "
                  "anyway)")
            continue
        r = override(recipe, f'parallel.precision={prec}')
        print(f"engine rows, {prec}: attention core {attention_kernel(r, dev)}, fused loss in "
              f"{loss_chunk_tokens(r)}-token chunks")
        makers = row_makers(a, cfg, V, ours, hf, tokens, bf16, recipe, state)
        # a CPU shared with other processes: rows alternate step by step, so load hits them alike; a GPU is not shared,
        # and several copies of a 1.3B model with their optimizer states would not fit on it: one row at a time
        run = alternating if dev == 'cpu' else one_at_a_time
        times, cpu, losses, profiled = run(a, makers)
        profiles.update({(prec, k): v for k, v in profiled.items()})
        hf_times = times['HF GPT2LMHeadModel']
        base, base_cpu = statistics.median(hf_times), statistics.median(cpu['HF GPT2LMHeadModel'])
        for k, ts in times.items():
            med, med_cpu = statistics.median(ts), statistics.median(cpu[k])
            tps = a.batch * a.seq / med
            per_round = [h / t for h, t in zip(hf_times, ts)]   # each round's HF step over this row's step
            rows.append((prec, k, tps, base / med, (min(per_round), max(per_round)), a.batch * a.seq / med_cpu,
                         base_cpu / med_cpu, tps * fpt / (peaks[prec] * 1e12), losses[k]))
            if datasheet and bf16:
                print(f"{k}: MFU {tps * fpt / (datasheet * 1e12):.3f} of the datasheet's {datasheet:.0f} TFLOP/s")
    # other processes can depress the first peak measurement: take the better of before and after
    after = {
        p: max(peaks[p], measure_matmul_tflops(DTYPES[p], dev, seconds=a.peak_seconds)) for p in {r[0] for r in rows}
    }
    rows = [(p, k, tps, r, rr, tpc, rc, m * peaks[p] / after[p], loss) for p, k, tps, r, rr, tpc, rc, m, loss in rows]
    print("measured matmul peak, best of before/after: " + ', '.join(f"{p} {rate(v)}" for p, v in after.items()))
    print("\n| precision | model | tokens/s | × HF | × HF, each round (min–max) | tokens per CPU-second | × HF (CPU "
          "time) | MFU (vs the measured peak of its precision) | loss after warm-up |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for prec, k, tps, ratio, (lo, hi), tpc, ratio_cpu, m, loss in rows:
        print(f"| {prec} | {k} | {tps:.0f} | {ratio:.2f} | {lo:.2f}–{hi:.2f} | {tpc:.0f} | {ratio_cpu:.2f} | {m:.2f} "
              f"| {loss:.4f} |")
    if profiles: print_profiles(profiles)
    if a.profile and dev != 'cpu':
        print("--profile: CPU runs only (a GPU's kernels run asynchronously to the operators it times)")
    if a.attention: attention_table(a, a.heads, peaks)
    session.__exit__(None, None, None)
    print(
        "\nCPU time (process_time, all threads) is less sensitive than wall time to other processes on a shared "
        "machine; a ratio > 1 means nxpretrain is faster. "
        + (
            "A round is one step of every row, back to back: the range of "
            "its ratios is how far load from other processes moved them."
            if dev == 'cpu'
            else "Rows ran one at a time; the range pairs each row's i-th timed step with HF's."
        )
    )

if __name__ == '__main__':
    main()
