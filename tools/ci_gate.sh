#!/usr/bin/env bash
# The CI gate: notebooks clean, library in sync with them, README in sync with nbs/index.ipynb, every notebook's tests,
# then pytest (which builds the docs site and opens it in headless Chromium). Installs nothing: tools/test.sh does.
#
#   bash tools/ci_gate.sh                 # every step
#   bash tools/ci_gate.sh clean sync      # some steps: clean sync lint readme nbtest pytest
#
# Every step runs even after one fails, so one run names every problem; the exit status is non-zero if any failed.
# Environment: NXP_TEST_WORKERS (nbdev-test workers, default 2), NXP_TEST_FLAGS (e.g. "slow"), NXP_PYTEST_WORKERS
# (pytest-xdist workers, default 2; 0 runs pytest in one process), NXP_PYTEST_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.."

# Every step, and every process it starts (papermill kernels, test subprocesses), imports this checkout's package.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(clean sync lint readme nbtest pytest)
declare -a results=()
failed=0

say() { printf '%s\n' "$*"; }

# What nbdev writes – the notebooks, the package (new modules and _modidx.py too) and the README – as git sees it, with a
# content hash per file, so that a step's own changes show even in a tree that was already dirty. Only those paths:
# a virtual environment or run folder in the clone is neither scanned (minutes) nor mistaken for a change.
NBDEV_PATHS=(nbs nxpretrain README.md)
tree_state() {
  git status --porcelain=v1 --untracked-files=all -- "${NBDEV_PATHS[@]}" | while IFS= read -r line; do
    f=${line:3}; f=${f#\"}; f=${f%\"}
    say "$line $(git hash-object -- "$f" 2>/dev/null || echo gone)"
  done
}

# Run "$@" and fail, naming the files, if it changed anything git tracks or would track.
unchanged_by() {
  local what=$1 fix=$2; shift 2
  local before after changed
  before=$(tree_state)
  if ! "$@"; then say "FAIL: $what: '$*' itself failed"; return 1; fi
  after=$(tree_state)
  changed=$(diff <(printf '%s\n' "$before") <(printf '%s\n' "$after") | sed -n 's/^> \(..\) \(.*\) [0-9a-f]*$/\1 \2/p; s/^> \(..\) \(.*\) gone$/\1 \2/p' | sort -u)
  if [ -n "$changed" ]; then
    say "FAIL: $what – these files change:"
    printf '%s\n' "$changed" | sed 's/^??/new/; s/^ M/modified/; s/^M /modified/; s/^ D/deleted/; s/^/    /'
    say "  fix: $fix"
    return 1
  fi
}

step_clean() {
  unchanged_by "notebooks are not clean (nbdev-clean changes them)" \
    "run nbdev-clean, then commit the notebooks" nbdev-clean
}

step_sync() {
  unchanged_by "the library is out of sync with the notebooks (nbdev-export changes it)" \
    "run nbdev-export, then git add nxpretrain/ and commit (new modules too)" nbdev-export
}

# Lines a reader can scan: ruff (pyproject.toml [tool.ruff]) over the package, the notebooks it comes from, the tests,
# the benchmarks and the tools. The package is generated: a line is fixed in its notebook.
step_lint() {
  if ! ruff check nxpretrain nbs tests bench tools; then
    say "FAIL: lint – the lines above are over 120 characters or hold two statements; fix them (in nbs/ for nxpretrain/)"
    return 1
  fi
}

step_readme() {
  python3 tools/docs.py readme --check
}

# Every notebook runs: the API notebooks as nbdev-test runs them, the stage notebooks through papermill with the docs
# site's CPU parameters. The executions are cached in _exec/ (by content), so the docs build in pytest reuses them.
step_nbtest() {
  local args=(--workers "${NXP_TEST_WORKERS:-2}")
  [ -n "${NXP_TEST_FLAGS:-}" ] && args+=(--flags "$NXP_TEST_FLAGS")
  if ! python3 tools/docs.py execute "${args[@]}"; then
    say "FAIL: notebooks – the notebook(s) named above failed; nbdev-test --file-glob NAME.ipynb repeats one"
    return 1
  fi
}

step_pytest() {
  local rc
  # shellcheck disable=SC2086
  # --durations: the slowest tests, so the gate's time can be read from its own log. Two xdist workers, a test file (or
  # the files sharing a local Slurm, or Chromium) to each in turn: tests/conftest.py names the groups.
  local workers=(-n "${NXP_PYTEST_WORKERS:-2}" --dist loadgroup)
  [ "${NXP_PYTEST_WORKERS:-2}" = 0 ] && workers=()
  python3 -m pytest -q --durations=40 "${workers[@]}" tests ${NXP_PYTEST_ARGS:-}; rc=$?
  if [ $rc -eq 5 ]; then say "pytest: no tests collected under tests/ (not a failure: nbdev-test ran the notebooks)"; return 0; fi
  [ $rc -ne 0 ] && say "FAIL: pytest exited $rc – the failing tests are listed above"
  return $rc
}

for s in "${steps[@]}"; do
  if ! declare -F "step_$s" >/dev/null; then say "ci_gate: unknown step '$s'; steps: clean sync lint readme nbtest pytest"; exit 2; fi
  say ""; say "== $s"
  start=$SECONDS
  if "step_$s"; then results+=("ok      $s ($((SECONDS - start)) s)")
  else results+=("FAILED  $s ($((SECONDS - start)) s)"); failed=$((failed + 1)); fi
done

say ""; say "== CI gate summary"
printf '  %s\n' "${results[@]}"
say "gate: $(( ${#steps[@]} - failed )) passed, $failed failed"
[ $failed -eq 0 ]
