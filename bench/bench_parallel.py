"""Data- and tensor-parallel training throughput on one machine, side by side in one run.

DP2 and TP2 run as 2 processes × 1 thread (gloo); the baseline is 1 process × 2 threads on the same global batch,
the same model and precision. Prints tokens/s and the ratios against the targets (DP2 and ZeRO-1 ≥ 0.9 with at most
10 % of the step in exposed DP communication, FSDP2 ≥ 0.85, TP2 ≥ 0.70), and the share of a step spent waiting for
the DP gradient sums (exposed communication: the engine's `DP_WAIT` profiler range, over two profiled steps). Every
process keeps freed memory, as the trainer does on a CPU (`nxpretrain.train.allocator`).

Each measurement runs as it finds the machine and again under load: `--load 0 1` (the default) adds no process, then
one busy process (a one-thread matmul loop, another job on the same machine) beside the baseline and the layouts alike.

    python bench/bench_parallel.py                      # small GPT, fp32, without and with one busy process
    python bench/bench_parallel.py --precision bf16 --steps 6 --layouts dp2 tp2 fsdp2
    python bench/bench_parallel.py --layouts dp2 dp2_after   # DP sums during backward against after it
"""
import argparse, contextlib, os, subprocess, sys, time, torch, torch.distributed as dist
from nxpretrain.testing.spawn import run_distributed

LAYOUTS = {'dp2': ('parallel.dp=-1',), 'dp2_after': ('parallel.overlap_grad_reduce=false',),
           'zero1': ('parallel.zero1=true',), 'fsdp2': ('parallel.fsdp=true',), 'tp2': ('parallel.tp=2',),
           'tp2sp': ('parallel.tp=2', 'parallel.sequence_parallel=true')}
# (least ratio to one process, most exposed DP communication as a share of the step; None: no DP sums to expose)
TARGETS = {'dp2': (0.9, 0.10), 'dp2_after': (0.9, 0.10), 'zero1': (0.9, 0.10), 'fsdp2': (0.85, 0.10),
           'tp2': (0.70, None), 'tp2sp': (0.70, None)}
BUSY = 'import torch; torch.set_num_threads(1); a = torch.randn(512, 512)\nwhile True: a @ a'

@contextlib.contextmanager
def busy_processes(n: int):
    "`n` one-thread matmul loops running beside the measurement: load from another job on the same machine."
    procs = [subprocess.Popen([sys.executable, '-c', BUSY]) for _ in range(n)]
    try: yield
    finally:
        for p in procs: p.kill()
        for p in procs: p.wait()

def recipe(args, layout=()):
    from nxpretrain.recipes import get_recipe
    return get_recipe('gpt3_tiny', f'model.n_layers={args.layers}', f'model.hidden={args.hidden}',
                      f'model.n_heads={args.heads}', f'model.seq_len={args.seq}', f'data.micro_batch={args.micro}',
                      f'data.global_batch={args.batch}', f'parallel.precision={args.precision}', 'optim.warmup_steps=0',
                      *layout)

def train(args, layout):
    "Runs on every rank: `args.steps` timed optimizer steps after 2 warm-up steps; returns tokens/s (global)."
    from nxpretrain.models.registry import build_model
    from nxpretrain.models.blocks import count_parameters
    from nxpretrain.parallel.state import initialize_model_parallel
    from nxpretrain.models.args import padded_vocab
    from nxpretrain.parallel.parallelize import build_parallel_model
    import nxpretrain.train.step  # noqa: F401 – the step methods of ParallelModel
    from nxpretrain.parallel.fsdp import dp_shard
    from nxpretrain.train.allocator import keep_freed_memory
    keep_freed_memory()   # as the trainer on a CPU
    r = recipe(args, layout)
    st = initialize_model_parallel(r.parallel.tp, r.parallel.pp, r.parallel.cp, 'cpu')
    with torch.device('meta'): n_params = count_parameters(build_model(r.model, padded_vocab(r.model, r.parallel.tp)))
    pm = build_parallel_model(r, st, seed=0)
    opt = pm.build_optimizer()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, r.model.vocab_size, (r.data.global_batch, r.model.seq_len + 1), generator=g)
    x, y = dp_shard(tokens[:, :-1], st), dp_shard(tokens[:, 1:], st)
    for i in range(2 + args.steps):
        if i == 2:
            dist.barrier()
            t0 = time.perf_counter()
        pm.train_step(x, y, opt)
    dist.barrier()
    dt = time.perf_counter() - t0
    return dict(tokens_per_s=args.steps * r.data.global_batch * r.model.seq_len / dt, params=n_params,
                threads=torch.get_num_threads(), exposed=exposed_share(pm, x, y, opt))

