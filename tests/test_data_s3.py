"""S3 downloads and uploads against a real S3 server (moto's) started on localhost: anonymous and signed access,
multipart uploads, a transfer broken mid-way and resumed with a range request, checksum mismatches and a missing
bucket – each failure one line. `sync` through s5cmd where it is installed and through boto3."""
import hashlib, json, os, shutil
from pathlib import Path
import pytest
from nxpretrain.data.corpus import DataError
from nxpretrain.data import s3
from s3_helpers import s3_server, make_public, CuttingProxy

pytest.importorskip('boto3')
pytest.importorskip('moto')


@pytest.fixture(scope='module')
def endpoint():
    with s3_server() as url:
        c = s3.s3_client(endpoint_url=url)
        for b in ('public-data', 'private-data'): c.create_bucket(Bucket=b)
        make_public(c, 'public-data')
        yield url


@pytest.fixture
def blob(tmp_path):
    b = os.urandom(3_000_000)
    (tmp_path / 'blob.bin').write_bytes(b)
    return b


def test_anonymous_reads_a_public_bucket_signed_reads_a_private_one(tmp_path, endpoint, blob):
    s3.upload(tmp_path / 'blob.bin', 's3://public-data/x/blob.bin', endpoint_url=endpoint, progress=False)
    s3.upload(tmp_path / 'blob.bin', 's3://private-data/x/blob.bin', endpoint_url=endpoint, progress=False)
    got = s3.download('s3://public-data/x/blob.bin', tmp_path / 'anon' / 'blob.bin', anonymous=True,
                      endpoint_url=endpoint, progress=False)
    assert got.read_bytes() == blob
    got = s3.download('s3://private-data/x/blob.bin', tmp_path / 'signed' / 'blob.bin', endpoint_url=endpoint,
                      progress=False)
    assert got.read_bytes() == blob
    with pytest.raises(DataError) as e:
        s3.download('s3://private-data/x/blob.bin', tmp_path / 'denied' / 'blob.bin', anonymous=True,
                    endpoint_url=endpoint, progress=False)
    assert '\n' not in str(e.value) and 'access denied' in str(e.value) and 'not public' in str(e.value)
    assert not (tmp_path / 'denied' / 'blob.bin').exists()


def test_multipart_upload_and_its_etag_checked_on_download(tmp_path, endpoint):
    data = os.urandom(12 << 20)
    (tmp_path / 'big.bin').write_bytes(data)
    etag = s3.upload(tmp_path / 'big.bin', 's3://private-data/big.bin', endpoint_url=endpoint, part_size=5 << 20,
                     multipart_threshold=5 << 20, progress=False)
    assert etag.endswith('-3') and etag == s3.etag_of(tmp_path / 'big.bin', 5 << 20)      # three parts of 5 MiB
    got = s3.download('s3://private-data/big.bin', tmp_path / 'out' / 'big.bin', endpoint_url=endpoint, progress=False)
    assert hashlib.sha256(got.read_bytes()).digest() == hashlib.sha256(data).digest()
    # an object uploaded by another tool (no sha256 metadata) is checked by its multipart ETag
    c = s3.s3_client(endpoint_url=endpoint)
    c.copy_object(Bucket='private-data', Key='big-copy.bin', CopySource={'Bucket': 'private-data', 'Key': 'big.bin'},
                  MetadataDirective='REPLACE')
    assert 'sha256' not in c.head_object(Bucket='private-data', Key='big-copy.bin')['Metadata']
    head = c.head_object(Bucket='private-data', Key='big-copy.bin')
    assert s3.verify(got, 's3://private-data/big-copy.bin', head['ContentLength'], head['ETag']) in ('etag', 'size')


def _ranges(client):
    "The Range header of every GetObject the client sends."
    seen = []
    client.meta.events.register('before-call.s3.GetObject', lambda params,
                                **kw: seen.append(params.get('headers', {}).get('Range')))
    return seen


def test_broken_transfer_refetches_only_the_broken_range(tmp_path, endpoint, blob):
    s3.upload(tmp_path / 'blob.bin', 's3://public-data/resume/blob.bin', endpoint_url=endpoint, progress=False)
    host, port = endpoint[7:].split(':')
    proxy = CuttingProxy((host, int(port)), cut_after=300_000)              # one connection dies mid-transfer
    client = s3.s3_client(anonymous=True, endpoint_url=proxy.url)
    ranges = _ranges(client)
    try:
        got = s3.download('s3://public-data/resume/blob.bin', tmp_path / 'out' / 'blob.bin', anonymous=True,
                          client=client, part_size=500_000, concurrency=2, progress=False)
    finally: proxy.close()
    assert proxy.cuts == 1 and got.read_bytes() == blob
    parts = [f'bytes={lo}-{min(len(blob), lo + 500_000) - 1}' for lo in range(0, len(blob), 500_000)]
    assert sorted(set(ranges)) == sorted(parts) and len(ranges) == len(parts) + 1      # one range asked again, no more
    assert not (tmp_path / 'out' / 'blob.bin.part').exists() and not (tmp_path / 'out' / 'blob.bin.part.json').exists()


