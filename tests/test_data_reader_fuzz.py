"""Fuzzing the readers: truncated or bit-flipped .bin/.idx pairs and BERT HDF5 shards give one clear DataError, never a
crash or wrong tokens – except where the format cannot tell (a .bin without our checksum sidecar), which is pinned here.
The fast set runs in the normal pytest run; NXP_SLOW=1 runs more cases."""
import os, tempfile
from pathlib import Path
import numpy as np
import pytest

hypothesis = pytest.importorskip('hypothesis')
from hypothesis import given, settings, HealthCheck, strategies as st

from nxpretrain.errors import DataError
from nxpretrain.data.indexed import IndexedWriter, IndexedDataset, SIDECAR, HEADER_BYTES
from nxpretrain.data.bert_blocks import BertHDF5Dataset, HDF5_KEYS

SLOW = bool(os.environ.get('NXP_SLOW'))
CASES = int(os.environ.get('NXP_FUZZ_CASES', 350 if SLOW else 40))
fuzz = settings(max_examples=CASES, deadline=None, database=None, derandomize=not SLOW,
                suppress_health_check=list(HealthCheck))

docs = st.lists(st.lists(st.integers(0, 65535), max_size=40), min_size=1, max_size=12).filter(lambda d: any(d))
mutation = st.one_of(
    st.tuples(st.just('cut'), st.sampled_from(['bin', 'idx']), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just('flip'), st.sampled_from(['bin', 'idx']), st.floats(0, 1, exclude_max=True), st.integers(0, 7)))


def mutate(path: Path, m) -> int:
    "Apply the mutation to the file; returns the byte it touched."
    raw = path.read_bytes()
    at = int(m[2] * len(raw))
    path.write_bytes(raw[:at] if m[0] == 'cut' else raw[:at] + bytes([raw[at] ^ (1 << m[3])]) + raw[at + 1:])
    return at


def read_all(prefix):
    ds = IndexedDataset(prefix)
    return [ds[i].tolist() for i in range(len(ds))], ds.document_index.tolist()


@fuzz
@given(docs, mutation, st.booleans())
def test_indexed_pair_mutations(documents, m, sidecar):
    with tempfile.TemporaryDirectory() as d:
        prefix = f'{d}/x'
        with IndexedWriter(prefix) as w:
            for doc in documents: w.add_document(doc)
        if not sidecar: Path(prefix + SIDECAR).unlink()        # a pair made elsewhere (Megatron, NeMo)
        seqs, doc_index = read_all(prefix)
        path = Path(f'{prefix}.{m[1]}')
        if path.stat().st_size == 0: return
        at = mutate(path, m)
        try: got, got_index = read_all(prefix)
        except DataError as e:
            assert str(e).startswith(str(path)) or str(e).startswith(prefix), e     # names the file
            assert '\n' not in str(e)
            return
        # read without an error: only what the format cannot tell
        assert not sidecar, f'{m}: a mutation went unnoticed despite the checksums'
        if m[1] == 'bin':                                       # a flipped bit in a token: one wrong token
            flat, got_flat = sum(seqs, []), sum(got, [])
            assert sum(a != b for a, b in zip(flat, got_flat)) == 1 and len(flat) == len(got_flat)
        else:                                                   # a document index that stays in order: same tokens
            assert at >= HEADER_BYTES + 12 * len(seqs), (m, at)
            assert got == seqs and got_index != doc_index


def _shard(path, n, seq_len, rs):
    from nxpretrain.data.bert_blocks import write_bert_hdf5
    import torch
    samples = []
    for k in range(n):
        ids = torch.from_numpy(rs.randint(5, 900, seq_len))
        labels = torch.full((seq_len,), -100)
        labels[rs.choice(np.arange(1, seq_len), 3, replace=False)] = 7
        samples.append({'input_ids': ids, 'attention_mask': torch.ones(seq_len, dtype=torch.int64),
                        'token_type_ids': torch.from_numpy((np.arange(seq_len) > seq_len // 2).astype(np.int64)),
                        'labels': labels, 'next_sentence_label': torch.tensor(k % 2)})
    return write_bert_hdf5(path, samples, max_predictions=5)


def _items(path):
    ds = BertHDF5Dataset(path, vocab_size=1000)
    return [{k: v.tolist() for k, v in ds[i].items()} for i in range(len(ds))]


@settings(fuzz, max_examples=max(10, CASES // 2))
@given(st.integers(1, 6), st.integers(4, 32), mutation.map(lambda m: m[:1] + ('hdf5',) + m[2:]), st.integers(0, 2**31))
def test_bert_hdf5_mutations(n, seq_len, m, seed):
    with tempfile.TemporaryDirectory() as d:
        path = _shard(Path(d) / 's.hdf5', n, seq_len, np.random.RandomState(seed))
        want = _items(path)
        mutate(path, m)
        try: got = _items(path)
        except DataError as e:
            assert str(e).startswith(str(path)) and '\n' not in str(e), e
            return
        assert got == want, f'{m}: wrong samples without an error'  # a flip in bytes nobody reads (free space, padding)
