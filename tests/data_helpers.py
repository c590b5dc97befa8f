"""Tokenizers built here (no downloads) and hostile documents, for the data-stage tests."""
import base64, json, random
from pathlib import Path

from nxpretrain.data.corpus import demo_documents
from nxpretrain.data.tokenizers import train_bpe

CJK = ''.join(chr(c) for c in range(0x4E00, 0x4E00 + 400))   # a few hundred common-block Han characters


def cjk_text(n_chars: int, seed: int = 0) -> str:
    "Chinese-like text without spaces: words of 1–4 characters from a small set, so a trained BPE has merges for them."
    rs = random.Random(seed)
    words = [''.join(rs.choice(CJK[:120]) for _ in range(rs.randint(1, 4))) for _ in range(300)]
    out, n = [], 0
    while n < n_chars:
        w = rs.choice(words)
        out.append(w)
        n += len(w)
    return ''.join(out)[:n_chars]


def training_texts() -> list:
    "English (the demo corpus) and Chinese without spaces."
    return demo_documents()[:2500] + [cjk_text(2000, seed=i) for i in range(60)]


def build_tokenizers(d: Path) -> dict:
    "GPT-2-style byte-level BPE (vocab.json + merges.txt, and as tokenizer.json), SentencePiece and WordPiece, in `d`."
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    texts = training_texts()
    bpe = train_bpe(texts, 4000)
    (d / 'gpt2').mkdir(exist_ok=True)
    bpe.tok.model.save(str(d / 'gpt2'))
    bpe.tok.save(str(d / 'tok.json'))
    import sentencepiece as spm
    (d / 'sp.txt').write_text('\n'.join(t.replace('\n', ' ')[:4000] for t in texts), encoding='utf-8')
    spm.SentencePieceTrainer.train(input=str(d / 'sp.txt'), model_prefix=str(d / 'sp'), vocab_size=2000,
                                   model_type='bpe', minloglevel=2)
    from tokenizers.implementations import BertWordPieceTokenizer
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(texts, vocab_size=3000, show_progress=False)
    wp.save_model(str(d))
    return {'gpt2': f'gpt2:{d / "gpt2"}', 'sentencepiece': str(d / 'sp.model'), 'wordpiece': str(d / 'vocab.txt')}


def reference_encoder(spec: str):
    "The reference libraries themselves, loaded from the same files: HF `tokenizers` and `sentencepiece`."
    if spec.endswith('.model'):
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=spec)
        return lambda text: sp.encode(text), sp.eos_id()
    from tokenizers import Tokenizer
    from tokenizers.implementations import ByteLevelBPETokenizer, BertWordPieceTokenizer
    if spec.startswith('gpt2:'):
        d = Path(spec[5:])
        t = ByteLevelBPETokenizer(str(d / 'vocab.json'), str(d / 'merges.txt'))
        eod = t.token_to_id('<|endoftext|>')
    elif spec.endswith('.txt'):
        t = BertWordPieceTokenizer(spec, lowercase=True)
        eod = t.token_to_id('[SEP]')
    else:
        t = Tokenizer.from_file(spec)
        eod = t.token_to_id('<|endoftext|>')
    return lambda text: t.encode(text, add_special_tokens=False).ids, eod


def big_document(script: str, n_bytes: int, seed: int = 0) -> str:
    "A document of about `n_bytes` UTF-8 bytes: cjk (no spaces), base64, repeated (one character), newlines (mixed)."
    rs = random.Random(seed)
    if script == 'cjk': return cjk_text(n_bytes // 3, seed)
    if script == 'base64': return base64.b64encode(rs.randbytes(n_bytes * 3 // 4)).decode()
    if script == 'repeated': return 'a' * n_bytes
    if script == 'newlines':
        words = ['data', 'token', 'naïve', 'ünïcode', '12', '中文', 'x', '']
        seps = ['\n', '\r\n', '\r', '\u2028', '\n\n', ' ', '  ', '\t']
        out, n = [], 0
        while n < n_bytes:
            w = rs.choice(words) + rs.choice(seps)
            out.append(w)
            n += len(w.encode())
        return ''.join(out)
    raise ValueError(script)


def write_lines(path: Path, lines) -> Path:
    "Write raw JSONL lines (bytes, or texts dumped as JSON)."
    with open(path, 'wb') as f:
        for x in lines: f.write((x if isinstance(x, bytes) else json.dumps({'text': x}).encode()) + b'\n')
    return path
