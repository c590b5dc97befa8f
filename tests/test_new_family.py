"""Model families defined here, in the test file alone, with no package file changed. A causal one (SwiGPT) registers
itself, plans, trains under TP2 and PP2 on real gloo processes (equal to its one-process model) and checkpoints, then
resumes. A non-causal one (an encoder with a masked-LM objective of its own, mapped to transformers' BertForMaskedLM)
plans, trains under TP2 and FSDP equal to one process with its own batch inputs, and round-trips through transformers
with the same logits."""
import dataclasses
import torch, torch.nn as nn, torch.nn.functional as F
from nxpretrain.models.families import ModelFamily, register_family
from nxpretrain.models.objective import Objective, IGNORE_INDEX
from nxpretrain.models.bert import BERT_HF, bert_block
from nxpretrain.models.blocks import Attention, SwiGLU, RMSNorm, TransformerBlock, LanguageModel
from nxpretrain.models.args import padded_vocab
from nxpretrain.recipes import get_recipe


class SwiGPT(LanguageModel):
    "GPT's learned positions with Llama's RMSNorm and SwiGLU, no biases: a family the package has never seen."
    def __init__(self, cfg, vocab_size=None):
        super().__init__()
        self.cfg, self.vocab_size = cfg, vocab_size or padded_vocab(cfg)
        self.tok_embeddings = nn.Embedding(self.vocab_size, cfg.hidden)
        self.pos_embeddings = nn.Embedding(cfg.positions, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): self.block(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.hidden)
        self.output = nn.Linear(cfg.hidden, self.vocab_size, bias=False)
        self.init_weights()

    @staticmethod
    def block(cfg):
        attention = Attention(cfg.hidden, cfg.n_heads, cfg.n_heads, bias=False, causal=True)
        return TransformerBlock(attention, SwiGLU(cfg.hidden, cfg.ffn), RMSNorm(cfg.hidden), RMSNorm(cfg.hidden))

    def forward(self, tokens, positions=None):
        if self.tok_embeddings is not None:
            if positions is None: positions = torch.arange(tokens.shape[1], device=tokens.device)
            h = self.tok_embeddings(tokens) + self.pos_embeddings(positions)
        else: h = tokens
        h = self.run_layers(h)
        if self.norm is not None: h = self.norm(h)
        return self.output(h) if self.output is not None else h


SWIGPT = register_family(ModelFamily(
    name='swigpt', model=SwiGPT, layouts=('tp', 'sp', 'pp', 'fsdp', 'zero1'),
    tp_plan={'attention.wq': 'colwise', 'attention.wk': 'colwise', 'attention.wv': 'colwise', 'attention.wo': 'rowwise',
             'mlp.w1': 'colwise', 'mlp.w3': 'colwise', 'mlp.w2': 'rowwise'},
    tiny=('gpt3_tiny', ('model.arch=swigpt',))))


class Encoder(LanguageModel):
    "BERT's embeddings, post-norm bidirectional blocks and masked-LM head; no pooler and no next-sentence head."
    def __init__(self, cfg, vocab_size=None):
        super().__init__()
        self.cfg, self.vocab_size = cfg, vocab_size or padded_vocab(cfg)
        H = cfg.hidden
        self.tok_embeddings = nn.Embedding(self.vocab_size, H)
        self.pos_embeddings = nn.Embedding(cfg.positions, H)
        self.type_embeddings = nn.Embedding(cfg.type_vocab_size, H)
        self.embedding_norm = nn.LayerNorm(H, eps=cfg.norm_eps)
        self.layers = nn.ModuleDict({str(i): bert_block(cfg) for i in range(cfg.n_layers)})
        self.mlm_dense, self.mlm_norm = nn.Linear(H, H), nn.LayerNorm(H, eps=cfg.norm_eps)
        self.output = nn.Linear(H, self.vocab_size, bias=True)
        self.init_weights()

    def forward(self, tokens, token_types=None, attention_mask=None, positions=None):
        if self.tok_embeddings is not None:
            if positions is None: positions = torch.arange(tokens.shape[1], device=tokens.device)
            if token_types is None: token_types = torch.zeros_like(tokens)
            h = self.tok_embeddings(tokens) + self.pos_embeddings(positions) + self.type_embeddings(token_types)
            h = self.embedding_norm(h)
        else: h = tokens
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        h = self.run_layers(h, mask=mask)
        if self.output is None: return h
        return self.output(self.mlm_norm(F.gelu(self.mlm_dense(h))))


