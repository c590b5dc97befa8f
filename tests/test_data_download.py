"""Downloads against real local HTTP servers, and every corpus recipe end to end on a served fixture."""
import hashlib, json, os, subprocess, sys
from dataclasses import asdict
from pathlib import Path
import numpy as np
import pytest
import zstandard

from nxpretrain.data.corpus import DataError, write_jsonl, demo_documents
from nxpretrain.data.download import fetch_file, serve_directory
from nxpretrain.data.indexed import IndexedDataset
from nxpretrain.data.prepare import CORPORA, CorpusRecipe, prepare, read_manifest, ensure_dataset, encode_documents
from nxpretrain.data.tokenizers import get_tokenizer
from nxpretrain.config import DataConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def blob(tmp_path):
    b = os.urandom(1_000_000)
    (tmp_path / 'srv').mkdir()
    (tmp_path / 'srv' / 'f.bin').write_bytes(b)
    return b


@pytest.mark.parametrize('honour_range', [True, False])
def test_resume_after_dropped_connection(tmp_path, blob, honour_range):
    srv, base = serve_directory(tmp_path / 'srv', drop_after=400_000, honour_range=honour_range)
    try:
        p = fetch_file(base + 'f.bin', tmp_path / 'out' / 'f.bin', hashlib.sha256(blob).hexdigest(), progress=False)
    finally: srv.shutdown()
    assert p.read_bytes() == blob
    assert srv.requests[1] == ('/f.bin', 'bytes=400000-')      # the second request asked for the rest
    assert not (tmp_path / 'out' / 'f.bin.part').exists()


def test_resume_across_runs_from_part_file(tmp_path, blob):
    (tmp_path / 'out').mkdir()
    (tmp_path / 'out' / 'f.bin.part').write_bytes(blob[:123_456])  # an earlier run died
    srv, base = serve_directory(tmp_path / 'srv')
    try: p = fetch_file(base + 'f.bin', tmp_path / 'out' / 'f.bin', hashlib.sha256(blob).hexdigest(), progress=False)
    finally: srv.shutdown()
    assert p.read_bytes() == blob and srv.requests == [('/f.bin', 'bytes=123456-')]


def test_wrong_checksum_is_an_error_and_no_final_file(tmp_path, blob):
    srv, base = serve_directory(tmp_path / 'srv')
    try:
        with pytest.raises(DataError, match=r'f.bin: SHA-256 [0-9a-f]+ ≠ expected 00ff'):
            fetch_file(base + 'f.bin', tmp_path / 'out' / 'f.bin', '00ff', progress=False)
        with pytest.raises(DataError, match='missing.bin: HTTP 404'):
            fetch_file(base + 'missing.bin', tmp_path / 'out' / 'm.bin', progress=False)
    finally: srv.shutdown()
    assert not (tmp_path / 'out' / 'f.bin').exists() and (tmp_path / 'out' / 'f.bin.part.bad').exists()


def test_server_gone_names_url_and_part_file(tmp_path):
    with pytest.raises(DataError, match=r'download failed after 2 attempts .*run again to resume'):
        fetch_file('http://127.0.0.1:9/x.jsonl', tmp_path / 'x.jsonl', retries=1, timeout=2, progress=False)


def _zst(path, texts, meta=None):
    lines = [json.dumps({'text': t, **({'meta': {'redpajama_set_name': meta[i % len(meta)]}} if meta else {})}) for i,
             t in enumerate(texts)]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(zstandard.ZstdCompressor().compress(('\n'.join(lines) + '\n').encode()))


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
    d = tmp_path_factory.mktemp('tok')
    get_tokenizer('demo', d)
    return d


def _link_cache(cache, out):
    (out / 'demo').mkdir(parents=True, exist_ok=True)
    if not (out / 'demo' / 'tokenizer.json').exists():
        os.symlink(cache / 'demo' / 'tokenizer.json', out / 'demo' / 'tokenizer.json')


def test_pile_recipe_on_served_fixture_equals_direct_tokenization(tmp_path, cache):
    docs = demo_documents()[:600]
    for i, f in enumerate(CORPORA['pile'].files): _zst(tmp_path / 'srv' / f, docs[i * 20:(i + 1) * 20])
    out = tmp_path / 'data'
    _link_cache(cache, out)
    srv, base = serve_directory(tmp_path / 'srv')
    try: prefix, = prepare('pile', 'demo', str(out), workers=2, base_url=base, progress=False)
    finally: srv.shutdown()
    ds = IndexedDataset(prefix)
    tok = get_tokenizer('demo', out)
    flat, lengths = encode_documents(tok, docs)
    assert ds.num_tokens == len(flat) and np.array_equal(np.asarray(ds.bin), flat)
    m = read_manifest(out / 'pile')
    assert sum(k.startswith('download/') for k in m) == 30 and sum(k.startswith('tokenize-demo/') for k in m) == 30
    assert ensure_dataset(DataConfig(corpus='pile', tokenizer='demo'), str(out)) == prefix


