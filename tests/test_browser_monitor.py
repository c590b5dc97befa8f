"""05_monitor as a person uses it in JupyterLab (Debian's Chromium through Selenium, as in test_browser.py): a real
training job runs on this machine; the notebook's parameters name it; Run All returns – the kernel is idle – while
the job's status table keeps redrawing in the background with new steps; cancelled, the view ends on the job's final
state."""
import os, re, shutil, time
import pytest
from test_browser import (ROOT, browser, click_menu, shot, wait_for, why_no_browser,  # noqa: F401 (browser: a fixture)
                          open_notebook, add_parameters, all_cells_ran, kernel_status, serve_lab)
from selenium.webdriver.common.by import By

pytestmark = pytest.mark.timeout(420)
STEPS = ['data.corpus=synthetic', 'model.n_layers=1', 'model.hidden=32', 'model.n_heads=2', 'model.seq_len=16',
         'data.micro_batch=2', 'data.global_batch=2', 'trainer.threads=1', 'trainer.log_every=1',
         'trainer.eval_every=0', 'trainer.save_every=0', 'trainer.save_every_minutes=0', 'trainer.max_steps=100000']


@pytest.fixture
def lab_and_job(tmp_path):
    """JupyterLab serving a copy of 05_monitor, and a long training job of this machine both it and the test see; (url,
    token, job id, out_dir)."""
    if why := why_no_browser(): pytest.skip(why)
    from nxpretrain.launch.job import make_job
    from nxpretrain.launch.local import LocalLauncher
    shutil.copy(ROOT / 'nbs/05_monitor.ipynb', tmp_path / '05_monitor.ipynb')
    env = {**os.environ, 'PYTHONPATH': str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''),
           'NXPRETRAIN_HOME': str(tmp_path / 'home')}
    env.pop('IN_TEST', None)
    old = {k: os.environ.get(k) for k in ('NXPRETRAIN_HOME', 'PYTHONPATH')}
    os.environ.update({k: env[k] for k in old})
    ln = LocalLauncher()
    job = make_job('gpt3_tiny', 'local', tmp_path / 'job', overrides=STEPS, scheduler='local')
    jid = ln.submit(job)
    try:
        with serve_lab(tmp_path, env) as (url, token):
            yield url, token, jid, tmp_path / 'job', ln
    finally:
        ln.cancel(jid)
        for k, v in old.items():
            if v is None: os.environ.pop(k, None)
            else: os.environ[k] = v


ROW = "//div[contains(@class,'jp-OutputArea')]//table//tr[td[contains(., 'local:')]]"


def status_row(d) -> str:
    "The text of the job status table's data row in the notebook's outputs, or ''."
    rows = d.find_elements(By.XPATH, ROW)
    return rows[0].text if rows else ''


def shot_table(d, name: str):
    "A screenshot with the job's status table in view."
    if rows := d.find_elements(By.XPATH, ROW):
        d.execute_script('arguments[0].scrollIntoView({block: "start"})', rows[0])
    shot(d, name)


def test_05_monitor_redraws_a_running_job_while_the_kernel_is_idle(lab_and_job, browser):
    url, token, jid, out_dir, ln = lab_and_job
    d = browser
    open_notebook(d, url, token, '05_monitor.ipynb')
    add_parameters(d, f"job = '{jid}'", f"out_dir = '{out_dir}'")
    click_menu(d, 'Run', 'Run All Cells')
    assert wait_for(lambda: all_cells_ran(d) and (time.sleep(1) or all_cells_ran(d)), 180), (
        'not every cell of 05_monitor ran'
    )
    step = lambda: (m := re.search(r'RUNNING.*?\b(\d+)/100000', status_row(d))) and int(m.group(1))
    first = wait_for(step, 30, 0.25)
    assert first, f'no running status row: {status_row(d)!r}'
    shot_table(d, '05_monitor-first.png')
    # the kernel is idle (every cell ran) and the view still moves: redrawn in the background
    later = wait_for(lambda: (s := step()) and s > first and 'Idle' in kernel_status(d) and s, 60, 0.5)
    assert later, f'the status stayed at step {first} (kernel: {kernel_status(d)})'
    shot_table(d, '05_monitor-redrawn.png')
    assert ln.status(jid).state.name == 'RUNNING'
    ln.cancel(jid)
    end = wait_for(lambda: re.search(r'\b(CANCELLED|FAILED|COMPLETED)\b', status_row(d)), 60, 0.5)
    shot_table(d, '05_monitor-ended.png')
    assert end, status_row(d)
    assert str(ln.status(jid).state) == end.group(1), (ln.status(jid), end.group(0))
    outputs = ' '.join(e.text for e in d.find_elements(By.CSS_SELECTOR, '.jp-OutputArea'))
    assert 'watching job' not in outputs, outputs[-2000:]        # the background redraw never failed
    assert not d.find_elements(By.CSS_SELECTOR, '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]')
    assert d.find_elements(By.CSS_SELECTOR, '.jp-OutputArea .jp-RenderedImage img'), 'no curves image'