@dataclasses.dataclass(frozen=True)
class MaskedLM(Objective):
    "Masked-token cross-entropy alone (RoBERTa's objective) on BERT's items: no next-sentence targets."
    name: str = 'mlm'
    causal: bool = False

    def split(self, batch):
        inputs = {'token_types': batch['token_type_ids'], 'attention_mask': batch['attention_mask']}
        return batch['input_ids'], batch['labels'], {}, inputs

    def example(self, tokens, labels, generator=None):
        if generator is None: return labels, {}, {'attention_mask': torch.ones_like(tokens)}
        chosen = torch.rand(tokens.shape, generator=generator) < 0.15
        masked = torch.where(chosen, labels, torch.full_like(labels, IGNORE_INDEX))
        mask = torch.ones_like(tokens)
        mask[::2, -3:] = 0   # padding at the end of every other row: its tokens neither attend nor count
        masked[mask == 0] = IGNORE_INDEX
        return masked, {}, {'attention_mask': mask}


ENCODER_HF = dataclasses.replace(   # BertForMaskedLM names the encoder and the MLM head as BertForPreTraining does
    BERT_HF, architecture='BertForMaskedLM',
    tensors=tuple(t for t in BERT_HF.tensors if not t[0].startswith(('pooler.', 'nsp_head.'))))

ENCODER = register_family(ModelFamily(
    name='encoder_mlm', model=Encoder, objective=MaskedLM(), layouts=('tp', 'fsdp', 'zero1'),
    tp_plan={'attention.wq': 'colwise', 'attention.wk': 'colwise', 'attention.wv': 'colwise', 'attention.wo': 'rowwise',
             'mlp.w1': 'colwise', 'mlp.w2': 'rowwise'},
    hf=ENCODER_HF, tiny=('bert_tiny', ('model.arch=encoder_mlm', 'model.max_position=16'))))


# Functions of this file run on every rank: a rank process imports this file to find them, and so registers the family.
def check_swigpt(overrides):
    from nxpretrain.testing.layouts import check_layout
    return check_layout('swigpt', overrides, 2)

def train_swigpt(recipe, out, steps):
    from nxpretrain.train.trainer import train
    return train(recipe, out, steps, progress=False)

def run(fn, *args):
    from nxpretrain.testing.spawn import run_distributed
    return run_distributed(fn, 2, *args, timeout=300)

def equal_layout(*overrides):
    from nxpretrain.testing.layouts import assert_equal_to_reference
    return assert_equal_to_reference(run(check_swigpt, overrides))

def check_encoder(overrides):
    from nxpretrain.testing.layouts import check_layout
    return check_layout('encoder_mlm', overrides, 2)


def test_it_plans_with_its_own_parameter_count_and_refusals():
    from nxpretrain import plan
    from nxpretrain.models.registry import build_model
    from nxpretrain.models.blocks import count_parameters
    from nxpretrain.validate import problems
    r = get_recipe('gpt3_tiny', 'model.arch=swigpt')
    assert count_parameters(build_model(r.model)) == plan.model_parameters(r.model, padded_vocab(r.model))
    assert plan.plan(r).parameters == plan.model_parameters(r.model, padded_vocab(r.model, r.parallel.tp))
    assert any(
        'parallel.cp>1 with model.arch=swigpt' in p
        for p in problems(get_recipe('gpt3_tiny', 'model.arch=swigpt', 'parallel.cp=2'), 2)
    )


def test_it_trains_under_tp2_equal_to_one_process():
    equal_layout('parallel.tp=2', 'parallel.sequence_parallel=true')


def test_it_trains_under_pp2_equal_to_one_process():
    equal_layout('parallel.pp=2')


