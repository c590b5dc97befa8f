"""ZeRO-1 optimizer bytes per rank: whole tensors per rank (`Zero1Optimizer`) against equal flat slices
(`FlatZero1Optimizer`), measured from the optimizer state after a real training step on gloo processes.

    python bench/bench_zero.py                               # llama3_tiny at full size, DP 4
    python bench/bench_zero.py --recipe gpt3_tiny --world 4 --tp 2
"""
import argparse, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
from nxpretrain.testing.spawn import run_distributed


def state_bytes(args, flat: bool) -> int:
    """Runs on every rank: one optimizer step of the recipe under ZeRO-1; this rank's optimizer state bytes (local
    shards)."""
    from nxpretrain.recipes import get_recipe
    from nxpretrain.parallel.state import initialize_model_parallel, destroy_model_parallel
    from nxpretrain.parallel.parallelize import build_parallel_model
    from nxpretrain.train.step import param_groups
    from nxpretrain.parallel.zero import Zero1Optimizer, FlatZero1Optimizer, local
    from nxpretrain.parallel.fsdp import dp_shard
    r = get_recipe(args.recipe, f'parallel.tp={args.tp}', 'parallel.zero1=true', 'parallel.precision=fp32',
                   f'data.micro_batch=1', f'data.global_batch={args.world // args.tp}', 'model.seq_len=32')
    st = initialize_model_parallel(args.tp, 1, 1, 'cpu')
    pm = build_parallel_model(r, st, seed=0)
    cls = FlatZero1Optimizer if flat else Zero1Optimizer
    opt = cls(param_groups(pm.named_parameters(), 0.1), pm.dp_cp_group, torch.optim.AdamW, lr=1e-4)
    tokens = torch.randint(0, r.model.vocab_size, (r.data.global_batch, r.model.seq_len + 1))
    pm.forward_backward(dp_shard(tokens[:, :-1], st), dp_shard(tokens[:, 1:], st))
    opt.step()
    n = sum(
        local(v).numel() * v.element_size() for s in opt.inner.state.values() for v in s.values() if torch.is_tensor(v)
    )
    destroy_model_parallel()
    return n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--recipe', default='llama3_tiny')
    p.add_argument('--world', type=int, default=4)
    p.add_argument('--tp', type=int, default=1)
    a = p.parse_args()
    print(f'{a.recipe}, world {a.world}, tp {a.tp}, ZeRO-1 over DP {a.world // a.tp}: AdamW state bytes per rank')
    for flat in (False, True):
        b = run_distributed(state_bytes, a.world, a, flat, timeout=600)
        spread = (max(b) - min(b)) / max(b)
        print(f"{'flat slices' if flat else 'whole tensors':<14} {b}  spread {spread:.4%}")


if __name__ == '__main__':
    main()