def test_resume_across_runs_from_a_part_file(tmp_path, endpoint, blob):
    "A run that died after two of six parts: the next one asks only for the other four."
    s3.upload(tmp_path / 'blob.bin', 's3://public-data/again/blob.bin', endpoint_url=endpoint, progress=False)
    out = tmp_path / 'out' / 'blob.bin'
    out.parent.mkdir()
    client = s3.s3_client(anonymous=True, endpoint_url=endpoint)
    etag = client.head_object(Bucket='public-data', Key='again/blob.bin')['ETag']
    Path(str(out) + '.part').write_bytes(blob[:1_000_000] + bytes(len(blob) - 1_000_000))
    Path(str(out) + '.part.json').write_text(
        json.dumps({'etag': etag, 'size': len(blob), 'part_size': 500_000, 'done': [0, 1]})
    )
    ranges = _ranges(client)
    s3.download('s3://public-data/again/blob.bin', out, anonymous=True, client=client, part_size=500_000, concurrency=1,
                progress=False)
    assert out.read_bytes() == blob
    assert ranges == [f'bytes={lo}-{lo + 499_999}' for lo in range(1_000_000, len(blob), 500_000)]
    # a .part of another version of the object (its ETag differs) is not reused
    Path(str(out) + '.part').write_bytes(bytes(len(blob)))
    Path(str(out) + '.part.json').write_text(
        json.dumps({'etag': '"0"', 'size': len(blob), 'part_size': 500_000, 'done': [0, 1, 2, 3, 4, 5]})
    )
    out.unlink()
    assert (
        s3.download('s3://public-data/again/blob.bin', out, anonymous=True, client=client, part_size=500_000,
                    progress=False).read_bytes()
        == blob
    )


def test_checksum_mismatch_is_one_line_and_keeps_no_final_file(tmp_path, endpoint, blob):
    s3.upload(tmp_path / 'blob.bin', 's3://private-data/sum/blob.bin', endpoint_url=endpoint, progress=False)
    with pytest.raises(DataError) as e:
        s3.download('s3://private-data/sum/blob.bin', tmp_path / 'out' / 'blob.bin', sha256='00' * 32,
                    endpoint_url=endpoint, progress=False)
    assert '\n' not in str(e.value) and 'SHA-256' in str(e.value) and 'blob.bin.part.bad' in str(e.value)
    assert not (tmp_path / 'out' / 'blob.bin').exists()
    # bytes changed on the way (the object's recorded SHA-256 no longer matches): caught without a caller's checksum
    c = s3.s3_client(endpoint_url=endpoint)
    c.put_object(Bucket='private-data', Key='sum/tampered.bin', Body=blob[:-1] + b'!',
                 Metadata={'sha256': hashlib.sha256(blob).hexdigest()})
    with pytest.raises(DataError, match=r'tampered.bin: SHA-256 [0-9a-f]{64} ≠ expected'):
        s3.download('s3://private-data/sum/tampered.bin', tmp_path / 'out' / 't.bin', endpoint_url=endpoint,
                    progress=False)


def test_missing_bucket_and_object_are_one_line(tmp_path, endpoint, blob):
    for fn in (
        lambda: s3.download('s3://no-such-bucket/a.tar', tmp_path / 'a.tar', endpoint_url=endpoint, progress=False),
        lambda: s3.upload(tmp_path / 'blob.bin', 's3://no-such-bucket/a.bin', endpoint_url=endpoint, progress=False),
        lambda: s3.sync('s3://no-such-bucket/data/*', tmp_path / 'x', endpoint_url=endpoint, progress=False),
    ):
        with pytest.raises(DataError) as e: fn()
        assert str(e.value).startswith('s3://no-such-bucket: no such bucket') and '\n' not in str(e.value), str(e.value)
    with pytest.raises(DataError, match=r'^s3://public-data/nope.bin: no such object'):
        s3.download('s3://public-data/nope.bin', tmp_path / 'n', anonymous=True, endpoint_url=endpoint, progress=False)


@pytest.mark.parametrize('use_s5cmd', [False, True])
def test_sync_a_pattern_like_seed_1(tmp_path, endpoint, use_s5cmd):
    if use_s5cmd and not shutil.which('s5cmd'): pytest.skip('s5cmd is not installed')
    c = s3.s3_client(endpoint_url=endpoint)
    files = {f'my-gpt3_{i:02d}_text_document.{ext}': os.urandom(1000 + i) for i in range(3) for ext in ('bin', 'idx')}
    for name, b in files.items(): c.put_object(Bucket='public-data', Key=f'the_pile_gpt3/{name}', Body=b)
    got = s3.sync('s3://public-data/the_pile_gpt3/*.idx', tmp_path / 'pile', anonymous=True, endpoint_url=endpoint,
                  use_s5cmd=use_s5cmd, progress=False)
    assert sorted(p.name for p in got) == sorted(n for n in files if n.endswith('.idx'))
    assert all(p.read_bytes() == files[p.name] for p in got) and not list((tmp_path / 'pile').glob('*.bin'))
    (tmp_path / 'pile' / 'my-gpt3_00_text_document.idx').write_bytes(b'x')       # a wrong copy is replaced
    if not use_s5cmd:
        s3.sync('s3://public-data/the_pile_gpt3/*', tmp_path / 'pile', anonymous=True, endpoint_url=endpoint,
                use_s5cmd=False, progress=False)
    else:
        s3.sync('s3://public-data/the_pile_gpt3/*', tmp_path / 'pile', anonymous=True, endpoint_url=endpoint,
                use_s5cmd=True, progress=False)
    assert {p.name: p.read_bytes() for p in (tmp_path / 'pile').iterdir()} == files


