"""Hugging Face weights in under a parallel layout: a Llama 3 folder (GQA) made locally with `transformers` is imported
one tensor at a time and continual pretraining starts from it under TP2 and PP2 with the same losses as in one
process; a folder with a wrong shape fails before anything is written."""
import pytest
import torch
from nxpretrain.recipes import get_recipe
from nxpretrain.config import override
from nxpretrain.train.trainer import train
from train_helpers import dist_train, close
from nxpretrain.convert.convert import convert

R = get_recipe('llama3_tiny', 'data.corpus=synthetic', 'model.vocab_size=512', 'model.n_layers=2', 'model.hidden=64',
               'model.n_heads=8', 'model.n_kv_heads=2', 'model.ffn_hidden=176', 'model.seq_len=32',
               'data.micro_batch=2', 'data.global_batch=4', 'trainer.threads=1', 'trainer.eval_every=0',
               'trainer.save_every=0', 'parallel.precision=fp32',
               'model.norm_eps=1e-6')   # transformers' LlamaConfig default, which the import checks
STEPS = 3


@pytest.fixture(scope='module')
def hf_folder(tmp_path_factory):
    import transformers as T
    cfg = T.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64, rope_theta=500000.0,
                        tie_word_embeddings=False)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp('hf') / 'llama'
    T.LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    return d


def test_continual_pretraining_from_hf_under_tp2_and_pp2(tmp_path, hf_folder):
    ck = convert(hf_folder, 'native', tmp_path / 'imported', recipe=R)
    one = train(R, str(tmp_path / 'one'), STEPS, resume_from=str(ck), weights_only=True, progress=False)
    fresh = train(R, str(tmp_path / 'fresh'), STEPS, progress=False)
    assert one.losses[0] != fresh.losses[0]           # the HF weights were used
    for lay in ('parallel.tp=2', 'parallel.pp=2'):
        close(dist_train(override(R, lay), tmp_path / lay, STEPS, resume_from=str(ck), weights_only=True).losses,
              one.losses)


def test_wrong_shape_fails_before_writing(tmp_path, hf_folder):
    from nxpretrain.errors import RecipeError
    with pytest.raises(RecipeError, match='ffn: 176 vs 128'):
        convert(hf_folder, 'native', tmp_path / 'bad', recipe=override(R, 'model.ffn_hidden=128'))
    assert not (tmp_path / 'bad').exists()
