"""Property-based fuzzing of the whole data path: generated .jsonl (any Unicode, surrogates and control characters
included, empty to multi-megabyte documents, malformed lines mixed in) → `prepare` (what `nxpretrain data` runs) →
.bin/.idx → megatron-core `IndexedDataset`, for GPT-2 byte-level BPE, SentencePiece and WordPiece.

Properties: the stage never crashes; every valid document is the reference tokenizer's ids of its whole text + EOD;
every invalid line is reported with its byte offset (and a strict run names the first); the manifest's counts add up;
a second run writes nothing. The fast set runs in the normal pytest run; NXP_SLOW=1 runs the slow set (1,050 cases).
"""
import hashlib, json, os, sys, tempfile
from pathlib import Path
import numpy as np
import pytest

hypothesis = pytest.importorskip('hypothesis')
from hypothesis import given, settings, HealthCheck, strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from data_helpers import build_tokenizers, reference_encoder, big_document
from nxpretrain.data.prepare import prepare, read_manifest
from nxpretrain.errors import DataError
from nxpretrain.data.tokenizers import get_tokenizer
from nxpretrain.data.cuts import encode_whole, cut_rule

SLOW = bool(os.environ.get('NXP_SLOW'))
TOKENIZERS = ['gpt2', 'sentencepiece', 'wordpiece']
CASES = int(os.environ.get('NXP_FUZZ_CASES', 350 if SLOW else 12))   # per tokenizer
fuzz = settings(max_examples=CASES, deadline=None, database=None, derandomize=not SLOW, print_blob=True,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope='module')
def toks(tmp_path_factory):
    return build_tokenizers(tmp_path_factory.mktemp('toks'))


# ---- generated text -------------------------------------------------------------------------------------------------
HOSTILE = ['\x00', '\x01', '\x1f', '\x7f', '\x85', '\u2028', '\u2029', '\r\n', '\r', '\n', '\t', '\x0b', ' ', '  ',
           '\xa0', '\u3000', '中文没有空格', '日本語', '한국어', '\U0001f600', '\U0001f468\u200d\U0001f469',
           'שלום', 'مرحبا', 'e\u0301', '\u0301', '\ufeff', '\u200b', '\ufffd', '\uffff', '\U0010ffff',
           '<|endoftext|>',
           '[SEP]', '[CLS]', "'s", "n't", 'a1b2', '+/==', '\\', '"', '\ud800', '\udfff', '\ud83d',
           'İ', 'ß', 'ǅ', 'x' * 50, '1' * 20, 'word']
any_char = st.characters(exclude_categories=())          # every code point, surrogates included
piece = st.one_of(st.text(any_char, max_size=30), st.sampled_from(HOSTILE))
small_text = st.lists(piece, max_size=10).map(''.join)
# past 2**20 characters, where a document is encoded in pieces: random text repeated, or a script with few cut points
big_text = st.one_of(
    st.tuples(small_text.filter(lambda t: t.strip()), st.integers(1_050_000, 1_400_000)).map(
        lambda a: (a[0] * (a[1] // len(a[0]) + 1))[: a[1]]
    ),
    st.builds(big_document, st.sampled_from(['cjk', 'base64', 'repeated', 'newlines']),
              st.integers(1_100_000, 3_500_000)),
)
# a big document in about one valid line of 150 in the slow set (each costs seconds), none in the fast set
text = st.integers(0, 149).flatmap(lambda k: big_text if k == 0 else small_text) if SLOW else small_text


@st.composite
def valid_line(draw):
    t = draw(text)
    obj = {'text': t}
    if draw(st.booleans()): obj = {'id': draw(st.integers()), **obj, 'meta': {'x': draw(small_text)}}
    raw = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    return raw.encode('utf-8', 'surrogatepass')          # a raw lone surrogate becomes invalid UTF-8: a bad line too


@st.composite
def malformed_line(draw):
    good = json.dumps({'text': draw(small_text)}).encode()
    return draw(st.sampled_from([
        good[:draw(st.integers(1, max(1, len(good) - 1)))],                       # truncated
        b'{"text": 5}', b'{"text": null}', b'{"text": ["a"]}', b'[1, 2]', b'"text"', b'{"txt": "x"}', b'{"text": NaN}',
        b'{"text": "raw \x01 control"}', b'{"text": "bad \xff byte"}', b'{"text": "cut \xe4\xb8"}', b'{text: "x"}',
        b'\xef\xbb\xbf{"text": "bom"}', b'{"text": "a"} trailing', b'}{',
        draw(st.binary(max_size=40)).replace(b'\n', b''),                          # noise (blank if only whitespace)
    ]))


line = st.one_of(valid_line(), valid_line(), malformed_line(), st.sampled_from([b'', b'   ', b'\t', b'\r']))
corpus = st.tuples(st.lists(line, max_size=12), st.booleans())   # lines; does the file end with a newline


# ---- the oracle -----------------------------------------------------------------------------------------------------
def classify(raw: bytes):
    """('blank', None) | ('bad', None) | ('doc', text), by the definition: UTF-8 JSON object with a string text that is
    text."""
    if not raw.strip(): return 'blank', None
    try: obj = json.loads(raw.decode('utf-8'))
    except ValueError: return 'bad', None
    if not isinstance(obj, dict) or not isinstance(obj.get('text'), str): return 'bad', None
    try: obj['text'].encode('utf-8')
    except UnicodeEncodeError: return 'bad', None
    return 'doc', obj['text']


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob('*')) if p.is_file()}


