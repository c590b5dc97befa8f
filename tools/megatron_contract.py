"""Regenerate the `flags` section of nxpretrain/engines/megatron/contract.yaml from a Megatron-LM checkout: for every
flag our export may write, its argparse facts at that commit (type, default, choices, nargs, action) and its line in
megatron/training/arguments.py. The other sections (checks, log, checkpoint, signals) are written by hand from the same
source, each with its line; this script keeps them as they are.

    python tools/megatron_contract.py MEGATRON_LM_CHECKOUT [COMMIT]

Reads the checkout's source as text (ast); runs none of it."""
import ast, sys
from pathlib import Path
import yaml

CONTRACT = Path(__file__).resolve().parents[1] / 'nxpretrain/engines/megatron/contract.yaml'
FLAGS = """num-layers hidden-size ffn-hidden-size num-attention-heads seq-length max-position-embeddings
attention-backend position-embedding-type init-method-std hidden-dropout attention-dropout norm-epsilon
untie-embeddings-and-output-weights make-vocab-size-divisible-by transformer-impl
tensor-model-parallel-size pipeline-model-parallel-size num-layers-per-virtual-pipeline-stage context-parallel-size
sequence-parallel use-distributed-optimizer overlap-grad-reduce overlap-param-gather
recompute-granularity recompute-method recompute-num-layers recompute-modules
micro-batch-size global-batch-size rampup-batch-size train-iters lr min-lr lr-decay-style lr-warmup-iters
lr-warmup-fraction lr-decay-iters weight-decay adam-beta1 adam-beta2 adam-eps clip-grad bf16 fp16 seed
data-path split vocab-file merge-file tokenizer-type data-cache-path num-workers
save load save-interval ckpt-format ckpt-fully-parallel-load use-persistent-ckpt-worker
ckpt-assume-constant-structure log-interval eval-interval eval-iters tensorboard-dir log-throughput
log-validation-ppl-to-tensorboard exit-signal-handler exit-duration-in-mins distributed-timeout-minutes""".split()


def literal(node):
    "A keyword's value as plain data where it is a literal; its source text otherwise."
    try: return ast.literal_eval(node)
    except ValueError: return ast.unparse(node)


def argparse_facts(arguments_py: Path) -> dict:
    "--flag → {line, type, default, choices, nargs, action} of every add_argument call in `arguments_py`."
    out = {}
    for node in ast.walk(ast.parse(arguments_py.read_text())):
        if not (isinstance(node, ast.Call) and getattr(node.func, 'attr', '') == 'add_argument'): continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith('--')]
        facts = {'line': node.lineno}
        for kw in node.keywords:
            if kw.arg in ('type', 'default', 'choices', 'nargs', 'action', 'dest'):
                facts[kw.arg] = ast.unparse(kw.value) if kw.arg == 'type' else literal(kw.value)
        for n in names: out[n[2:]] = facts
    return out


def main(checkout, commit=''):
    facts = argparse_facts(Path(checkout) / 'megatron/training/arguments.py')
    missing = [f for f in FLAGS if f not in facts]
    if missing: sys.exit(f"not in this checkout's arguments.py: {', '.join(missing)}")
    contract = yaml.safe_load(CONTRACT.read_text()) if CONTRACT.exists() else {}
    if commit: contract['commit'] = commit
    contract['flags'] = {f: facts[f] for f in FLAGS}
    CONTRACT.write_text(yaml.safe_dump(contract, sort_keys=False, width=116, allow_unicode=True))
    print(f"{CONTRACT}: {len(FLAGS)} flags from {checkout}")


if __name__ == '__main__': main(*sys.argv[1:])
