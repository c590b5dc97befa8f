"""Hand-off of a trained checkpoint, as a user does it: `nxpretrain evaluate` gives the trainer's own validation figure
on the same batches, and `nxpretrain export-hf` writes a folder that `transformers` alone turns into the same greedy
tokens (AutoTokenizer + AutoModelForCausalLM.generate)."""
import contextlib, io, json, os, re
from pathlib import Path
import pytest
from nxpretrain.cli import main

pytestmark = pytest.mark.timeout(600)


def ok(*argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out): assert (main(list(argv)) or 0) == 0
    return out.getvalue()


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    "gpt3_tiny after 4 steps, validated (2 batches) and saved at step 4."
    root = tmp_path_factory.mktemp('handoff')
    old = os.getcwd()
    os.chdir(root)
    try:
        ok('train', 'gpt3_tiny', '--max-steps', '4', 'trainer.eval_every=4', 'trainer.eval_steps=2',
           'trainer.save_every=4', '--out', 'out')
    finally: os.chdir(old)
    return root / 'out/gpt3_tiny/checkpoints/step_4'


def test_evaluate_equals_the_trainers_validation(checkpoint):
    ev = json.loads(ok('evaluate', str(checkpoint), '--json'))
    seen = ev['trainer']
    assert (ev['batches'], seen['batches'], seen['step']) == (2, 2, 4)            # the trainer's eval_steps by default
    assert abs(ev['loss'] - seen['loss']) < 1e-4 and abs(ev['perplexity'] / seen['perplexity'] - 1) < 1e-3, ev
    assert ev['tokens'] == 2 * 8 * 128
    table = ok('evaluate', str(checkpoint))
    assert re.search(r'^batches\s+2 validation batches \(16 sequences, 2,048 tokens\)$', table, re.M), table
    assert re.search(r"^trainer's\s+loss [\d.]+, perplexity [\d.]+ at step 4 \(same batches\)$", table, re.M), table
    other = json.loads(ok('evaluate', str(checkpoint), '--json', '--steps', '3'))
    assert other['batches'] == 3 and other['loss'] != ev['loss']


def test_export_generates_the_same_greedy_tokens_through_transformers(checkpoint, tmp_path):
    T = pytest.importorskip('transformers')
    import torch
    prompt, n = 'def add(a, b):\n    return', 24
    ours = json.loads(ok('evaluate', str(checkpoint), '--json', '--steps', '1', '--greedy', '--prompt', prompt,
                         '--max-new-tokens', str(n)))
    out = tmp_path / 'hf'
    old = os.getcwd()
    os.chdir(tmp_path)  # never looked for here: the demo tokenizer is in runs/data of the project holding the run
    try: ok('export-hf', str(checkpoint), str(out))
    finally: os.chdir(old)
    assert {'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'generation_config.json'} <= {
        p.name for p in out.iterdir()
    }
    tok = T.AutoTokenizer.from_pretrained(out)
    model = T.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = tok(prompt, return_tensors='pt')['input_ids']
    with torch.no_grad(): got = model.generate(ids, max_new_tokens=n, do_sample=False)[0].tolist()
    want = ours['sample_tokens']
    assert len(got) > ids.shape[1] and got == want[:len(got)], (got, want)  # generate stops early only at <|endoftext|>
    assert len(got) == len(want) or got[-1] == tok.eos_token_id
    assert tok.decode(got) == ours['sample'][:len(tok.decode(got))]
