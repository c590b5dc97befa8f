"""Data-stage benchmark: our jsonl → .bin/.idx against Megatron-LM's tools/preprocess_data.py and against the tokenizer
alone, on the same corpus, tokenizer and worker count, side by side in one run; then the GPT sample index for 1e9
tokens against megatron-core's compiled helper. Prints ratios; checks that outputs are identical.

Get Megatron-LM (not part of this repository) and point --megatron at it, e.g. git clone --depth 1 --branch
core_v0.16.1 https://github.com/NVIDIA/Megatron-LM /tmp/Megatron-LM python bench/bench_data.py --megatron
/tmp/Megatron-LM --workers 2 megatron-core 0.16.1 must be installed (pip install megatron-core==0.16.1) for the
sample-index part and for Megatron-LM's tool. Megatron-LM's training package imports a triton GPU kernel at import
time that preprocess_data never runs; on a CPU machine without triton the tool is started through a two-line wrapper
that stubs that one module."""
import argparse, os, shutil, subprocess, sys, tempfile, textwrap, time
from pathlib import Path
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nxpretrain.data.corpus import demo_documents, write_jsonl
from nxpretrain.data.tokenizers import get_tokenizer
from nxpretrain.data.indexed import IndexedDataset

_MEG_WRAPPER = textwrap.dedent('''
    import sys, types, runpy
    name = 'megatron.core.transformer.custom_layers.batch_invariant_kernels'
    try: import triton  # noqa: F401
    except ImportError:
        m = types.ModuleType(name); m.enable_batch_invariant_mode = lambda *a, **k: None; sys.modules[name] = m
    sys.argv = ['tools/preprocess_data.py'] + sys.argv[1:]
    runpy.run_path('tools/preprocess_data.py', run_name='__main__')
''')


def timed(cmd, **kw):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    dt = time.perf_counter() - t0
    if r.returncode: raise SystemExit(f'{cmd[:3]} failed:\n{r.stderr[-2000:]}')
    return dt


def bench_preprocess(args, work: Path):
    tok = get_tokenizer('demo', work / 'cache')
    tok.tok.model.save(str(work))                                 # vocab.json + merges.txt: the same BPE for both tools
    docs = demo_documents() * args.repeat
    corpus = write_jsonl(docs, work / 'corpus.jsonl')
    mb = corpus.stat().st_size / 1e6
    print(f'corpus: {len(docs):,} documents, {mb:.1f} MB JSONL; byte-level BPE {tok.vocab_size} tokens; '
          f'workers={args.workers}')

    gpt2 = get_tokenizer(f'gpt2:{work}')
    t0 = time.perf_counter()
    ids = gpt2.encode_batch(docs)
    t_tok = time.perf_counter() - t0  # HF batch encode, all cores
    n_tokens = sum(map(len, ids)) + len(docs)
    del ids
    from nxpretrain.data.prepare import tokenize_files
    st = tokenize_files([corpus], work / 'inproc', f'gpt2:{work}', args.workers, str(work / 'cache'), progress=False)

    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'TOKENIZERS_PARALLELISM': 'true'}
    ours_cmd = [sys.executable, '-m', 'nxpretrain.data.prepare', str(corpus), '--tokenizer', f'gpt2:{work}', '--output',
                str(work / 'ours'), '--workers', str(args.workers), '--no-progress']
    results = {'tokenizer alone (encode_batch, in memory)': t_tok, 'ours, pipeline in this process': st['seconds']}
    for rnd in range(args.rounds):                                 # alternate the tools so drifting load hits both
        shutil.rmtree(work / 'ours', ignore_errors=True)
        t = timed(ours_cmd, env=env)   # a fresh interpreter, like Megatron's: imports included
        results['ours end-to-end'] = min(t, results.get('ours end-to-end', 1e9))
        if args.megatron:
            (work / 'meg.py').write_text(_MEG_WRAPPER)
            meg_cmd = [sys.executable, str(work / 'meg.py'), '--input', str(corpus), '--output-prefix',
                       str(work / 'meg'), '--tokenizer-type', 'GPT2BPETokenizer', '--vocab-file',
                       str(work / 'vocab.json'), '--merge-file', str(work / 'merges.txt'), '--append-eod', '--workers',
                       str(args.workers), '--legacy-tokenizer', '--log-interval', '1000000']
            t = timed(meg_cmd, cwd=args.megatron, env={**os.environ, 'PYTHONPATH': str(Path(args.megatron).resolve())})
            results['Megatron-LM preprocess_data end-to-end'] = min(
                t, results.get('Megatron-LM preprocess_data end-to-end', 1e9)
            )

    ours_prefix = next((work / 'ours').rglob('*_text_document.idx')).with_suffix('')
    assert IndexedDataset(ours_prefix).num_tokens == n_tokens, 'token count differs from the tokenizer alone'
    print(f'\n{"":42s} {"seconds":>8s} {"M tokens/s":>11s}')
    for k, v in results.items(): print(f'{k:42s} {v:8.2f} {n_tokens / v / 1e6:11.3f}')
    ours = results['ours end-to-end']
    print(f'\nours / tokenizer alone: {t_tok / ours:.2f} of the tokenizer-alone speed end-to-end (target ≥ 0.80), '
          f'{t_tok / st["seconds"]:.2f} for the pipeline without interpreter start-up')
    if args.megatron:
        meg = results['Megatron-LM preprocess_data end-to-end']
        same = all(
            (Path(str(ours_prefix) + s).read_bytes() == (work / f'meg_text_document{s}').read_bytes())
            for s in ('.bin', '.idx')
        )
        print(f'ours vs Megatron-LM: {meg / ours:.2f}× faster (target ≥ 2.5×); outputs byte-identical: {same}')
    return results


