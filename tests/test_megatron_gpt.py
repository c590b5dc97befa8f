"""nxpretrain's GPT equals megatron-core's GPTModel given the same weights: the loss (megatron-core's own
vocab-parallel cross-entropy) and every parameter's gradient. The weight mapping is the one `bench_model.py --megatron`
uses (bench/mcore_gpt.py), so this also proves that its megatron-core row runs the same model as ours."""
import os, sys
import pytest, torch
from nxpretrain.testing.spawn import run_distributed

pytest.importorskip('megatron.core')
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'bench')


def megatron_against_ours(layers: int, hidden: int, heads: int, vocab: int, seq: int):
    "Runs in a fresh process (megatron-core keeps global state): max relative differences of the loss and gradients."
    sys.path.insert(0, BENCH)
    import torch.nn.functional as F
    import mcore_gpt
    from nxpretrain.recipes import get_recipe
    from nxpretrain.models.args import padded_vocab
    from nxpretrain.models.registry import build_model
    from nxpretrain.models.hf_mapping import randomize_, max_rel_diff
    r = get_recipe('gpt3_tiny', f'model.n_layers={layers}', f'model.hidden={hidden}', f'model.n_heads={heads}',
                   f'model.vocab_size={vocab}', f'model.seq_len={seq}', 'model.dropout=0.0')
    cfg = r.model
    ours = randomize_(build_model(cfg), std=0.5, seed=1).train()
    theirs, spec = mcore_gpt.megatron_gpt(cfg, padded_vocab(cfg), 'cpu')
    mcore_gpt.load_weights(theirs.train(), cfg, ours.state_dict(), spec)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (2, seq + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    loss_ours = F.cross_entropy(ours(x).flatten(0, 1), y.flatten())
    loss_theirs = mcore_gpt.megatron_loss(theirs, seq, 'cpu')(x, y)
    loss_ours.backward()
    loss_theirs.backward()
    grads_ours = mcore_gpt.megatron_state_dict(cfg, {k: p.grad for k, p in ours.named_parameters()}, te=False)
    grads_theirs = {k: p.grad for k, p in theirs.named_parameters()}
    assert set(grads_theirs) <= set(grads_ours), set(grads_theirs) - set(grads_ours)
    return dict(spec=spec, loss=abs(loss_ours.item() - loss_theirs.item()) / loss_ours.item(),
                grads={k: max_rel_diff(grads_theirs[k], grads_ours[k]) for k in grads_theirs})


def test_gpt_equals_megatron_core_gptmodel():
    res = run_distributed(megatron_against_ours, 1, 2, 64, 4, 256, 32, timeout=180)[0]
    assert res['spec'] == 'local'
    assert res['loss'] <= 1e-6, res['loss']
    assert len(res['grads']) == 2 + 2 + 12 * 2, sorted(res['grads'])   # embeddings, final norm, 12 tensors per layer
    worst = max(res['grads'], key=res['grads'].get)
    assert res['grads'][worst] <= 1e-5, (worst, res['grads'][worst])
