"""Megatron-LM's own argument checks on our exported flags, at the commit a job pins: `parse_args` and `validate_args`
(megatron/training/arguments.py), then megatron-core's num-microbatches calculator and `TransformerConfig`, as
`pretrain_gpt.py` reaches them before it needs a GPU.

    python tools/megatron_check.py MEGATRON_LM_CHECKOUT FLAGS_FILE WORLD_SIZE [--env NAME=VALUE ...]

The checkout is the one the job runs (`git archive e958b2ca | tar -x`, or the fetch tool's snapshot): its code runs
here, in this process, and is never copied into nxpretrain. Prints `ok: …` and exits 0, or the first error in one line
and exits 1. CPU only: the one GPU query on the way (`get_device_arch_version`) answers Hopper (9). Commits from
mid-2025 on (878d65f, which seed 2's set-up script checks out) decorate triton kernels when they are imported: there,
`pip install triton` first (it imports without a GPU)."""
import os, sys, time
from pathlib import Path


def flags(path) -> list[str]:
    "The words of a flags file: one flag with its values per line; blank lines and `#` comments skipped."
    words = []
    for line in Path(path).read_text().splitlines():
        line = line.split('#', 1)[0].strip()
        if line: words += line.split()
    return words


def check(checkout: str, flags_file: str, world: int, env: dict | None = None, arch: int = 9) -> str:
    "Megatron-LM's verdict on the flags at `checkout` for `world` ranks: 'ok: …', or raises with its message."
    sys.path.insert(0, str(Path(checkout).absolute()))   # its megatron/ (core included) before any installed one
    os.environ.update({'RANK': '0', 'WORLD_SIZE': str(world), **(env or {})})
    import megatron.training.arguments as A
    A.get_device_arch_version = lambda: arch          # the one CUDA query validate_args makes (TP=1 with CP>1)
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator, get_num_microbatches
    sys.argv = ['pretrain_gpt.py', *flags(flags_file)]
    args = A.parse_args()
    A.validate_args(args, {'tokenizer_type': 'GPT2BPETokenizer'})          # pretrain_gpt.py's args_defaults
    init_num_microbatches_calculator(0, args.rampup_batch_size, args.global_batch_size, args.micro_batch_size,
                                     args.data_parallel_size)
    cfg = A.core_transformer_config_from_args(args)
    return (f"ok: world {world} = TP {args.tensor_model_parallel_size} × PP {args.pipeline_model_parallel_size} × "
            f"CP {args.context_parallel_size} × DP {args.data_parallel_size}; {get_num_microbatches()} micro-batches "
            f"of {args.micro_batch_size}; {cfg.num_layers} layers × {cfg.hidden_size}, ffn {cfg.ffn_hidden_size}, "
            f"{'bf16' if args.bf16 else 'fp16' if args.fp16 else 'fp32'}, checkpoints {args.ckpt_format}")


def main(argv):
    if len(argv) < 3: sys.exit(__doc__)
    env = dict(a.split('=', 1) for a in argv[3:] if '=' in a)
    t0 = time.time()
    try: print(check(argv[0], argv[1], int(argv[2]), env), f"({time.time() - t0:.1f} s)")
    except BaseException as e:                     # argparse exits (SystemExit); asserts and ValueErrors say why
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        print(f"rejected: {type(e).__name__}: {msg}")
        sys.exit(1)


if __name__ == '__main__': main(sys.argv[1:])
