"""Seed 3 end to end against a local S3 server: raw text → BERT shards in the seed's HDF5 layout (read back key for key
with h5py), packed in a tar under the seed's bucket key, fetched anonymously (`--no-sign-request`), extracted safely,
and bert_tiny trains on the shards."""
import math, os, tarfile
from pathlib import Path
import numpy as np
import pytest
from nxpretrain.data import s3
from nxpretrain.data.archive import fetch_bert_hdf5, BERT_HDF5_TARS
from nxpretrain.data.bert_corpus import SEED3_LAYOUT, write_bert_corpus, train_wordpiece, split_sentences
from nxpretrain.data.bert_blocks import BertHDF5Dataset, HDF5_KEYS
from nxpretrain.data.corpus import DataError, demo_documents
from nxpretrain.recipes import get_recipe
from nxpretrain.train.trainer import train
from s3_helpers import s3_server, make_public

h5py = pytest.importorskip('h5py')
pytest.importorskip('moto')
SEQ, PRED = 128, 20


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp('bert')
    docs = demo_documents()[:120]
    vocab = train_wordpiece(docs, d / 'vocab', 1500)
    folder = d / 'bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128'
    shards = write_bert_corpus(docs, vocab, folder, seq_len=SEQ, max_predictions=PRED, dupe_factor=2, per_shard=800,
                               progress=False)
    return d, vocab, shards


def test_shards_have_the_seed_layout_key_for_key(corpus):
    _, vocab, shards = corpus
    words = Path(vocab).read_text().splitlines()
    mask_id, cls_id, sep_id = words.index('[MASK]'), words.index('[CLS]'), words.index('[SEP]')
    assert len(shards) >= 2
    total_masked, as_mask = 0, 0
    for p in shards:
        with h5py.File(p, 'r') as f:
            assert tuple(sorted(f)) == tuple(sorted(HDF5_KEYS))
            n = f['input_ids'].shape[0]
            for key, (dtype, shape) in SEED3_LAYOUT.items():
                assert str(f[key].dtype) == dtype and f[key].shape == (n, *shape(SEQ, PRED)), key
                assert f[key].compression == 'gzip' and f[key].fletcher32
            ids, mask, seg = f['input_ids'][:], f['input_mask'][:], f['segment_ids'][:]
            pos, lab, nsp = f['masked_lm_positions'][:], f['masked_lm_ids'][:], f['next_sentence_labels'][:]
        lengths = mask.sum(1)
        assert (ids[:, 0] == cls_id).all() and (ids[np.arange(n), lengths - 1] == sep_id).all()
        assert ((ids != 0) == (mask == 1)).all() and (seg <= mask).all()           # padding is id 0, mask 0, segment 0
        assert set(np.unique(nsp)) == {0, 1}
        for k in range(n):
            used = pos[k][pos[k] > 0]
            assert 1 <= len(used) <= PRED and (np.diff(used) > 0).all() and (used < lengths[k]).all()
            assert len(used) <= max(1, round(lengths[k] * 0.15))
            total_masked += len(used)
            as_mask += int((ids[k, used] == mask_id).sum())
            assert (lab[k, :len(used)] != mask_id).all()
    assert 0.7 < as_mask / total_masked < 0.9                                       # 80 % become [MASK]
    item = BertHDF5Dataset(shards[-1])[0]                                         # the trainer's reader takes it
    assert int((item['labels'] != -100).sum()) == int((pos[0] > 0).sum())


def test_whole_words_are_masked_together(corpus):
    _, vocab, shards = corpus
    words = Path(vocab).read_text().splitlines()
    with h5py.File(shards[0], 'r') as f:
        ids, pos, lab = f['input_ids'][:], f['masked_lm_positions'][:], f['masked_lm_ids'][:]
    checked = 0
    for k in range(len(ids)):
        original = ids[k].copy()
        used = pos[k][pos[k] > 0]
        original[used] = lab[k, :len(used)]
        pieces = [words[i] for i in original]
        chosen = set(used.tolist())
        for i in range(1, len(pieces)):
            if pieces[i].startswith('##'):               # a word piece is predicted exactly when the piece before it is
                # as in BERT, across a [SEP]
                before = max((j for j in range(i) if pieces[j] not in ('[CLS]', '[SEP]')), default=None)
                if before is None: continue                  # a piece right after [CLS] starts its word
                assert (i in chosen) == (before in chosen), (k, i, pieces[before:i + 1])
                checked += 1
    assert checked > 100


def test_seed3_flow_from_s3(tmp_path, corpus, monkeypatch):
    "As the seed: copy the tar with --no-sign-request, extract, delete the tar; then the recipe names the data."
    import subprocess, sys
    d, _, shards = corpus
    url = BERT_HDF5_TARS['bert_wikicorpus_hdf5_128']
    bucket, key = s3.split_url(url)
    tar = tmp_path / Path(key).name
    with tarfile.open(tar, 'w') as t: t.add(shards[0].parent, arcname=shards[0].parent.name)
    monkeypatch.chdir(tmp_path)                                       # the trainer reads runs/data, as on a cluster
    vocab_size = len((d / 'vocab' / 'vocab.txt').read_text().splitlines())
    r = get_recipe('bert_tiny', 'data.corpus=bert_wikicorpus_hdf5_128', f'model.vocab_size={vocab_size}',
                   'model.hidden=64', 'model.n_heads=2', 'data.micro_batch=4', 'data.global_batch=4',
                   'trainer.threads=1', 'trainer.eval_every=3', 'trainer.eval_steps=1', 'trainer.save_every=0',
                   'optim.warmup_steps=1', 'data.split=90,10,0')
    with pytest.raises(
        DataError,
        match=r'^data.corpus=bert_wikicorpus_hdf5_128: not fetched under runs/data; '
              r'run: python -m nxpretrain.data.archive',
    ):
        train(r, str(tmp_path / 'early'), 1, progress=False)
    with s3_server() as endpoint:
        c = s3.s3_client(endpoint_url=endpoint)
        c.create_bucket(Bucket=bucket)
        make_public(c, bucket)
        s3.upload(tar, url, endpoint_url=endpoint, progress=False)
        p = subprocess.run(
            [sys.executable, '-m', 'nxpretrain.data.archive', 'bert_wikicorpus_hdf5_128', '--root', 'runs/data',
             '--endpoint-url', endpoint],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, 'PYTHONPATH': str(Path(__file__).resolve().parents[1])},
        )
        assert p.returncode == 0, p.stderr
    folder = Path(p.stdout.strip().splitlines()[-1])
    assert sorted(q.name for q in folder.glob('*.hdf5')) == sorted(q.name for q in shards)
    assert all((folder / q.name).read_bytes() == q.read_bytes() for q in shards)
    assert not (tmp_path / 'runs' / 'data' / 'bert_hdf5' / tar.name).exists()     # the tar is deleted, as the seed does
    # fetched once: no download
    assert fetch_bert_hdf5('bert_wikicorpus_hdf5_128', 'runs/data', progress=False) == folder
    res = train(r, str(tmp_path / 'run'), 3, progress=False)
    assert len(res.losses) == 3 and all(math.isfinite(x) for x in res.losses)
    assert abs(res.losses[0] - (math.log(vocab_size) + math.log(2))) < 1.5        # MLM over the vocabulary + NSP over 2
    assert 0.0 <= res.eval['nsp_accuracy'] <= 1.0 and math.isfinite(res.eval['loss'])
