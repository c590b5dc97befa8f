"""S3 transfers side by side against the same local S3 server (moto's, started here): our download and upload against
boto3's managed transfer (what `aws s3 cp` runs) and s5cmd (seed 1's tool), on one object.

  python bench/bench_s3.py [--mb 128] [--repeat 2]

The server is a single Python process, so absolute speeds are the server's; the ratios say whether our checks (ETag
pinning, per-part records, SHA-256 after the download) cost anything against the tools the seeds use on the same wire.
Best of `--repeat` rounds for each side.
"""
import argparse, hashlib, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'tests'))


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--mb', type=int, default=128)
    ap.add_argument('--repeat', type=int, default=2)
    a = ap.parse_args()
    from nxpretrain.data import s3
    from s3_helpers import s3_server
    from boto3.s3.transfer import TransferConfig
    work = Path(tempfile.mkdtemp(prefix='s3bench-'))
    src = work / 'blob.bin'
    src.write_bytes(os.urandom(a.mb << 20))
    rows = []
    with s3_server() as endpoint:
        client = s3.s3_client(endpoint_url=endpoint)
        client.create_bucket(Bucket='bench')
        url = 's3://bench/blob.bin'
        def ours_down():
            out = work / 'ours.bin'
            out.unlink(missing_ok=True)
            s3.download(url, out, endpoint_url=endpoint, progress=False, client=client)
        def boto_down():
            client.download_file('bench', 'blob.bin', str(work / 'boto.bin'), Config=TransferConfig())
        def s5_down():
            subprocess.run(['s5cmd', '--endpoint-url', endpoint, 'cp', url, str(work / 's5.bin')], check=True,
                           capture_output=True)
        up = {
            'ours': lambda: s3.upload(src, url, endpoint_url=endpoint, progress=False, client=client),
            'boto3 upload_file': lambda: client.upload_file(str(src), 'bench', 'blob.bin', Config=TransferConfig()),
            's5cmd cp': lambda: subprocess.run(
                ['s5cmd', '--endpoint-url', endpoint, 'cp', str(src), url], check=True, capture_output=True
            ),
        }
        down = {'ours': ours_down, 'boto3 download_file': boto_down, 's5cmd cp': s5_down}
        if not shutil.which('s5cmd'):
            up.pop('s5cmd cp')
            down.pop('s5cmd cp')
        for kind, sides in (('upload', up), ('download', down)):
            if kind == 'download': s3.upload(src, url, endpoint_url=endpoint, progress=False, client=client)
            t = {name: best(fn, a.repeat) for name, fn in sides.items()}
            for name, sec in t.items(): rows.append((kind, name, a.mb / sec, t['ours'] / sec))
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        assert all(
            hashlib.sha256(p.read_bytes()).hexdigest() == digest for p in work.glob('*.bin') if p.name != 'blob.bin'
        )
    shutil.rmtree(work)
    print(f"{a.mb} MiB object, local S3 server (moto), best of {a.repeat}; CPU: {os.cpu_count()} cores")
    print(f"{'':9}{'side':22}{'MiB/s':>9}{'their speed / ours':>20}")
    for kind, name, mbs, ratio in rows: print(f"{kind:9}{name:22}{mbs:9.1f}{ratio:20.2f}")


if __name__ == '__main__': main()
