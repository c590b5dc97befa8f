"""megatron-core 0.16.1 as the oracle: it reads our .bin/.idx, we read its files, and our GPT indices equal its
arrays."""
import os
import numpy as np
import pytest

core = pytest.importorskip('megatron.core.datasets.indexed_dataset')
from megatron.core.datasets.indexed_dataset import IndexedDataset as MIndexed, IndexedDatasetBuilder
from nxpretrain.data.indexed import IndexedDataset, IndexedWriter, merge_datasets, write_idx
from nxpretrain.data.gpt_dataset import build_gpt_datasets, build_blending_indices


def random_docs(n, seed=0, vmax=60000, empty_every=7):
    rs = np.random.RandomState(seed)
    return [
        np.array([], np.int64) if i % empty_every == 3 else rs.randint(0, vmax, size=rs.randint(1, 300))
        for i in range(n)
    ]


@pytest.mark.parametrize('dtype', [np.uint16, np.int32])
def test_megatron_reads_ours(tmp_path, dtype):
    docs = random_docs(120, vmax=60000 if dtype == np.uint16 else 120000)
    with IndexedWriter(tmp_path / 'ours', dtype) as w:
        for d in docs[:50]: w.add_document(d)
        w.add_documents(np.concatenate(docs[50:]), [len(d) for d in docs[50:]])
    m = MIndexed(str(tmp_path / 'ours'))
    nonempty = [d for d in docs if len(d)]
    assert len(m) == len(nonempty) and m.sequence_lengths.dtype == np.int32
    for i, d in enumerate(nonempty): np.testing.assert_array_equal(m[i], d)
    ends = np.cumsum([len(d) > 0 for d in docs])
    np.testing.assert_array_equal(m.document_indices, np.concatenate([[0], ends]))
    assert m.index.dtype == dtype
    del m


@pytest.mark.parametrize('dtype', [np.uint16, np.int32])
def test_we_read_megatron_and_files_are_byte_identical(tmp_path, dtype):
    docs = random_docs(80, seed=1)
    b = IndexedDatasetBuilder(str(tmp_path / 'meg.bin'), dtype=dtype)
    for d in docs: b.add_document(d.astype(dtype), [len(d)] if len(d) else [])
    b.finalize(str(tmp_path / 'meg.idx'))
    ours = IndexedDataset(tmp_path / 'meg')
    nonempty = [d for d in docs if len(d)]
    assert len(ours) == len(nonempty)
    for i, d in enumerate(nonempty): np.testing.assert_array_equal(ours[i], d)
    with IndexedWriter(tmp_path / 'ours', dtype) as w:
        for d in docs: w.add_document(d)
    for s in ('.bin', '.idx'):
        assert (tmp_path / f'ours{s}').read_bytes() == (tmp_path / f'meg{s}').read_bytes()


def test_merge_equals_megatron_add_index(tmp_path):
    parts = [random_docs(30, seed=s) for s in range(3)]
    prefixes = []
    for k, docs in enumerate(parts):
        with IndexedWriter(tmp_path / f's{k}') as w:
            for d in docs: w.add_document(d)
        prefixes.append(str(tmp_path / f's{k}'))
    merge_datasets(prefixes, tmp_path / 'ours')
    b = IndexedDatasetBuilder(str(tmp_path / 'meg.bin'), dtype=np.uint16)
    for p in prefixes: b.add_index(p)
    b.finalize(str(tmp_path / 'meg.idx'))
    for s in ('.bin', '.idx'):
        assert (tmp_path / f'ours{s}').read_bytes() == (tmp_path / f'meg{s}').read_bytes()


def test_over_4gib_sparse(tmp_path):
    """Pointers past 4 GiB: a 2.2-billion-token int32 .bin (sparse, no disk used) read by both readers."""
    lengths = np.full(4, 550_000_000, np.int32)
    write_idx(tmp_path / 'big.idx', lengths, np.arange(5), np.int32)
    with open(tmp_path / 'big.bin', 'wb') as f:
        f.seek(int(lengths.sum()) * 4 - 4)
        f.write(np.int32(77).tobytes())
    ours, m = IndexedDataset(tmp_path / 'big'), MIndexed(str(tmp_path / 'big'))
    assert int(ours.pointers[-1]) == 3 * 550_000_000 * 4 > 2**32
    assert ours.get(3, 549_999_999, 1).tolist() == [77] == m.get(3, offset=549_999_999, length=1).tolist()
    np.testing.assert_array_equal(m.index.sequence_pointers, ours.pointers)
    del m


