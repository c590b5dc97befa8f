"""Bad input end to end: a huge document, a killed run, bad lines in parallel workers, files that are not what they
claim."""
import os, signal, subprocess, sys, time
from pathlib import Path
import numpy as np
import pytest

from nxpretrain.data.corpus import DataError, demo_documents, write_jsonl
from nxpretrain.data.indexed import IndexedDataset
from nxpretrain.data.prepare import tokenize_files, encode_documents, prepare
from nxpretrain.data.tokenizers import get_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
    d = tmp_path_factory.mktemp('tok')
    get_tokenizer('demo', d)
    return d


def test_huge_document_is_encoded_in_pieces_with_the_same_ids(tmp_path, cache):
    """One 3 MB document (the 200 MB case scaled to this machine): cut into 1 MB pieces, ids equal the whole encode."""
    tok = get_tokenizer('demo', cache)
    text = '\n\n'.join(demo_documents())
    text = (text * (3_000_000 // len(text) + 1))[:3_000_000]
    flat, lengths = encode_documents(tok, [text, 'short'])
    whole = tok.encode(text)
    assert lengths.tolist() == [len(whole) + 1, len(tok.encode('short')) + 1]
    assert flat[:len(whole)].tolist() == whole


def test_bad_lines_counted_across_workers_and_strict(tmp_path, cache):
    docs = demo_documents()[:2000]
    p = tmp_path / 'in.jsonl'
    with open(p, 'wb') as f:
        for i, d in enumerate(write_jsonl(docs, tmp_path / 'ok.jsonl').read_bytes().splitlines(keepends=True)):
            f.write(d)
            if i % 500 == 7: f.write(b'{"text": "broken \xc3\x28"}\n{"text": \n{"title": "x"}\n\n')
    st = tokenize_files([p], tmp_path / 'o', 'demo', workers=2, cache_dir=str(cache), progress=False)
    assert (st['documents'], st['bad']) == (2000, 12)
    ref = tokenize_files([tmp_path / 'ok.jsonl'], tmp_path / 'r', 'demo', workers=1, cache_dir=str(cache),
                         progress=False)
    assert (tmp_path / 'o.bin').read_bytes() == (tmp_path / 'r.bin').read_bytes()
    assert ref['tokens'] == st['tokens']
    with pytest.raises(DataError, match=r'in.jsonl:byte \d+: invalid UTF-8 .*strict mode'):
        tokenize_files([p], tmp_path / 's', 'demo', workers=2, cache_dir=str(cache), strict=True, progress=False)
    assert not (tmp_path / 's.idx').exists() and not list(tmp_path.glob('s.part*'))


def test_killed_run_leaves_no_complete_looking_output_and_resumes(tmp_path, cache):
    (tmp_path / 'data' / 'demo').mkdir(parents=True)
    os.symlink(cache / 'demo' / 'tokenizer.json', tmp_path / 'data' / 'demo' / 'tokenizer.json')
    src = write_jsonl(demo_documents() * 6, tmp_path / 'big.jsonl')
    cmd = [sys.executable, '-m', 'nxpretrain.data.prepare', str(src), '--tokenizer', 'demo', '--output',
           str(tmp_path / 'data'), '--workers', '2', '--no-progress']
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    p = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out_dir = tmp_path / 'data' / 'big'
    t0 = time.time()
    while time.time() - t0 < 120 and not list(out_dir.rglob('*.part*')): time.sleep(0.05)   # tokenizing has started
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert not list(out_dir.rglob('big_text_document.idx')) and not list(out_dir.rglob('big_text_document.bin'))
    assert not (out_dir / 'manifest.d').exists() or not list((out_dir / 'manifest.d').glob('tokenize*'))
    prefix, = prepare(str(src), 'demo', str(tmp_path / 'data'), workers=2, progress=False)   # run again: completes
    flat, _ = encode_documents(get_tokenizer('demo', cache), demo_documents() * 6)
    assert np.array_equal(np.asarray(IndexedDataset(prefix).bin), flat)
    assert not list(out_dir.rglob('*.part*'))


def test_files_that_are_not_what_they_claim(tmp_path):
    (tmp_path / 'x.bin').write_bytes(b'\0' * 10)
    (tmp_path / 'x.idx').write_bytes(b'MMIDIDX\0')  # fairseq/garbage/short
    with pytest.raises(DataError, match=r'x.idx: not a Megatron MMIDIDX index'):
        IndexedDataset(tmp_path / 'x')
    with pytest.raises(DataError, match=r'y.idx: missing'):
        IndexedDataset(tmp_path / 'y')
    with pytest.raises(DataError, match='nope.jsonl: input file missing'):
        tokenize_files([tmp_path / 'nope.jsonl'], tmp_path / 'o', progress=False)