def test_it_checkpoints_and_resumes(tmp_path):
    r = get_recipe(
        'gpt3_tiny',
        'model.arch=swigpt',
        'data.corpus=synthetic',
        'model.n_layers=2',
        'model.hidden=32',
        'model.seq_len=16',
        'data.micro_batch=2',
        'data.global_batch=4',
        'parallel.tp=2',
        'trainer.save_every=2',
        'trainer.eval_every=0',
        'optim.warmup_steps=0',
        'optim.decay_steps=4',
        'parallel.precision=fp32',
        'trainer.threads=1',
    )  # a fixed schedule horizon: the 2-step run follows the 4-step one
    whole = run(train_swigpt, r, str(tmp_path / 'whole'), 4)[0]
    first = run(train_swigpt, r, str(tmp_path / 'split'), 2)[0]
    rest = run(train_swigpt, r, str(tmp_path / 'split'), 4)[0]
    assert first.last_checkpoint and rest.start_step == 2
    assert first.losses + rest.losses == whole.losses


def test_the_encoder_plans_and_splits_its_own_batches():
    from nxpretrain import plan
    from nxpretrain.models.registry import build_model
    from nxpretrain.models.blocks import count_parameters
    from nxpretrain.train.trainer import model_inputs
    from nxpretrain.testing.layouts import tiny_recipe, tiny_batch
    r = tiny_recipe('encoder_mlm')
    assert count_parameters(build_model(r.model)) == plan.model_parameters(r.model, padded_vocab(r.model))
    assert plan.plan(r).parameters == plan.model_parameters(r.model, padded_vocab(r.model, r.parallel.tp))
    items = {'input_ids': 1, 'labels': 2, 'token_type_ids': 3, 'attention_mask': 4}
    assert model_inputs(items, ENCODER.objective) == (1, 2, {}, {'token_types': 3, 'attention_mask': 4})
    tokens, labels, targets, inputs = tiny_batch(r)
    assert targets == {} and inputs['attention_mask'][0, -3:].sum() == 0 and (labels[0, -3:] == IGNORE_INDEX).all()


def test_the_encoder_trains_under_tp2_equal_to_one_process():
    from nxpretrain.testing.layouts import assert_equal_to_reference
    assert_equal_to_reference(run(check_encoder, ('parallel.tp=2',)))


def test_the_encoder_trains_under_fsdp_equal_to_one_process():
    from nxpretrain.testing.layouts import assert_equal_to_reference
    assert_equal_to_reference(run(check_encoder, ('parallel.fsdp=true',)))


def test_the_encoder_round_trips_through_transformers():
    "Its weights written under BertForMaskedLM's names load into transformers and give the same logits; and back."
    import transformers as T
    from nxpretrain.models.registry import build_model
    from nxpretrain.models.hf_mapping import to_hf_config, to_hf_state_dict, from_hf_state_dict, randomize_
    cfg = dataclasses.replace(get_recipe('bert_tiny', 'model.arch=encoder_mlm').model, vocab_size=1000, norm_eps=1e-12)
    ours = build_model(cfg).eval()
    hf = T.BertForMaskedLM(to_hf_config(cfg)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(cfg, ours.state_dict()), strict=False)
    assert not unexpected and all('position_ids' in k for k in missing), (missing, unexpected)
    tokens = torch.randint(0, 1000, (2, 48), generator=torch.Generator().manual_seed(0))
    types = torch.cat([torch.zeros(2, 24), torch.ones(2, 24)], 1).long()
    mask = torch.ones(2, 48).long()
    mask[1, 40:] = 0
    with torch.no_grad():
        theirs = hf(input_ids=tokens, token_type_ids=types, attention_mask=mask).logits
        mine = ours(tokens, types, mask)[..., :1000]
    real = mask.bool()
    assert torch.allclose(mine[real], theirs[real], atol=1e-5), (mine[real] - theirs[real]).abs().max()
    randomize_(hf)
    back = build_model(cfg).eval()
    back.load_state_dict(from_hf_state_dict(cfg, hf.state_dict()))
    with torch.no_grad():
        assert torch.allclose(back(tokens, types, mask)[..., :1000][real],
                              hf(input_ids=tokens, token_type_ids=types, attention_mask=mask).logits[real], atol=1e-5)
