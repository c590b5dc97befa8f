"""Commands that jobs and errors print are commands that run: the `nxpretrain data …` hint of a job's missing corpus
names what `nxpretrain data` takes (a recipe: its corpus and tokenizer), and `data --help` shows examples."""
import re, shlex
import pytest
from nxpretrain.cli import main
from nxpretrain.recipes import get_recipe
import nxpretrain.data.prepare as prepare_module
from nxpretrain.launch.job import export_jobs


def _data_hints(script: str) -> list[list[str]]:
    return [shlex.split(m) for m in re.findall(r'(nxpretrain data [^:\'"]+?)(?:::|\'|"|$)', script, re.M)]


@pytest.mark.parametrize('name', ['gpt3_23b', 'gpt3_175b_gpu', 'gpt3_64m'])
def test_the_data_hint_of_a_job_runs(tmp_path, monkeypatch, name):
    from nxpretrain.engines.base import engine_of
    r = get_recipe(name)
    jobs = export_jobs(engine_of(r), r, tmp_path / 'job', data_root=str(tmp_path / 'data'))
    text = '\n'.join(p.read_text() for p in (tmp_path / 'job').glob('*.s*') if p.is_file())
    hints = _data_hints(text)
    assert hints, text[:2000]
    seen = []
    monkeypatch.setattr(prepare_module, 'prepare', lambda corpus, tokenizer, *a, **k: seen.append((corpus, tokenizer))
                        or [])
    for argv in hints:
        assert argv[:2] == ['nxpretrain', 'data'], argv
        main(argv[1:])
    assert seen and all(s == (r.data.corpus, r.data.tokenizer) for s in seen), seen


def test_data_help_has_examples(capsys):
    with pytest.raises(SystemExit): main(['data', '--help'])
    out = capsys.readouterr().out
    assert 'examples:' in out and 'nxpretrain data gpt3_23b' in out
