"""Seed 4 from a local Hub (`HF_ENDPOINT` pointed at a server this test starts): a gated Llama 3 repository with its
tokenizer and safetensors weights, and a jsonl dataset, downloaded through huggingface_hub and datasets; the weights
imported, continual pretraining for two steps under TP2 (gloo), the result exported and read back by transformers. A
gated model without a token, or with a token that has no access, fails in one line; the token appears in no output,
log, file or executed notebook."""
import json, os, re, secrets
from pathlib import Path
import pytest
import torch
from nxpretrain.data.corpus import DataError, demo_documents
from nxpretrain.data.hub import download_tokenizer, download_weights, download_dataset
from nxpretrain.data.hub_server import HubServer
from nxpretrain.recipes import get_recipe
from nxpretrain.config import override
from train_helpers import dist_train

pytest.importorskip('huggingface_hub')
pytest.importorskip('datasets')
ROOT = Path(__file__).resolve().parents[1]
MODEL, DATA = 'meta-llama/Llama-3.1-tiny', 'wikicorpus/raw_en'
V = 512


@pytest.fixture(scope='module')
def token():
    return 'hf_' + secrets.token_hex(16)


@pytest.fixture(scope='module')
def hub(tmp_path_factory, token):
    import transformers as T
    from nxpretrain.data.tokenizers import train_bpe
    root = tmp_path_factory.mktemp('hub')
    docs = demo_documents()[:300]
    model = root / 'models' / MODEL
    cfg = T.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=8,
                        num_key_value_heads=2, max_position_embeddings=64, rope_theta=500000.0,
                        tie_word_embeddings=False)
    torch.manual_seed(0)
    T.LlamaForCausalLM(cfg).save_pretrained(model, safe_serialization=True)
    train_bpe(docs, V).tok.save(str(model / 'tokenizer.json'))
    (model / 'pytorch_model.bin').write_bytes(b'pickle is never fetched')
    data = root / 'datasets' / DATA / 'data'
    data.mkdir(parents=True)
    (data / 'train.jsonl').write_text(''.join(json.dumps({'text': d, 'id': i}) + '\n' for i, d in enumerate(docs)))
    (data / 'validation.jsonl').write_text(json.dumps({'text': 'held out', 'id': -1}) + '\n')
    with HubServer(root, gated={MODEL}, tokens={token}) as server:
        yield server


def test_gated_model_without_or_with_a_wrong_token_is_one_line(tmp_path, hub, monkeypatch):
    monkeypatch.setenv('HF_ENDPOINT', hub.url)
    monkeypatch.delenv('HF_TOKEN', raising=False)
    with pytest.raises(DataError) as e: download_weights(MODEL, tmp_path, token=False, progress=False)
    assert str(e.value) == (f"model {MODEL}: gated repository and no Hugging Face token was sent; accept its licence "
                            "on the Hub, then set HF_TOKEN (or run `hf auth login`)")
    with pytest.raises(DataError) as e: download_tokenizer(MODEL, tmp_path, token='hf_' + 'x' * 32, progress=False)
    assert (
        '\n' not in str(e.value)
        and 'the token has no access (HTTP 403)' in str(e.value)
        and 'hf_xxx' not in str(e.value)
    )
    with pytest.raises(DataError, match=r'^model org/none: no such repository on http://127.0.0.1'):
        download_weights('org/none', tmp_path, progress=False)
    assert not list(tmp_path.rglob('*.safetensors'))