def bench_sample_index(args):
    from megatron.core.datasets import helpers
    from megatron.core.datasets.gpt_dataset import _build_document_index, _build_shuffle_index
    from nxpretrain.data.gpt_dataset import build_document_index, build_sample_index, build_shuffle_index
    rs = np.random.RandomState(0)
    sizes = np.clip(rs.lognormal(6.5, 1.0, int(args.tokens / 1000)), 1, 200_000).astype(np.int32)   # ≈1000 tokens/doc
    sizes = sizes[:np.searchsorted(np.cumsum(sizes, dtype=np.int64), args.tokens) + 1]
    docs, S, T = np.arange(len(sizes), dtype=np.int32), args.seq_len, int(sizes.sum(dtype=np.int64))
    print(f'\nGPT sample index: {len(sizes):,} documents, {T / 1e9:.2f} B tokens, seq_len {S}, one epoch')
    best = {}
    for rnd in range(args.rounds):
        for who in ('megatron-core (C++ helper)', 'ours (NumPy)'):
            rng = np.random.RandomState(1234)
            t0 = time.perf_counter()
            if who.startswith('megatron'):
                d = _build_document_index(docs, 1, rng, False)
                t1 = time.perf_counter()
                s = helpers.build_sample_idx(sizes, d, S, 1, T, True, True)
                t2 = time.perf_counter()
                sh = _build_shuffle_index(s.shape[0] - 1, s.shape[0] - 1, rng)
            else:
                d = build_document_index(docs, 1, rng, False)
                t1 = time.perf_counter()
                s = build_sample_index(sizes, d, S, 1, T, True, 1)
                t2 = time.perf_counter()
                sh = build_shuffle_index(s.shape[0] - 1, s.shape[0] - 1, rng)
            t3 = time.perf_counter()
            prev = best.get(who, (1e9, 1e9, None))
            best[who] = (min(prev[0], t3 - t0), min(prev[1], t2 - t1), (d, s, sh))
    (m_all, m_si, m_arr), (o_all, o_si, o_arr) = best['megatron-core (C++ helper)'], best['ours (NumPy)']
    same = all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(m_arr, o_arr))
    print(f'{"":28s} {"sample index s":>15s} {"all three s":>12s}')
    print(f'{"megatron-core (C++ helper)":28s} {m_si:15.3f} {m_all:12.3f}')
    print(f'{"ours (NumPy)":28s} {o_si:15.3f} {o_all:12.3f}')
    print(f'ours / megatron-core time: sample index {o_si / m_si:.2f}, all three indices {o_all / m_all:.2f} (target '
          f'≤ 1); arrays identical: {same}')


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--megatron', help='path to a Megatron-LM checkout (core_v0.16.1); without it the Megatron-LM '
                                       'column is skipped')
    ap.add_argument('--workers', type=int, default=2)
    ap.add_argument('--repeat', type=int, default=3, help='demo corpus copies in the benchmark JSONL (≈2.4 MB each)')
    ap.add_argument('--rounds', type=int, default=1, help='alternating rounds; the best time of each tool is kept')
    ap.add_argument('--tokens', type=float, default=1e9, help='tokens for the sample-index benchmark')
    ap.add_argument('--seq-len', type=int, default=2048)
    ap.add_argument('--work', help='scratch directory (default: a temporary one)')
    ap.add_argument('--skip-preprocess', action='store_true')
    ap.add_argument('--skip-index', action='store_true')
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix='bench_data_'))
    work.mkdir(parents=True, exist_ok=True)
    print(f'machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared machines make absolute '
          'numbers noisy; compare the ratios)')
    if not args.skip_preprocess: bench_preprocess(args, work)
    if not args.skip_index: bench_sample_index(args)
