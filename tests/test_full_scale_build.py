"""Full-size models built on `meta` for chosen ranks of their real world, on torch's fake process group, in this one
process: every rank holds its shards only, of the shapes the layout implies."""
import math, pytest, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from nxpretrain.recipes import get_recipe
from nxpretrain.config import world_size
from nxpretrain.models.args import padded_vocab
from nxpretrain.parallel.state import initialize_model_parallel, destroy_model_parallel
from nxpretrain.parallel.parallelize import build_parallel_model


def local_shapes(recipe, rank: int) -> dict:
    "{name: local shape} of `rank`'s parameters of `recipe` at its real world size (built on meta, fake process group)."
    dist.init_process_group('fake', store=FakeStore(), rank=rank, world_size=world_size(recipe))
    try:
        p = recipe.parallel
        pm = build_parallel_model(recipe, initialize_model_parallel(p.tp, p.pp, p.cp, 'cpu'), device='meta')
        return {n: tuple(t.to_local().shape if hasattr(t, 'to_local') else t.shape) for n, t in pm.named_parameters()}
    finally:
        destroy_model_parallel()
        dist.destroy_process_group()


def test_gpt3_175b_gpu_first_and_last_rank_hold_their_shards_only():
    r = get_recipe('gpt3_175b_gpu')   # 16 nodes × 8 H100: TP 8 × PP 16, DP 1, sequence parallel, ZeRO-1
    H, F, tp = r.model.hidden, r.model.ffn, r.parallel.tp
    V = padded_vocab(r.model, tp)
    assert world_size(r) == 128 and V % tp == 0 and V >= r.model.vocab_size
    block = {'attention.wq.weight': (H // tp, H), 'attention.wq.bias': (H // tp,), 'attention.wk.weight': (H // tp, H),
             'attention.wv.weight': (H // tp, H), 'attention.wo.weight': (H, H // tp), 'attention.wo.bias': (H,),
             'mlp.w1.weight': (F // tp, H), 'mlp.w1.bias': (F // tp,), 'mlp.w2.weight': (H, F // tp),
             'mlp.w2.bias': (H,), 'attention_norm.weight': (H,), 'ffn_norm.bias': (H,)}
    first, last = local_shapes(r, 0), local_shapes(r, 127)
    assert first['tok_embeddings.weight'] == (V // tp, H) and first['pos_embeddings.weight'] == (r.model.positions, H)
    assert last['output.weight'] == (V // tp, H) and last['norm.weight'] == (H,)
    assert {n.split('.')[1] for n in first if n.startswith('layers.')} == {str(i) for i in range(6)}    # 96 / 16 stages
    assert {n.split('.')[1] for n in last if n.startswith('layers.')} == {str(i) for i in range(90, 96)}
    for shapes, layers in ((first, range(6)), (last, range(90, 96))):
        for i in layers:
            for name, shape in block.items(): assert shapes[f'layers.{i}.{name}'] == shape, (i, name)
    per_block = sum(math.prod(s) for n, s in first.items() if n.startswith('layers.0.'))
    attention = 3 * (H // tp * H + H // tp) + (H * (H // tp) + H)     # q, k, v by columns; o by rows, its bias whole
    mlp = (F // tp * H + F // tp) + (H * (F // tp) + H)
    assert per_block == attention + mlp + 4 * H                          # + two LayerNorms, whole under SP
    fp32_bytes = lambda shapes: 4 * sum(math.prod(s) for s in shapes.values())
    assert fp32_bytes(first) == 4 * (6 * per_block + V // tp * H + r.model.positions * H)          # ≈ 5.8 GB
    assert fp32_bytes(last) == 4 * (6 * per_block + V // tp * H + 2 * H)                            # ≈ 5.7 GB


@pytest.mark.parametrize('name', ['llama3_70b_trn2', 'llama3_70b_cp', 'llama31_70b'])
def test_llama3_70b_layouts_build_per_rank(name):
    "512 NeuronCores: every rank's share is about 1/TP·PP of the model, and the first and last stage differ as cut."
    r = get_recipe(name)
    total = sum(math.prod(s) for s in local_shapes(r, 0).values()) + sum(
        math.prod(s) for s in local_shapes(r, world_size(r) - 1).values()
    )
    assert 0.5 * 70.5e9 / (r.parallel.tp * r.parallel.pp) < total / 2 < 2.0 * 70.5e9 / (r.parallel.tp * r.parallel.pp)
