"""Hostile text through the data stage: lines that are not encodable text, and multi-megabyte documents with few or no
places to cut – every document equal to the reference tokenizer on its whole text, read back by megatron-core."""
import os, subprocess, sys, time
from pathlib import Path
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from data_helpers import build_tokenizers, reference_encoder, big_document, cjk_text, write_lines
from nxpretrain.data.prepare import prepare, read_manifest

ROOT = Path(__file__).resolve().parents[1]
SLOW = bool(os.environ.get('NXP_SLOW'))
slow = pytest.mark.skipif(not SLOW, reason='slow set: run with NXP_SLOW=1')


@pytest.fixture(scope='module')
def toks(tmp_path_factory):
    return build_tokenizers(tmp_path_factory.mktemp('toks'))


def megatron_sequences(prefix: str) -> tuple[list, np.ndarray]:
    "Every sequence and the document index, read by megatron-core (copied: its arrays die with the reader)."
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    m = IndexedDataset(prefix)
    seqs = [np.array(m[i], np.int64) for i in range(len(m))]
    docs = np.array(m.document_indices)
    del m
    return seqs, docs


def assert_equal_whole(prefix: str, texts: list, spec: str):
    "Every document in the dataset is the reference tokenizer's ids of its whole text + EOD (none when it has no ids)."
    ref, eod = reference_encoder(spec)
    want = [np.array(ids + [eod] if ids else [], np.int64) for ids in map(ref, texts)]
    seqs, docs = megatron_sequences(prefix)
    assert len(seqs) == sum(w.size > 0 for w in want)
    np.testing.assert_array_equal(docs, np.concatenate([[0], np.cumsum([w.size > 0 for w in want])]))
    for k, (got, w) in enumerate(zip(seqs, (w for w in want if w.size))):
        if not np.array_equal(got, w):
            n = min(len(got), len(w))
            first = int(np.flatnonzero(got[:n] != w[:n])[0]) if (got[:n] != w[:n]).any() else n
            raise AssertionError(f'sequence {k}: {len(got)} tokens, the reference {len(w)}; first difference at token '
                                 f'{first}')


def _cli(*args, cwd):
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    cli = 'import sys; from nxpretrain.cli import main; sys.exit(main())'   # what the `nxpretrain` script runs
    return subprocess.run([sys.executable, '-c', cli, 'data', *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_surrogate_line_is_a_bad_line_via_the_cli(tmp_path, toks):
    """The issue's corpus: the middle line has a lone surrogate. The CLI skips and reports it, writes the others."""
    src = tmp_path / 'c.jsonl'
    src.write_bytes(b'{"text": "good one"}\n{"text": "bad \\ud800 surrogate"}\n{"text": "good two"}\n')
    r = _cli(src, '--tokenizer', Path(toks['gpt2'][5:]).parent / 'tok.json', '--output', 'out', '--workers', '1',
             '--no-progress', cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f'{src}:byte 21: "text" is not encodable text: lone surrogate U+D800 at character 4' in r.stderr
    prefix = str(tmp_path / r.stdout.strip())   # relative to the output directory given
    assert_equal_whole(prefix, ['good one', 'good two'], str(Path(toks['gpt2'][5:]).parent / 'tok.json'))
    rec, = read_manifest(tmp_path / 'out' / 'c').values()
    assert (rec['documents'], rec['bad'], rec['blank']) == (2, 1, 0)
    assert (tmp_path / rec['bad_report']).read_text().splitlines() == [
        f'{src}:byte 21: "text" is not encodable text: lone surrogate U+D800 at character 4 (an unpaired \\u escape)']


def test_surrogate_line_strict_is_one_line_error(tmp_path, toks):
    src = tmp_path / 'c.jsonl'
    src.write_bytes(b'{"text": "good one"}\n{"text": "bad \\ud800 surrogate"}\n{"text": "good two"}\n')
    r = _cli(src, '--tokenizer', Path(toks['gpt2'][5:]).parent / 'tok.json', '--output', 'out', '--workers', '2',
             '--strict', '--no-progress', cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f'nxpretrain data: {src}:byte 21: "text" is not encodable text: lone surrogate U+D800 at character 4 (an '
        'unpaired \\u escape) (strict mode; fix the line or run without strict to skip bad lines)']
    assert not list((tmp_path / 'out').rglob('*.idx'))


def test_long_cjk_document_equals_whole_text(tmp_path, toks):
    """The issue's second reproduction: 1.1M characters of Chinese with no space, through `nxpretrain data`, equal to HF
    tokenizers on the whole text (a cut at 2**20 characters changed the ids from token ~1,018,000 on)."""
    doc = cjk_text(1_100_000)
    src = write_lines(tmp_path / 'cjk.jsonl', ['before', doc, 'after'])
    prefix, = prepare(str(src), toks['gpt2'], str(tmp_path / 'out'), workers=1, progress=False)
    assert_equal_whole(prefix, ['before', doc, 'after'], toks['gpt2'])


def _big(tmp_path, toks, tokenizer, script, n_bytes):
    doc = big_document(script, n_bytes, seed=n_bytes)
    src = write_lines(tmp_path / f'{script}.jsonl', ['head', doc, 'tail'])
    t0 = time.time()
    prefix, = prepare(str(src), toks[tokenizer], str(tmp_path / 'out'), workers=1, progress=False)
    seconds = time.time() - t0
    assert_equal_whole(prefix, ['head', doc, 'tail'], toks[tokenizer])
    print(f'{tokenizer} {script} {n_bytes / 1e6:.1f} MB: {seconds:.1f} s')


SCRIPTS = ['cjk', 'base64', 'repeated', 'newlines']


@pytest.mark.parametrize('script', SCRIPTS[1:])   # Chinese: test_long_cjk_document_equals_whole_text
def test_big_documents_equal_whole_text(tmp_path, toks, script):
    """About 1.2 M characters (past the 2**20-character piece size) in each script, GPT-2 BPE."""
    _big(tmp_path, toks, 'gpt2', script, 1_200_000)


@slow
@pytest.mark.parametrize('tokenizer', ['gpt2', 'sentencepiece', 'wordpiece'])
@pytest.mark.parametrize('script', SCRIPTS)
@pytest.mark.parametrize('n_bytes', [1_000_000, 20_000_000])
def test_big_documents_equal_whole_text_slow(tmp_path, toks, tokenizer, script, n_bytes):
    """1 MB and 20 MB documents in each script, for each tokenizer."""
    _big(tmp_path, toks, tokenizer, script, n_bytes)