def test_seed4_flow_from_the_local_hub(tmp_path, hub, token, monkeypatch, capfd):
    from transformers import LlamaForCausalLM
    from nxpretrain.data.prepare import prepare
    from nxpretrain.convert.convert import convert
    from nxpretrain.train.checkpoint import checkpoint_recipe
    from nxpretrain.train.checkpoint import load_weights
    from nxpretrain.models.registry import build_model
    from nxpretrain.models.args import padded_vocab
    monkeypatch.setenv('HF_ENDPOINT', hub.url)                        # read at call time: no endpoint argument below
    monkeypatch.setenv('HF_TOKEN', token)
    seen = len(hub.requests)
    tok = download_tokenizer(MODEL, tmp_path / 'hub')
    weights = download_weights(MODEL, tmp_path / 'hub')
    corpus = download_dataset(DATA, tmp_path / 'wikicorpus_raw_en.jsonl', root=tmp_path / 'hub')
    assert all(path.startswith(('/api/', '/meta-llama/', '/datasets/')) for _, path, _ in hub.requests[seen:])
    assert not (weights / 'pytorch_model.bin').exists() and (weights / 'model.safetensors').exists()
    assert len(corpus.read_text().splitlines()) == 300                  # the train split only
    prefix = prepare(str(corpus), str(tok), str(tmp_path / 'data'), workers=1, progress=False)[0]
    r = get_recipe('llama3_tiny', f'data.corpus={prefix}', f'data.tokenizer={tok}', f'model.vocab_size={V}',
                   'model.n_layers=2', 'model.hidden=64', 'model.n_heads=8', 'model.n_kv_heads=2',
                   'model.ffn_hidden=176', 'model.seq_len=32', 'data.micro_batch=2', 'data.global_batch=4',
                   'trainer.threads=1', 'trainer.eval_every=0', 'trainer.save_every=2', 'parallel.precision=fp32',
                   'optim.warmup_steps=1', 'model.norm_eps=1e-6')   # the Hub config's, as the import checks
    ck = convert(weights, 'native', tmp_path / 'imported', recipe=r)
    res = dist_train(override(r, 'parallel.tp=2'), tmp_path / 'run', 2, resume_from=str(ck), weights_only=True)
    assert len(res.losses) == 2 and res.losses[0] < 7.0             # the Hub weights, not a fresh model (ln 512 ≈ 6.24)
    out = convert(res.last_checkpoint, 'hf', tmp_path / 'export')
    hf = LlamaForCausalLM.from_pretrained(out).eval()
    rr = checkpoint_recipe(res.last_checkpoint)
    ours = build_model(rr.model, padded_vocab(rr.model, rr.parallel.tp))
    load_weights(ours, res.last_checkpoint)
    ours.eval()
    ids = torch.randint(V, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(): a, b = ours(ids)[..., :V], hf(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    # the token is nowhere: not in anything printed, nor in any file written (logs, recipes, caches, checkpoints)
    printed = capfd.readouterr()
    assert token not in printed.out + printed.err
    leaked = [p for p in tmp_path.rglob('*') if p.is_file() and token.encode() in p.read_bytes()]
    assert leaked == [], leaked


def test_command_line(tmp_path, hub, token):
    """`python -m nxpretrain.data.hub`: HF_ENDPOINT and HF_TOKEN from the environment; without a token one line and exit
    2."""
    import subprocess, sys
    env = {**os.environ, 'HF_ENDPOINT': hub.url, 'HF_TOKEN': token, 'PYTHONPATH': str(ROOT)}
    run = lambda env, root: subprocess.run(
        [sys.executable, '-m', 'nxpretrain.data.hub', 'tokenizer', MODEL, '--root', str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    ok = run(env, tmp_path / 'a')
    assert ok.returncode == 0 and ok.stdout.strip().endswith('tokenizer.json'), ok.stderr
    assert token not in ok.stdout + ok.stderr
    no = run(
        {k: v for k, v in env.items() if k != 'HF_TOKEN'}
        | {'HF_HUB_DISABLE_IMPLICIT_TOKEN': '1', 'HF_HOME': str(tmp_path / 'home')},
        tmp_path / 'b',
    )
    assert no.returncode == 2 and no.stderr.count('\n') == 1 and 'no Hugging Face token was sent' in no.stderr, (
        no.stderr
    )


def test_token_not_in_an_executed_notebook(tmp_path, token, monkeypatch):
    "The Hub notebook runs with a real token in HF_TOKEN; its saved outputs do not contain it."
    from fastcore.nbio import read_nb, write_nb
    from execnb.shell import CaptureShell
    monkeypatch.setenv('HF_TOKEN', token)
    monkeypatch.chdir(tmp_path)
    nb = read_nb(ROOT / 'nbs' / 'api' / '18_hub.ipynb')
    nb.cells = [c for c in nb.cells if '#| eval: false' not in c.source]  # as nbdev runs it: not the command-line entry
    CaptureShell().run_all(nb, exc_stop=True)
    write_nb(nb, tmp_path / 'executed.ipynb')
    text = (tmp_path / 'executed.ipynb').read_text()
    assert re.search(r'tokenizer\.json \d+ bytes', text)                 # it ran with the token and printed
    assert token not in text
