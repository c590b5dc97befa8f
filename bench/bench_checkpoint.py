"""Checkpoint save speed against the disk, and how long a save blocks training.

  python bench/bench_checkpoint.py [--mb 256] [--dir /tmp/ckbench] [--repeat 3]

Staging buffers of async saves are kept between saves (the first save allocates them); best-of-N reports the steady state.

1. Sequential write speed of the target folder, measured with `dd` (fdatasync included) in this same run, against
   `Checkpointer.save` (DCP shards with fsync, CRC-32 manifest, marker) of a model + AdamW state of the same size;
   also plain `torch.save` + fsync for reference. Target: our save ≥ 80 % of dd.
2. Blocking time of a save as the training loop sees it: sync save vs async save. The async save copies the state and
   writes it in a background thread while the next step's forward/backward runs (simulated: `--step-s` seconds of matmuls);
   the loop blocks for the `save` call plus whatever copying is left at the optimizer step. Target: ≤ 10 % of sync.
Numbers are the best of `--repeat` runs (the machine is shared; best-of is the least noisy estimate of each side).
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
    from nxpretrain.train.trainer import _app_state
    n = mb * 2**20 // 4 // 3                       # fp32 weights, exp_avg, exp_avg_sq
    rows = 1024
    model = torch.nn.Sequential(*[torch.nn.Linear(rows, rows, bias=False) for _ in range(max(1, n // rows // rows))])
    opt = torch.optim.AdamW(model.parameters())
    for p in model.parameters(): p.grad = torch.randn_like(p)
    opt.step()
    return model, opt, _app_state(model, opt)


def state_bytes(state) -> int:
    import torch
    total = 0
    def walk(x):
        nonlocal total
        if isinstance(x, torch.Tensor): total += x.numel() * x.element_size()
        elif isinstance(x, dict): [walk(v) for v in x.values()]
    walk(state); return total


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument('--mb', type=int, default=256); ap.add_argument('--dir', default=None); ap.add_argument('--repeat', type=int, default=3)
    ap.add_argument('--step-s', type=float, default=1.0, help='forward+backward time of the simulated training step after a save')
    a = ap.parse_args(argv)
    import torch
    from nxpretrain.train.checkpoint import Checkpointer
    root = Path(a.dir or tempfile.mkdtemp(prefix='ckbench-'))
    root.mkdir(parents=True, exist_ok=True)
    model, opt, state = make_state(a.mb)
    nbytes = state_bytes(state); mib = nbytes / 2**20
    print(f"state: {mib:.0f} MiB (model + AdamW), folder {root}, torch {torch.__version__}, {torch.get_num_threads()} threads")

    dd = min(dd_write(root / 'dd.bin', int(mib)) for _ in range(a.repeat))

    def ours(async_save, checksum=True):
        ck = Checkpointer(root / ('async' if async_save else 'sync'), keep_last=1, async_save=async_save, log=lambda *x: None, checksum=checksum)
        blocks, totals = [], []
        for i in range(a.repeat):
            t = time.perf_counter(); ck.save(i + 1, state, {'step': i + 1}); blocked = time.perf_counter() - t
            if async_save:  # the next step's forward/backward runs while the copy is made; the optimizer step waits for it
                busy(a.step_s); w = time.perf_counter(); ck.wait_staged(); blocked += time.perf_counter() - w
            ck.wait(); totals.append(time.perf_counter() - t - (a.step_s if async_save else 0)); blocks.append(blocked)
        shutil.rmtree(ck.root)
        return min(blocks), min(totals)

    sync_block, sync_total = ours(False)
    _, nocrc_total = ours(False, checksum=False)
    async_block, async_total = ours(True)

    def torch_save():
        f = root / 'ts.pt'; t = time.perf_counter()
        with open(f, 'wb') as fh: torch.save(state, fh); fh.flush(); os.fsync(fh.fileno())
        dt = time.perf_counter() - t; f.unlink(); return dt
    ts = min(torch_save() for _ in range(a.repeat))

    rows = [('dd sequential write (fdatasync)', dd), ('torch.save + fsync (one file)', ts),
            ('nxpretrain save, sync (DCP + fsync + CRC-32 manifest)', sync_total), ('nxpretrain save, sync, sizes-only manifest (checksum=False)', nocrc_total),
            ('nxpretrain save, async: total until complete', async_total)]
    print(f"\n| writer | seconds | MiB/s | vs dd |\n| --- | --- | --- | --- |")
    for name, t in rows: print(f"| {name} | {t:.3f} | {mib / t:.0f} | {dd / t:.2f} |")
    print(f"\n| save as the training loop sees it | blocked s | vs sync |\n| --- | --- | --- |")
    print(f"| sync | {sync_block:.3f} | 1.00 |\n| async (next step {a.step_s:.1f} s of compute) | {async_block:.3f} | {async_block / sync_block:.2f} |")
    print(f"\nsave throughput / dd = {dd / sync_total:.2f} with CRC, {dd / nocrc_total:.2f} without (target ≥ 0.80); "
          f"async blocking / sync = {async_block / sync_block:.2f} (target ≤ 0.10)")
    if not a.dir: shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    main()
