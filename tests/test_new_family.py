"""A model family defined here, in the test file alone, with no package file changed: it registers itself, plans, trains
under TP2 and PP2 on real gloo processes (equal to its one-process model) and checkpoints, then resumes."""
import torch, torch.nn as nn
from nxpretrain.families import ModelFamily, register_family
from nxpretrain.models.blocks import Attention, SwiGLU, RMSNorm, TransformerBlock, LanguageModel
from nxpretrain.models.config import padded_vocab
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
    name='swigpt', model=SwiGPT, objective='causal_lm', layouts=('tp', 'sp', 'pp', 'fsdp', 'zero1'),
    tp_plan={'attention.wq': 'colwise', 'attention.wk': 'colwise', 'attention.wv': 'colwise', 'attention.wo': 'rowwise',
             'mlp.w1': 'colwise', 'mlp.w3': 'colwise', 'mlp.w2': 'rowwise'},
    tiny=('gpt3_tiny', ('model.arch=swigpt',))))


# Functions of this file run on every rank: a rank process imports this file to find them, and so registers the family.
def check_swigpt(overrides):
    from nxpretrain.parallel.check import check_layout
    return check_layout('swigpt', overrides, 2)

def train_swigpt(recipe, out, steps):
    from nxpretrain.train.trainer import train
    return train(recipe, out, steps, progress=False)

def run(fn, *args):
    from nxpretrain.parallel.spawn import run_distributed
    return run_distributed(fn, 2, *args, timeout=300)

def equal_layout(*overrides):
    from nxpretrain.parallel.check import assert_equal_to_reference
    return assert_equal_to_reference(run(check_swigpt, overrides))


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