def exposed_share(pm, x, y, opt, steps: int = 2) -> float:
    """Share of the step that waits for DP gradient sums (the engine's `DP_WAIT` profiler range), over `steps` profiled
    steps."""
    from torch.profiler import profile, ProfilerActivity
    from nxpretrain.train.step import DP_WAIT
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps): pm.train_step(x, y, opt)
    wall_us = (time.perf_counter() - t0) * 1e6
    return sum(e.cpu_time_total for e in prof.key_averages() if e.key == DP_WAIT) / wall_us

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--layers', type=int, default=4)
    ap.add_argument('--hidden', type=int, default=256)
    ap.add_argument('--heads', type=int, default=4)
    ap.add_argument('--seq', type=int, default=256)
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--micro', type=int, default=4)
    ap.add_argument('--steps', type=int, default=4)
    ap.add_argument('--precision', default='fp32', choices=['fp32', 'bf16'])
    ap.add_argument('--layouts', nargs='+', default=['dp2', 'tp2'], choices=list(LAYOUTS))
    ap.add_argument('--rounds', type=int, default=2, help='alternate baseline and layouts this many times; keep the '
                                                          'best of each')
    ap.add_argument('--load', type=int, nargs='+', default=[0, 1],
                    help='busy processes beside the measurement, one measurement each')
    args = ap.parse_args()
    from nxpretrain.machine import cpu_flags
    print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} before the first "
          "measurement")
    for busy in args.load:
        with busy_processes(busy): best = measure(args)
        report(args, best, busy)

def measure(args) -> dict:
    "The best result of each of the baseline and the layouts over `args.rounds` alternating rounds."
    best = {}
    # alternating rounds: a noisy neighbour hurts both sides alike; best-of-N drops the outliers
    for _ in range(args.rounds):
        for name in ['base', *args.layouts]:
            res = run_distributed(train, 1 if name == 'base' else 2, args, LAYOUTS.get(name, ()),
                                  threads=2 if name == 'base' else 1, timeout=600)[0]
            if res['tokens_per_s'] > best.get(name, {}).get('tokens_per_s', 0): best[name] = res
    best['load'] = os.getloadavg()[0]
    return best

def report(args, best: dict, busy: int):
    base = best['base']
    print(f"\n{busy} busy process(es) beside it; load average {best['load']:.2f} at its end")
    print(f"GPT {base['params'] / 1e6:.1f}M params, batch {args.batch}×{args.seq}, {args.precision}, best of "
          f"{args.rounds} rounds")
    print(f"{'layout':<10}{'processes×threads':>18}{'tokens/s':>11}{'ratio':>8}{'target':>8}  exposed DP communication")
    print(f"{'1 process':<10}{'1×2':>18}{base['tokens_per_s']:>11.0f}{1.0:>8.2f}{'':>8}")
    for name in args.layouts:
        ratio = best[name]['tokens_per_s'] / base['tokens_per_s']
        exposed = best[name]['exposed']
        least, most_exposed = TARGETS[name]
        ok = ratio >= least and (most_exposed is None or exposed <= most_exposed)
        print(f"{name:<10}{'2×1':>18}{best[name]['tokens_per_s']:>11.0f}{ratio:>8.2f}{least:>8.2f}  {exposed:>5.1%} "
              f"of the step  {'ok' if ok else 'below target'}")

if __name__ == '__main__': main()