def _megatron_gpt(prefix, seq_len, split, seed, sizes, cache):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.tokenizers import MegatronTokenizer
    tok = MegatronTokenizer.from_pretrained(metadata_path={'library': 'null'}, vocab_size=65000)
    cfg = GPTDatasetConfig(random_seed=seed, sequence_length=seq_len, blend=([str(prefix)], None), split=split,
                           tokenizer=tok, path_to_cache=str(cache), reset_position_ids=False,
                           reset_attention_mask=False, eod_mask_loss=False)
    return BlendedMegatronDatasetBuilder(GPTDataset, list(sizes), lambda: True, cfg).build()


@pytest.mark.parametrize('seq_len,split,sizes', [
    (64, '949,50,1', (None, None, None)),       # one epoch
    (32, '90,8,2', (2000, 300, 50)),            # several epochs, final epoch separate or not per split
    (128, '80,20', (900, 81, None)),
    (16, '1', (1234, None, None)),
])
def test_gpt_indices_equal_megatron(tmp_path, seq_len, split, sizes):
    docs = random_docs(400, seed=2)
    with IndexedWriter(tmp_path / 'd') as w:
        for d in docs: w.add_document(d)
    meg = _megatron_gpt(tmp_path / 'd', seq_len, split, 4321, sizes, tmp_path / 'mcache')
    ours = build_gpt_datasets(str(tmp_path / 'd'), seq_len, split, 4321, sizes, cache=False)
    for m, o in zip(meg, ours):
        if o is None:   # ours: None where megatron-core builds an empty split
            assert m is None or len(m) == 0
            continue
        np.testing.assert_array_equal(m.document_index, o.document_index)
        np.testing.assert_array_equal(m.sample_index, o.sample_index)
        assert m.sample_index.dtype == o.sample_index.dtype
        np.testing.assert_array_equal(m.shuffle_index, o.shuffle_index)
        assert m.shuffle_index.dtype == o.shuffle_index.dtype
        assert len(m) == len(o)
        for k in list(range(5)) + [len(o) - 1]:
            a, b = m[k], o[k]
            assert a['tokens'].tolist() == b['tokens'].tolist() and a['labels'].tolist() == b['labels'].tolist()


@pytest.mark.parametrize('weights,size', [([0.5, 0.3, 0.2], 1000), ([1, 1], 17), ([0.01, 0.99, 3], 5000)])
def test_blending_equals_megatron(weights, size):
    from megatron.core.datasets import helpers
    w = np.array(weights, np.float64) / np.sum(weights)
    di, dsi = np.zeros(size, np.int16), np.zeros(size, np.int64)
    helpers.build_blending_indices(di, dsi, w, len(w), size, False)
    ours = build_blending_indices(weights, size)
    np.testing.assert_array_equal(ours[0], di)
    np.testing.assert_array_equal(ours[1], dsi)


def test_blended_gpt_datasets_equal_megatron(tmp_path):
    import torch.distributed as dist
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.tokenizers import MegatronTokenizer
    from nxpretrain.data.gpt_dataset import build_blended_gpt_datasets
    prefixes = []
    for k in range(3):
        with IndexedWriter(tmp_path / f'c{k}') as w:
            for d in random_docs(150 + 50 * k, seed=10 + k): w.add_document(d)
        prefixes.append(str(tmp_path / f'c{k}'))
    blend, sizes = [0.5, prefixes[0], 0.3, prefixes[1], 0.2, prefixes[2]], (700, 60, 20)
    if not dist.is_initialized():   # megatron-core 0.16.1 needs a process group to cache blended indices
        dist.init_process_group('gloo', init_method=f'file://{tmp_path}/pg', rank=0, world_size=1)
    try:
        tok = MegatronTokenizer.from_pretrained(metadata_path={'library': 'null'}, vocab_size=65000)
        cfg = GPTDatasetConfig(random_seed=99, sequence_length=32, blend=(prefixes, [0.5, 0.3, 0.2]), split='90,7,3',
                               tokenizer=tok, path_to_cache=str(tmp_path / 'mcache'), reset_position_ids=False,
                               reset_attention_mask=False, eod_mask_loss=False)
        meg = BlendedMegatronDatasetBuilder(GPTDataset, list(sizes), lambda: True, cfg).build()
    finally: dist.destroy_process_group()
    ours = build_blended_gpt_datasets(blend, 32, '90,7,3', 99, sizes, cache=False)
    for m, o in zip(meg, ours):
        assert len(m) == len(o)
        np.testing.assert_array_equal(m.dataset_index, o.dataset_index)
        np.testing.assert_array_equal(m.dataset_sample_index, o.dataset_sample_index)
        for md, od in zip(m.datasets, o.datasets):
            np.testing.assert_array_equal(md.shuffle_index, od.shuffle_index)
            np.testing.assert_array_equal(md.sample_index, od.sample_index)
        for k in (0, 1, len(o) // 2, len(o) - 1):
            assert m[k]['tokens'].tolist() == o[k]['tokens'].tolist()