def test_command_line_like_the_seeds(tmp_path, endpoint, blob):
    "`python -m nxpretrain.data.s3 cp … --no-sign-request`, as seed 3 runs `aws s3 cp`; errors are one line and exit 2."
    import subprocess, sys
    run = lambda *a: subprocess.run(
        [sys.executable, '-m', 'nxpretrain.data.s3', *a, '--endpoint-url', endpoint, '--no-progress'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    up = run('cp', str(tmp_path / 'blob.bin'), 's3://public-data/cli/blob.bin')
    assert up.returncode == 0, up.stderr
    (tmp_path / 'dl').mkdir()
    down = run('cp', 's3://public-data/cli/blob.bin', str(tmp_path / 'dl'), '--no-sign-request')
    assert down.returncode == 0 and (tmp_path / 'dl' / 'blob.bin').read_bytes() == blob, down.stderr
    assert (
        f"{len(blob)}  s3://public-data/cli/blob.bin" in run('ls', 's3://public-data/cli/', '--no-sign-request').stdout
    )
    bad = run('cp', 's3://no-such-bucket/x.tar', str(tmp_path / 'dl'), '--no-sign-request')
    assert bad.returncode == 2 and bad.stderr.strip().count('\n') == 0 and 'no such bucket' in bad.stderr


def test_sync_checks_a_sha256_manifest_and_fetch_file_takes_s3(tmp_path, endpoint, monkeypatch):
    from nxpretrain.data.download import fetch_file
    c = s3.s3_client(endpoint_url=endpoint)
    files = {'a.bin': os.urandom(5000), 'b.bin': os.urandom(7000)}
    for name, b in files.items(): c.put_object(Bucket='public-data', Key=f'manifest/{name}', Body=b)
    good = {n: hashlib.sha256(b).hexdigest() for n, b in files.items()}
    got = s3.sync('s3://public-data/manifest/', tmp_path / 'ok', anonymous=True, endpoint_url=endpoint, sha256=good,
                  use_s5cmd=False, progress=False)
    assert {p.name: p.read_bytes() for p in got} == files
    with pytest.raises(DataError) as e:
        s3.sync('s3://public-data/manifest/', tmp_path / 'bad', anonymous=True, endpoint_url=endpoint,
                sha256={**good, 'b.bin': 'ab' * 32}, use_s5cmd=False, progress=False)
    assert str(e.value).startswith('s3://public-data/manifest/b.bin: SHA-256') and '\n' not in str(e.value)
    monkeypatch.setenv('AWS_ENDPOINT_URL', endpoint)           # fetch_file's s3:// addresses: anonymous, like the seeds
    p = fetch_file('s3://public-data/manifest/a.bin', tmp_path / 'f' / 'a.bin', sha256=good['a.bin'], progress=False)
    assert p.read_bytes() == files['a.bin']


def test_data_stage_uses_ready_pairs_from_s3_as_they_are(tmp_path, endpoint):
    "`papermill nbs/01_data.ipynb -p source 's3://…/*' -p no_sign_request True`: seed 1's way, nothing tokenised again."
    import subprocess, sys
    from nxpretrain.data.prepare import prepare_demo
    prefix, _ = prepare_demo(tmp_path / 'made')
    c = s3.s3_client(endpoint_url=endpoint)
    for ext in ('bin', 'idx'):
        c.upload_file(f'{prefix}.{ext}', 'public-data', f'stage/the_pile_gpt3/my-gpt3_00_text_document.{ext}')
    out = tmp_path / 'data'
    (out / 'demo').mkdir(parents=True)
    (out / 'demo' / 'tokenizer.json').symlink_to(tmp_path / 'made' / 'demo' / 'tokenizer.json')
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run(
        [sys.executable, '-m', 'papermill', str(root / 'nbs' / '01_data.ipynb'), str(tmp_path / 'out.ipynb'), '-k',
         'python3', '-p', 'corpus', 'the_pile_gpt3', '-p', 'tokenizer', 'demo', '-p', 'output', str(out), '-p',
         'source', 's3://public-data/stage/the_pile_gpt3/*', '-p', 'no_sign_request', 'True'],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, 'AWS_ENDPOINT_URL': endpoint, 'PYTHONPATH': str(root)},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    got = out / 'the_pile_gpt3' / 'my-gpt3_00_text_document'
    assert all(Path(f'{got}.{ext}').read_bytes() == Path(f'{prefix}.{ext}').read_bytes() for ext in ('bin', 'idx'))
    assert not (out / 'the_pile_gpt3' / 'manifest.d').exists()                    # nothing was tokenised
