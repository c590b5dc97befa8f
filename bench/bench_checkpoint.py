"""Checkpoint save speed against the disk, and how long a save blocks training.

  python bench/bench_checkpoint.py [--mb 256] [--dir /tmp/ckbench] [--repeat 3]

Staging buffers of async saves are kept between saves (the first save allocates them); best-of-N reports the steady
state.

1. Sequential write speed of the target folder, measured with `dd` (fdatasync included) in this same run, against
   `Checkpointer.save` (DCP shards with fsync, CRC-32C manifest, marker) of a model + AdamW state of the same size;
   side by side, DCP's stock `FileSystemWriter` (what torchtitan and NeMo 2 use) and plain `torch.save` + fsync.
   Target: our save ≥ 80 % of dd.
2. Blocking time of a save as the training loop sees it: sync save vs async save. The async save copies the state and
   writes it in a background thread while the next step's forward/backward runs (simulated: `--step-s` seconds of
   matmuls);
   the loop blocks for the `save` call plus whatever copying is left at the optimizer step. Target: ≤ 10 % of sync.
Numbers are the best of `--repeat` rounds (the disk is shared; best-of is the least noisy estimate of each side), and
the
median over rounds of each writer's ratio to the dd run of the same round.
"""
import argparse, os, re, shutil, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def dd_write(path: Path, mb: int) -> float:
    "Seconds for dd to write `mb` MiB sequentially and fdatasync them."
    t = time.perf_counter()
    subprocess.run(['dd', 'if=/dev/zero', f'of={path}', 'bs=8M', f'count={max(1, mb // 8)}', 'conv=fdatasync'],
                   check=True, capture_output=True)
    dt = time.perf_counter() - t
    path.unlink()
    return dt


def busy(seconds: float):
    "Matmuls for `seconds`: the forward and backward of the training step that follows a save."
    import torch
    x, t = torch.randn(256, 256), time.perf_counter()
    while time.perf_counter() - t < seconds: x = torch.tanh(x @ x)


def make_state(mb: int):
    "A model + AdamW state (after one step) of about `mb` MiB in total, as the trainer checkpoints it."
    import torch
    from nxpretrain.train.checkpoint import TrainingStateDict
    n = mb * 2**20 // 4 // 3                       # fp32 weights, exp_avg, exp_avg_sq
    rows = 1024
    model = torch.nn.Sequential(*[torch.nn.Linear(rows, rows, bias=False) for _ in range(max(1, n // rows // rows))])
    opt = torch.optim.AdamW(model.parameters())
    for p in model.parameters(): p.grad = torch.randn_like(p)
    opt.step()
    return model, opt, TrainingStateDict(model, opt).state_dict()


def state_bytes(state) -> int:
    import torch
    total = 0
    def walk(x):
        nonlocal total
        if isinstance(x, torch.Tensor): total += x.numel() * x.element_size()
        elif isinstance(x, dict): [walk(v) for v in x.values()]
    walk(state)
    return total


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument('--mb', type=int, default=256)
    ap.add_argument('--dir', default=None)
    ap.add_argument('--repeat', type=int, default=3)
    ap.add_argument('--step-s', type=float, default=1.0,
                    help='forward+backward time of the simulated training step after a save')
    a = ap.parse_args(argv)
    import torch
    from nxpretrain.train.checkpoint import Checkpointer
    root = Path(a.dir or tempfile.mkdtemp(prefix='ckbench-'))
    root.mkdir(parents=True, exist_ok=True)
    model, opt, state = make_state(a.mb)
    nbytes = state_bytes(state)
    mib = nbytes / 2**20
    print(f"state: {mib:.0f} MiB (model + AdamW), folder {root}, torch {torch.__version__}, {torch.get_num_threads()} "
          "threads")

    import torch.distributed.checkpoint as dcp, warnings
    sync_ck = Checkpointer(root / 'sync', keep_last=1, log=lambda *x: None)
    def ours_sync(i):
        t = time.perf_counter()
        sync_ck.save(i + 1, state, {'step': i + 1})
        dt = time.perf_counter() - t  # returns once COMPLETE is written
        sync_ck.wait()
        return dt  # old checkpoints are deleted in the background
    def dcp_stock(i):
        d = root / 'stock'
        shutil.rmtree(d, ignore_errors=True)
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(d), sync_files=True), no_dist=True)
        dt = time.perf_counter() - t
        shutil.rmtree(d)
        return dt
    def torch_save(i):
        f = root / 'ts.pt'
        t = time.perf_counter()
        with open(f, 'wb') as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        dt = time.perf_counter() - t
        f.unlink()
        return dt
    # each round runs every writer once, in a rotating order, each after `sync` so that none pays for the writeback
    # or the deletions of the one before it
    writers = {'dd': lambda i: dd_write(root / 'dd.bin', int(mib)), 'torch': torch_save, 'stock': dcp_stock,
               'ours': ours_sync}
    times = {k: [] for k in writers}
    for i in range(a.repeat):
        names = list(writers)
        names = names[i % 4:] + names[:i % 4]
        for k in names:
            os.sync()
            times[k].append(writers[k](i))
    dd, ts, stock, sync_total = (min(times[k]) for k in ('dd', 'torch', 'stock', 'ours'))
    shutil.rmtree(sync_ck.root)

    def blocking(async_save):
        ck = Checkpointer(root / ('async' if async_save else 'sync'), keep_last=1, async_save=async_save,
                          log=lambda *x: None)
        blocks = []
        for i in range(a.repeat):
            t = time.perf_counter()
            ck.save(i + 1, state, {'step': i + 1})
            blocked = time.perf_counter() - t
            # the next step's forward/backward runs while the copy is made; the optimizer step waits for it
            if async_save:
                busy(a.step_s)
                w = time.perf_counter()
                ck.wait_staged()
                blocked += time.perf_counter() - w
            ck.wait()
            blocks.append(blocked)
        shutil.rmtree(ck.root)
        return min(blocks)
    sync_block, async_block = blocking(False), blocking(True)

    rows = [('dd sequential write (fdatasync)', dd), ('torch.save + fsync (one file)', ts),
            ('DCP stock FileSystemWriter (fsync, no checksums)', stock),
            ('nxpretrain save (DCP + shard writer + fsync + CRC-32C manifest + marker)', sync_total)]
    print(f"\n| writer | seconds | MiB/s | vs dd |\n| --- | --- | --- | --- |")
    for name, t in rows: print(f"| {name} | {t:.3f} | {mib / t:.0f} | {dd / t:.2f} |")
    print(f"\n| save as the training loop sees it | blocked s | vs sync |\n| --- | --- | --- |")
    print(f"| sync | {sync_block:.3f} | 1.00 |\n| async (next step {a.step_s:.1f} s of compute) | {async_block:.3f} | "
          f"{async_block / sync_block:.2f} |")
    import statistics
    per_round = {k: statistics.median(d_ / t_ for d_, t_ in zip(times['dd'], times[k])) for k in ('stock', 'ours')}
    print(f"\nper round, median of throughput / dd: ours {per_round['ours']:.2f}, DCP stock {per_round['stock']:.2f}")
    print(f"\nsave throughput / dd = {dd / sync_total:.2f} (target ≥ 0.80); DCP stock writer / dd = {dd / stock:.2f}; "
          f"ours / stock = {stock / sync_total:.2f}×; async blocking / sync = {async_block / sync_block:.2f} (target "
          "≤ 0.10)")
    if not a.dir: shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    main()
