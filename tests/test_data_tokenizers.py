"""Our tokenizers give the same ids as transformers' tokenizers on the demo corpus, for every kind of tokenizer file."""
from pathlib import Path
import pytest

transformers = pytest.importorskip('transformers')
from nxpretrain.data.corpus import demo_documents
from nxpretrain.data.tokenizers import get_tokenizer, train_bpe

DOCS = demo_documents()[:1500]


def _same(ours, ref_encode, docs=DOCS):
    bad = [i for i, d in enumerate(docs) if ours.encode(d) != ref_encode(d)]
    assert not bad, f'{len(bad)}/{len(docs)} documents differ, first {bad[:5]}'
    assert ours.encode_batch(docs[:50]) == [ref_encode(d) for d in docs[:50]]


def test_gpt2_vocab_merges_equal_transformers(tmp_path):
    train_bpe(DOCS, 3000).tok.model.save(str(tmp_path))         # vocab.json + merges.txt, GPT-2 layout
    ours = get_tokenizer(f'gpt2:{tmp_path}')
    ref = transformers.GPT2Tokenizer(str(tmp_path / 'vocab.json'), str(tmp_path / 'merges.txt'))
    _same(ours, lambda t: ref.encode(t, add_special_tokens=False))
    assert ours.eod_id == ref.convert_tokens_to_ids('<|endoftext|>') and ours.vocab_size == 3000


def test_tokenizer_json_llama3_style_equal_transformers(tmp_path):
    from tokenizers import processors
    t = train_bpe(DOCS, 2000, eod='<|end_of_text|>')
    t.tok.add_special_tokens(['<|begin_of_text|>'])
    bos = t.tok.token_to_id('<|begin_of_text|>')
    t.tok.post_processor = processors.TemplateProcessing(single='<|begin_of_text|> $A',
                                                         special_tokens=[('<|begin_of_text|>', bos)])
    t.tok.save(str(tmp_path / 'tokenizer.json'))
    ours = get_tokenizer(str(tmp_path / 'tokenizer.json'))
    ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / 'tokenizer.json'))
    _same(ours, lambda s: ref.encode(s, add_special_tokens=False))
    assert ours.eod_id == ref.convert_tokens_to_ids('<|end_of_text|>')
    assert ref.encode('Hello') == [bos] + ours.encode('Hello')      # the pipeline adds no BOS, only the EOD


def test_wordpiece_equal_transformers(tmp_path):
    from tokenizers.implementations import BertWordPieceTokenizer
    w = BertWordPieceTokenizer(lowercase=True)
    w.train_from_iterator(DOCS, vocab_size=3000, show_progress=False)
    w.save_model(str(tmp_path))
    ours = get_tokenizer(str(tmp_path / 'vocab.txt'))
    ref = transformers.BertTokenizer(str(tmp_path / 'vocab.txt'), do_lower_case=True)
    _same(ours, lambda s: ref.encode(s, add_special_tokens=False))
    assert ours.eod_id == ref.sep_token_id


def test_sentencepiece_equal_reference(tmp_path):
    spm = pytest.importorskip('sentencepiece')
    (tmp_path / 'c.txt').write_text('\n'.join(d.replace('\n', ' ') for d in DOCS))
    spm.SentencePieceTrainer.train(input=str(tmp_path / 'c.txt'), model_prefix=str(tmp_path / 'sp'), vocab_size=1000,
                                   model_type='bpe', minloglevel=2)
    ours = get_tokenizer(str(tmp_path / 'sp.model'))
    ref = spm.SentencePieceProcessor(model_file=str(tmp_path / 'sp.model'))
    _same(ours, ref.encode, [d.replace('\n', ' ') for d in DOCS])
    assert ours.eod_id == ref.eos_id() == 2 and ours.vocab_size == 1000
