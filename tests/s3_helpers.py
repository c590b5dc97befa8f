"""Local S3 for the tests: moto's server on a free port, and a TCP proxy that cuts one transfer short (a broken
download)."""
import contextlib, json, logging, os, socket, threading


@contextlib.contextmanager
def s3_server():
    """Start moto's S3 server on 127.0.0.1; yields its endpoint URL with test credentials in the environment; stops it
    after."""
    from moto.server import ThreadedMotoServer
    logging.getLogger('werkzeug').setLevel(logging.ERROR)
    srv = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)
    srv.start()
    keys = dict(AWS_ACCESS_KEY_ID='local-key', AWS_SECRET_ACCESS_KEY='local-secret', AWS_DEFAULT_REGION='us-east-1')
    old = {k: os.environ.get(k) for k in [*keys, 'AWS_ENDPOINT_URL']}
    os.environ.update(keys)
    os.environ.pop('AWS_ENDPOINT_URL', None)
    try: yield f"http://127.0.0.1:{srv._server.server_port}"
    finally:
        srv.stop()
        for k, v in old.items():
            if v is None: os.environ.pop(k, None)
            else: os.environ[k] = v


def make_public(client, bucket):
    "A bucket policy letting anyone list and read `bucket` (as the seeds' public buckets do)."
    # moto checks HEAD against an action of its own, s3:HeadObject (AWS checks s3:GetObject): allow both
    client.put_bucket_policy(
        Bucket=bucket,
        Policy=json.dumps(
            {
                'Version': '2012-10-17',
                'Statement': [
                    {'Effect': 'Allow', 'Principal': '*', 'Action': ['s3:GetObject', 's3:HeadObject'],
                     'Resource': f'arn:aws:s3:::{bucket}/*'},
                    {'Effect': 'Allow', 'Principal': '*', 'Action': 's3:ListBucket',
                     'Resource': f'arn:aws:s3:::{bucket}'},
                ],
            }
        ),
    )


class CuttingProxy:
    "TCP proxy to `upstream` (host, port) that closes the first connection to bring more than `cut_after` bytes, there."
    def __init__(self, upstream, cut_after: int):
        self.upstream, self.cut_after, self.cuts, self.lock = upstream, cut_after, 0, threading.Lock()
        self.sock = socket.create_server(('127.0.0.1', 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try: client, _ = self.sock.accept()
            except OSError: return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        server = socket.create_connection(self.upstream)
        def pump(src, dst, counting):
            sent = 0
            try:
                while data := src.recv(65536):
                    if counting and sent + len(data) > self.cut_after:
                        with self.lock:
                            cut = self.cuts == 0
                            self.cuts += cut
                        if cut:
                            dst.sendall(data[:self.cut_after - sent])
                            break
                    dst.sendall(data)
                    sent += len(data)
            except OSError: pass
            for s in (src, dst):
                with contextlib.suppress(OSError): s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError): s.close()
        threading.Thread(target=pump, args=(client, server, False), daemon=True).start()
        pump(server, client, True)

    def close(self): self.sock.close()
