"""BERT pretraining (MLM + NSP, LAMB) through the trainer on the demo corpus: DP, TP and ZeRO-1 runs equal the
single-process run, a stopped run resumes bit for bit, and the checkpoint exports to a folder
`transformers.BertForPreTraining` loads with the same MLM and NSP logits."""
import pytest
import torch
from nxpretrain.recipes import get_recipe
from nxpretrain.config import override
from nxpretrain.train.trainer import train
from train_helpers import dist_train, close

STEPS, HALF = 4, 2
R = get_recipe('bert_tiny', 'model.hidden=64', 'model.seq_len=64', 'data.micro_batch=2', 'data.global_batch=8',
               'trainer.threads=1', 'trainer.save_every=2', 'trainer.eval_every=2', 'trainer.eval_steps=1',
               'trainer.log_every=2', 'optim.warmup_steps=1', f'optim.decay_steps={STEPS}')


def layout(**kw): return override(R, *[f'parallel.{k}={v}' for k, v in kw.items()])


@pytest.fixture(scope='module')
def single(tmp_path_factory):
    torch.set_num_threads(1)
    res = train(R, str(tmp_path_factory.mktemp('single')), STEPS, progress=False)
    assert R.optim.name == 'lamb' and set(res.eval) == {'loss', 'perplexity', 'nsp_loss', 'nsp_accuracy'}, res.eval
    return res


def test_dp2_and_tp2_match_single_process(tmp_path, single):
    for name, lay in (('dp2', layout(dp=2)), ('tp2', layout(tp=2))):
        got = dist_train(lay, tmp_path / name, STEPS)
        close(got.losses, single.losses)
        close([got.eval['loss'], got.eval['nsp_loss'], got.eval['nsp_accuracy']],
              [single.eval['loss'], single.eval['nsp_loss'], single.eval['nsp_accuracy']])
    # the TP2 checkpoint of step 2 (8196 ids padded to 8320 rows on every layout) resumes in one process
    moved = train(R, str(tmp_path / 'moved'), STEPS,
                  resume_from=str(tmp_path / 'tp2' / 'bert_tiny' / 'checkpoints' / f'step_{HALF}'), progress=False)
    assert moved.start_step == HALF
    close(moved.losses, single.losses[HALF:])


def test_zero1_lamb_resumes_bit_for_bit(tmp_path, single):
    z = layout(dp=2, zero1=True)
    half = dist_train(z, tmp_path / 'cut', HALF)
    rest = dist_train(z, tmp_path / 'cut', STEPS)
    assert rest.start_step == HALF
    close(half.losses + rest.losses, single.losses)             # LAMB state sharded over DP equals one process
    again = dist_train(z, tmp_path / 'again', STEPS)
    assert half.losses + rest.losses == again.losses             # the resume is exact on the same layout


def test_checkpoint_exports_to_transformers(tmp_path, single):
    from transformers import BertForPreTraining
    from nxpretrain.convert.convert import convert
    from nxpretrain.train.checkpoint import checkpoint_recipe
    from nxpretrain.models.registry import build_model
    from nxpretrain.train.checkpoint import load_weights
    from nxpretrain.models.args import padded_vocab
    ck = single.last_checkpoint
    out = convert(ck, 'hf', tmp_path / 'hf', data_root='runs/data')   # where `train` put the demo tokenizer
    hf = BertForPreTraining.from_pretrained(out).eval()
    r = checkpoint_recipe(ck)
    ours = build_model(r.model, padded_vocab(r.model, r.parallel.tp))
    load_weights(ours, ck)
    ours.eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(r.model.vocab_size, (2, 64), generator=g)
    types = (torch.arange(64) >= 30).long().expand(2, 64)
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, 50:] = 0
    with torch.no_grad():
        mlm, nsp = ours(ids, token_types=types, attention_mask=mask)
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    V = ref.prediction_logits.shape[-1]
    assert torch.allclose(mlm[..., :V], ref.prediction_logits, atol=1e-4), (
        (mlm[..., :V] - ref.prediction_logits).abs().max()
    )
    assert torch.allclose(nsp, ref.seq_relationship_logits, atol=1e-5)
