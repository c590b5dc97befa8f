"""Peak memory and time of the LM loss, plain against chunked (`parallel.loss_chunk`), side by side.

A small-hidden Llama (1 layer × 64 by default) with Llama 3's vocabulary (128,256) on one 8,192-token sequence: the
output head and cross-entropy dominate its memory. For each loss the benchmark runs forward and backward from the
final hidden states to their gradient and the head's, and reports

- peak live tensor bytes above what existed before (a dispatch-mode counter of tensor storage: what a caching
  allocator's `max_memory_allocated` would say; CPU RSS under-counts, as freed pages are reused);
- on a real device also the process's high-water RSS growth (VmHWM), as a cross-check, and the wall time.

`--device meta` counts the same bytes without allocating them (shapes only), for a machine with less free memory
than the plain loss needs (about 13 GiB in fp32 at the defaults). Each loss runs in a fresh subprocess.

`--tp N` runs both losses vocab-parallel over N gloo processes (real tensors): the head's weight sharded over the
vocabulary, the plain loss on its vocabulary-sharded logits under `loss_parallel()` (what a TP head feeding the whole
sequence's logits to the loss does), the chunked one fused with each rank's slice; figures are the largest rank's.

    python bench/bench_loss.py                             # meta: bytes only, both losses at full size
    python bench/bench_loss.py --device cpu --seq 2048     # real tensors: bytes, RSS and time
    python bench/bench_loss.py --device cpu --seq 2048 --tp 2 --threads 1
"""
import argparse, json, os, subprocess, sys, time, weakref
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from nxpretrain.machine import cpu_flags


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--vocab', type=int, default=128_256)
    p.add_argument('--seq', type=int, default=8192)
    p.add_argument('--hidden', type=int, default=64)
    p.add_argument('--chunk', type=int, default=1024, help='tokens per loss chunk (parallel.loss_chunk)')
    p.add_argument('--precision', default='fp32', choices=['fp32', 'bf16'])
    p.add_argument('--device', default='meta', choices=['meta', 'cpu', 'cuda'])
    p.add_argument('--threads', type=int, default=2, help='threads per process')
    p.add_argument('--tp', type=int, default=1, help='vocab-parallel over this many gloo processes (real devices)')
    p.add_argument('--one', choices=['plain', 'chunked'], help=argparse.SUPPRESS)   # the subprocess's own run
    return p.parse_args()


class LiveBytes(TorchDispatchMode):
    "Peak bytes of tensor storage that ops created while the mode is on and that is still referenced."
    def __init__(self):
        super().__init__()
        self.refs, self.now, self.peak = {}, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aliases = [r.alias_info is not None for r in func._schema.returns]
        outs = out if isinstance(out, (tuple, list)) else [out]
        for i, t in enumerate(tree_leaves(outs)):
            if isinstance(t, torch.Tensor) and not (i < len(aliases) and aliases[i]): self._track(t)
        return out

    def _track(self, t):
        key = t.untyped_storage()._cdata
        if key not in self.refs:
            self.refs[key] = [0, t.untyped_storage().nbytes()]
            self.now += self.refs[key][1]
            self.peak = max(self.peak, self.now)
        self.refs[key][0] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key):
        entry = self.refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.refs[key]


def hwm_kib() -> int:
    "The process's high-water resident set (VmHWM) in KiB."
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'): return int(line.split()[1])
    return 0


def hidden_and_head(a):
    "The final hidden states (1, seq, hidden) of a 1-layer Llama, as a leaf, and its output head."
    from nxpretrain.recipes import get_recipe
    from nxpretrain.models.registry import build_model
    from nxpretrain.parallel.loss import ChunkedHead
    r = get_recipe('llama3_tiny', 'model.n_layers=1', f'model.hidden={a.hidden}', 'model.n_heads=4',
                   'model.n_kv_heads=2', f'model.ffn_hidden={2 * a.hidden}', f'model.vocab_size={a.vocab}',
                   f'model.seq_len={a.seq}')
    with torch.device(a.device):
        model = build_model(r.model, a.vocab)
    head = ChunkedHead(model.output, a.chunk)
    model.output = head   # the forward now stops at the hidden states
    tokens = torch.randint(0, a.vocab, (1, a.seq + 1), device=a.device)
    with torch.no_grad(): h = model(tokens[:, :-1])
    return h.detach().requires_grad_(), head, tokens[:, 1:]


def shard_head(head, h):
    "The head's weight sharded over the vocabulary across the TP ranks, and `h` as a replicated DTensor."
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh('cpu', (dist.get_world_size(),))
    head.weight = torch.nn.Parameter(distribute_tensor(head.weight.detach(), mesh, [Shard(0)]))
    return DTensor.from_local(h, mesh, [Replicate()], run_check=False)