def test_slimpajama_recipe_extract_filter_chunks(tmp_path, cache):
    docs = demo_documents()[:240]
    sets = ['RedPajamaC4', 'RedPajamaGithub', 'RedPajamaBook']
    files = [f'chunk1/example_train_{i}.jsonl.zst' for i in range(6)]
    for i, f in enumerate(files): _zst(tmp_path / 'srv' / f, docs[i * 40:(i + 1) * 40], sets)
    recipe = CorpusRecipe(
        **{**asdict(CORPORA['slimpajama']), 'files': files, 'chunks': 3, 'sets': ('RedPajamaC4', 'RedPajamaBook')}
    )
    out = tmp_path / 'data'
    _link_cache(cache, out)
    srv, base = serve_directory(tmp_path / 'srv')
    recipe.base_url = base
    try: prefixes = prepare(recipe, 'demo', str(out), workers=1, merge=False, progress=False)
    finally: srv.shutdown()
    assert len(prefixes) == 3
    kept = [d for i, f in enumerate(files) for j,
            d in enumerate(docs[i * 40 : (i + 1) * 40]) if sets[j % 3] != 'RedPajamaGithub']
    assert sum(IndexedDataset(p).num_documents for p in prefixes) == len(kept)
    assert (out / 'slimpajama' / 'raw' / 'chunk1' / 'example_train_0.jsonl').exists()   # extracted
    # a second run does nothing: every unit is in the manifest
    before = {p: os.path.getmtime(p + '.bin') for p in prefixes}
    assert prepare(recipe, 'demo', str(out), merge=False, progress=False) == prefixes
    assert before == {p: os.path.getmtime(p + '.bin') for p in prefixes}


def test_wikipedia_prepared_pair_download(tmp_path, cache):
    out = tmp_path / 'data'
    _link_cache(cache, out)
    src = prepare('demo', 'demo', str(out))[0]
    (tmp_path / 'srv').mkdir()
    for s in ('.bin', '.idx'): os.symlink(src + s, tmp_path / 'srv' / f'my-gpt2_text_document{s}')
    srv, base = serve_directory(tmp_path / 'srv')
    try: prefix, = prepare('wikipedia', None, str(out), base_url=base, progress=False)
    finally: srv.shutdown()
    assert IndexedDataset(prefix).num_tokens == IndexedDataset(src).num_tokens
    assert ensure_dataset(DataConfig(corpus='wikipedia', tokenizer='gpt2'), str(out)) == prefix


def test_slurm_array_worker_processes(tmp_path, cache):
    """Three array tasks (2 steps each) split the Pile recipe's units; ensure_dataset merges. Same bytes as one
    process."""
    docs = demo_documents()[:300]
    for i, f in enumerate(CORPORA['pile'].files): _zst(tmp_path / 'srv' / f, docs[i * 10:(i + 1) * 10])
    out = tmp_path / 'data'
    _link_cache(cache, out)
    srv, base = serve_directory(tmp_path / 'srv')
    try:
        env = {**os.environ, 'PYTHONPATH': str(ROOT), 'SLURM_ARRAY_TASK_COUNT': '3', 'SLURM_ARRAY_TASK_MIN': '0',
               'SLURM_STEP_NUM_TASKS': '2'}
        procs = [
            subprocess.Popen(
                [sys.executable, '-m', 'nxpretrain.data.prepare', 'pile', '--tokenizer', 'demo', '--output', str(out),
                 '--workers', '1', '--base-url', base, '--no-progress'],
                env={**env, 'SLURM_ARRAY_TASK_ID': str(t), 'RANK': str(r)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for t in range(3)
            for r in range(2)
        ]
        outs = [p.communicate(timeout=300) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    finally: srv.shutdown()
    m = read_manifest(out / 'pile')
    done = sorted(k for k in m if k.startswith('tokenize-demo/'))
    assert len(done) == 30
    assert len(outs[0][0].decode().split()) == 5      # worker 0 of 6 did units 0, 6, 12, 18, 24
    prefix = ensure_dataset(DataConfig(corpus='pile', tokenizer='demo'), str(out))   # merges the array's 30 shards
    flat, _ = encode_documents(get_tokenizer('demo', out), docs)
    assert np.array_equal(np.asarray(IndexedDataset(prefix).bin), flat)


def test_wikicorpus_llama3_recipe_to_blocks(tmp_path, cache):
    """Seed 4: wikicorpus JSONL (served here instead of HF datasets) + a Llama-3-style tokenizer.json → 8192-token-style
    blocks."""
    from tokenizers import processors
    from nxpretrain.data.bert_blocks import BlockDataset
    docs = demo_documents()[:500]
    write_jsonl(docs, tmp_path / 'srv' / 'wikicorpus_raw_en.jsonl')
    from nxpretrain.data.tokenizers import train_bpe
    t = train_bpe(docs, 2000, eod='<|end_of_text|>')            # Llama 3's EOD name, and a BOS post-processor
    (tmp_path / 'data' / 'llama3').mkdir(parents=True)
    t.tok.add_special_tokens(['<|begin_of_text|>'])
    t.tok.post_processor = processors.TemplateProcessing(
        single='<|begin_of_text|> $A', special_tokens=[('<|begin_of_text|>', t.tok.token_to_id('<|begin_of_text|>'))]
    )
    t.tok.save(str(tmp_path / 'data' / 'llama3' / 'tokenizer.json'))
    srv, base = serve_directory(tmp_path / 'srv')
    try: prefix, = prepare('wikicorpus-llama3', None, str(tmp_path / 'data'), workers=2, base_url=base, progress=False)
    finally: srv.shutdown()
    llama = get_tokenizer('llama3', tmp_path / 'data')
    assert llama.eod_id == t.tok.token_to_id('<|end_of_text|>')
    flat, _ = encode_documents(llama, docs)
    blocks = BlockDataset(prefix, 512)
    assert len(blocks) == len(flat) // 512
    assert blocks[3]['input_ids'].tolist() == flat[3 * 512:4 * 512].tolist()
    assert ensure_dataset(DataConfig(corpus='wikicorpus-llama3', tokenizer='llama3'), str(tmp_path / 'data')) == prefix
