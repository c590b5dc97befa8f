"""`nxpretrain train` shows progress that fits where it goes: redirected to a file, as a Slurm job's output is, the log
holds the step lines and not one carriage return (no progress-bar redraws, of the trainer or of the data stage that
tokenises the demo corpus first); on a terminal the live line redraws itself."""
import fcntl, os, pty, re, select, struct, subprocess, sys, termios, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NXPRETRAIN = [sys.executable, '-c', 'import sys; from nxpretrain.cli import main; sys.exit(main())']
TRAIN = ['train', 'gpt3_tiny', '--max-steps', '20', 'trainer.log_every=5', 'trainer.eval_every=0',
         'trainer.save_every=0', 'trainer.threads=1']
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS='1')


def test_a_redirected_log_holds_no_carriage_returns(tmp_path):
    command = ' '.join(map(repr, NXPRETRAIN + TRAIN)) + ' > train.log 2>&1'   # as typed: the shell redirects
    r = subprocess.run(command, shell=True, cwd=tmp_path, env=ENV, timeout=300)
    log = (tmp_path / 'train.log').read_bytes().decode()   # bytes: reading text would turn a lone \r into \n
    assert r.returncode == 0, log
    assert '\r' not in log, [line for line in log.split('\n') if '\r' in line][:3]
    assert (tmp_path / 'runs' / 'data').is_dir()   # the demo corpus was tokenised here first, its bar silent too
    assert re.findall(r'^step (\d+)/20 \| loss', log, re.M) == ['5', '10', '15', '20'], log


def read_terminal(fd: int, proc: subprocess.Popen, timeout: float = 300) -> str:
    "All that `proc` writes to the terminal whose controlling side is `fd`, until it exits."
    out, end = b'', time.time() + timeout
    while time.time() < end:
        if select.select([fd], [], [], 1)[0]:
            try: chunk = os.read(fd, 65536)
            except OSError: break    # EIO: the last writer closed the terminal
            if not chunk: break
            out += chunk
        elif proc.poll() is not None: break
    proc.wait(timeout=10)
    return out.decode(errors='replace')


def test_a_terminal_gets_the_live_line(tmp_path):
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 120, 0, 0))   # a window: 24 rows of 120
    proc = subprocess.Popen(NXPRETRAIN + TRAIN, cwd=tmp_path, env=ENV, stdin=terminal, stdout=terminal,
                            stderr=terminal)
    os.close(terminal)
    try: shown = read_terminal(controller, proc)
    finally: os.close(controller)
    assert proc.returncode == 0, shown
    redraws = re.findall(r'\r(?!\n)', shown)   # a terminal ends its lines with \r\n: a lone \r redraws the line
    assert len(redraws) >= 2 and '20/20' in shown, shown[-2000:]
