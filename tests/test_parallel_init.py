"""Initialisation does not depend on the layout: right after `build_parallel_model` (built on meta, each rank
materialising only its shards), the gathered weights of every layout equal the one-process model's bit for bit."""
import pytest, torch
from nxpretrain.testing.spawn import run_distributed

SP = 'parallel.sequence_parallel=true'
LAYOUTS = [
    ('tp2', 2, 'gpt', ('parallel.tp=2', SP)),
    ('pp2', 2, 'gpt', ('parallel.pp=2',)),
    ('fsdp_dp2', 2, 'llama', ('parallel.fsdp=true',)),
    ('zero1_dp2', 2, 'gpt', ('parallel.zero1=true',)),
    ('tp2_pp2', 4, 'llama', ('parallel.tp=2', 'parallel.pp=2', SP)),
    ('tp2_fsdp_dp2', 4, 'gpt', ('parallel.tp=2', 'parallel.fsdp=true', SP)),
    ('kv_replicated_tp4', 4, 'llama', ('parallel.tp=4', 'parallel.kv_replicator=2', SP)),
    ('interleaved_pp2', 2, 'gpt',
     ('model.n_layers=4', 'parallel.pp=2', 'parallel.virtual_pp=2', 'parallel.pp_schedule=interleaved')),
    ('bert_tp2', 2, 'bert', ('parallel.tp=2',)),
]


def gathered_weights(arch: str, overrides: tuple, seed: int = 3) -> dict:
    "On every rank: this rank's parameters after init, gathered to whole tensors (K/V replicas undone), by name."
    from nxpretrain.testing.layouts import tiny_recipe
    from nxpretrain.parallel.state import initialize_model_parallel, destroy_model_parallel
    from nxpretrain.parallel.parallelize import build_parallel_model
    from nxpretrain.parallel.tensor_parallel import unreplicate_kv, kv_replicated_params
    r = tiny_recipe(arch, *overrides)
    st = initialize_model_parallel(r.parallel.tp, r.parallel.pp, r.parallel.cp, 'cpu')
    pm = build_parallel_model(r, st, seed=seed)
    kv = {id(p): (k, hd) for part in pm.parts for p, k, hd in kv_replicated_params(part)}
    out = {}
    for name, p in pm.named_parameters():
        w = p.full_tensor() if hasattr(p, 'full_tensor') else p
        # plain arrays travel back
        out[name] = (unreplicate_kv(w, *kv[id(p)]) if id(p) in kv else w).detach().numpy().copy()
    destroy_model_parallel()
    return out


@pytest.mark.parametrize('name,world,arch,overrides', LAYOUTS, ids=[l[0] for l in LAYOUTS])
def test_initial_weights_equal_the_single_process_model(name, world, arch, overrides):
    from nxpretrain.testing.layouts import tiny_recipe
    from nxpretrain.models.registry import build_model
    from nxpretrain.models.args import padded_vocab
    r = tiny_recipe(arch, *overrides)
    # a tied head under its own name too
    ref = dict(
        build_model(r.model, padded_vocab(r.model, r.parallel.tp), seed=3).named_parameters(remove_duplicate=False)
    )
    ranks = run_distributed(gathered_weights, world, arch, overrides, timeout=120)
    seen = set()
    for rank, weights in enumerate(ranks):
        for n, w in weights.items():
            assert torch.equal(torch.from_numpy(w), ref[n].detach()), (
                f"rank {rank}: {n} differs from the one-process model"
            )
            seen.add(n)
    missing = set(ref) - seen - {'output.weight'}   # a tied head is the embedding unless a pipeline separates them
    assert not missing, f"parameters no rank holds: {missing}"


def test_a_different_seed_gives_different_weights():
    "The check can fail: another seed changes every random tensor."
    from nxpretrain.testing.layouts import tiny_recipe
    from nxpretrain.models.registry import build_model
    r = tiny_recipe('gpt')
    a, b = build_model(r.model, seed=3), build_model(r.model, seed=4)
    assert not torch.equal(a.layers['0'].mlp.w1.weight, b.layers['0'].mlp.w1.weight)