def check_corpus(lines: list, ends_with_newline: bool, spec: str, workers: int = 1):
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronIndexed
    ref, eod = reference_encoder(spec)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        data = b'\n'.join(lines) + (b'\n' if ends_with_newline and lines else b'')
        src = d / 'c.jsonl'
        src.write_bytes(data)
        raws = data.split(b'\n')
        if raws[-1] == b'': raws.pop()    # a file's lines: an empty last one without its newline is no line
        offsets, pos = [], 0
        for raw in raws:
            offsets.append(pos)
            pos += len(raw) + 1
        kinds = [classify(raw) for raw in raws]
        texts = [t for k, t in kinds if k == 'doc']
        bad_at = [o for o, (k, _) in zip(offsets, kinds) if k == 'bad']
        # strict: the first bad line, by file and byte offset, and no output
        if bad_at:
            with pytest.raises(DataError, match=rf'c\.jsonl:byte {bad_at[0]}: .*strict mode'):
                prepare(str(src), spec, str(d / 'strict'), workers=workers, strict=True, progress=False)
            assert not list((d / 'strict').rglob('*.idx'))
        want = [ids + [eod] if ids else [] for ids in map(ref, texts)]
        if not any(want):   # nothing to train on: one clear error, no dataset
            with pytest.raises(
                DataError, match=rf'c\.jsonl: no document has tokens \({len(texts)} documents, {len(bad_at)} bad lines'
            ):
                prepare(str(src), spec, str(d / 'out'), workers=workers, progress=False)
            assert not list((d / 'out').rglob('*.idx')) and not list((d / 'out').rglob('*.bin'))
            return
        # never crashes; every valid document equals the whole-text encoding + EOD
        prefix, = prepare(str(src), spec, str(d / 'out'), workers=workers, progress=False)
        m = MegatronIndexed(prefix)
        got = [np.array(m[i]).tolist() for i in range(len(m))]
        doc_index = np.array(m.document_indices)
        del m
        assert got == [w for w in want if w]
        assert doc_index.tolist() == [0] + np.cumsum([bool(w) for w in want]).tolist()
        # every invalid line reported, with its byte offset; the manifest adds up
        rec, = read_manifest(d / 'out' / 'c').values()
        report = Path(rec['bad_report']).read_text().splitlines() if rec['bad_report'] else []
        assert [int(r.split(':byte ')[1].split(':')[0]) for r in report] == bad_at
        assert all(r.startswith(f'{src}:byte ') for r in report)
        assert (rec['documents'], rec['bad'], rec['blank']) == (len(texts), len(bad_at),
                                                                sum(k == 'blank' for k, _ in kinds))
        assert rec['documents'] + rec['bad'] + rec['blank'] == len(raws)
        assert rec['tokens'] == sum(map(len, want)) and rec['empty'] == texts.count('')
        # a second run writes nothing new
        before = snapshot(d / 'out')
        assert prepare(str(src), spec, str(d / 'out'), workers=workers, progress=False) == [prefix]
        assert snapshot(d / 'out') == before


@pytest.mark.parametrize('tokenizer', TOKENIZERS)
@fuzz
@given(c=corpus)
def test_prepare_properties(toks, tokenizer, c):
    check_corpus(*c, toks[tokenizer])


@pytest.mark.parametrize('tokenizer', TOKENIZERS)
@settings(fuzz, max_examples=max(3, CASES // 10))
@given(c=st.tuples(st.lists(line, min_size=4, max_size=30), st.booleans()))
def test_prepare_properties_two_workers(toks, tokenizer, c):
    """Byte ranges read by two processes: the same properties (fewer cases: each starts a process pool)."""
    check_corpus(*c, toks[tokenizer], workers=2)


ENCODABLE = st.lists(
    st.one_of(
        st.text(st.characters(exclude_categories=['Cs']), max_size=30),  # what parse_line lets through
        st.sampled_from([h for h in HOSTILE if not 0xD800 <= ord(h[0]) <= 0xDFFF]),
    ),
    max_size=40,
).map(''.join)


@pytest.mark.parametrize('tokenizer', ['gpt2', 'wordpiece'])
@settings(fuzz, max_examples=CASES * 4 if SLOW else CASES * 20)
@given(t=ENCODABLE, max_chars=st.integers(2, 64))
def test_cuts_equal_whole_text(toks, tokenizer, t, max_chars):
    """The cut rules on small pieces: any text cut at safe places every few characters equals the whole."""
    tok = get_tokenizer(toks[tokenizer])
    assert cut_rule(tok) is not None
    assert encode_whole(tok, t, max_chars).tolist() == tok.tok.encode(t, add_special_tokens=False).ids