def run_one(a) -> dict:
    "Forward and backward of one loss under the byte counter (run in its own process, or in each TP process)."
    from contextlib import nullcontext
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel
    from nxpretrain.parallel.loss import token_loss_sum
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    h, head, labels = hidden_and_head(a)
    h_plain = shard_head(head, h) if a.tp > 1 else h
    if a.device != 'meta':
        with open('/proc/self/clear_refs', 'w') as f: f.write('5')   # reset VmHWM to the current RSS
    hwm0, t0 = hwm_kib(), time.perf_counter()
    with LiveBytes() as live, torch.autocast(a.device if a.device != 'meta' else 'cpu', torch.bfloat16,
                                             enabled=a.precision == 'bf16'):
        with loss_parallel() if a.tp > 1 else nullcontext():
            if a.one == 'plain': loss = token_loss_sum(F.linear(h_plain, head.weight), labels)
            else: loss = head.loss_sum(h, labels)
            loss.backward()
    loss = loss.to_local() if isinstance(loss, DTensor) else loss   # the plain loss of sharded logits: replicated
    seconds = time.perf_counter() - t0
    return dict(peak_bytes=live.peak, rss_growth=(hwm_kib() - hwm0) * 1024 if a.device != 'meta' else None,
                seconds=seconds if a.device != 'meta' else None,
                loss=None if a.device == 'meta' else loss.item(),
                grad_w=None if a.device == 'meta' else grad_norm(head.weight.grad))


def grad_norm(g) -> float:
    "The norm of a gradient, whole (a sharded one's over every rank)."
    from torch.distributed.tensor import DTensor
    return (g.full_tensor() if isinstance(g, DTensor) else g).double().norm().item()


def run_tp(a) -> dict:
    "`run_one` on each of `a.tp` gloo processes: the largest rank's bytes and time."
    from nxpretrain.testing.spawn import run_distributed
    ranks = run_distributed(run_one, a.tp, a, timeout=1800, threads=a.threads)
    worst = {k: max(r[k] for r in ranks) for k in ('peak_bytes', 'rss_growth', 'seconds')}
    return ranks[0] | worst


def main():
    a = parse()
    if a.precision == 'bf16' and a.device == 'meta':
        sys.exit('--precision bf16 needs a real device (autocast does not cast meta tensors): add --device cpu or cuda')
    if a.tp > 1 and a.device != 'cpu':
        sys.exit('--tp runs on gloo processes with real CPU tensors: add --device cpu')
    if a.one:
        print(json.dumps(run_tp(a) if a.tp > 1 else run_one(a)))
        return
    args = [a for a in sys.argv[1:]]
    res = {}
    for kind in ('plain', 'chunked'):
        p = subprocess.run([sys.executable, __file__, *args, '--one', kind], capture_output=True, text=True)
        if p.returncode: sys.exit(f'{kind} loss failed:\n{p.stderr[-2000:]}')
        res[kind] = json.loads(p.stdout.strip().splitlines()[-1])
    gib = 2**30
    print(
        f'loss of vocab {a.vocab:,} × seq {a.seq:,} (hidden {a.hidden}), {a.precision}, device {a.device}, '
        f'chunk {a.chunk} tokens, {a.threads} threads' + (f' × TP {a.tp} processes (largest rank)' if a.tp > 1 else '')
    )
    print(f'CPU flags: {cpu_flags()}; load average {os.getloadavg()[0]:.2f} (a shared machine: times are not '
          f'idle-machine figures); torch {torch.__version__}')
    print(f"{'':24}{'plain':>12}{'chunked':>12}{'plain/chunked':>16}")
    rows = [('peak live tensors, GiB', 'peak_bytes', gib), ('RSS growth (VmHWM), GiB', 'rss_growth', gib),
            ('wall time, s', 'seconds', 1)]
    for label, key, unit in rows:
        p, c = res['plain'][key], res['chunked'][key]
        if p is None: continue
        print(f'{label:24}{p / unit:12.3f}{c / unit:12.3f}{p / max(c, 1e-12):16.2f}')
    if res['plain']['loss'] is not None:
        p, c = res['plain'], res['chunked']
        print(f"loss {p['loss']:.6f} vs {c['loss']:.6f} (rel {abs(p['loss'] - c['loss']) / abs(p['loss']):.1e}); "
              f"|grad W| rel {abs(p['grad_w'] - c['grad_w']) / p['grad_w']:.1e}")


if __name__ == '__main__':
    main()
