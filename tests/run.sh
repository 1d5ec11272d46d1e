#!/usr/bin/env bash
# tests/run.sh BUILD_DIR — run every test binary of one build and print a
# closing line "N passed, M failed" counting test binaries' cmocka cases.
set -u
dir=$1
export MNEMO_BIN="$PWD/$dir/mnemo"
export MNEMO_DATA="${MNEMO_DATA:-$PWD/../shared/data}"
passed=0; failed=0; failed_names=()
# MNEMO_TESTS, when set, names the tests to run (default: every test_* binary)
for t in "$dir"/tests/test_*; do
  [ -x "$t" ] || continue
  case "$t" in *.d|*.log) continue;; esac
  name=$(basename "$t")
  if [ -n "${MNEMO_TESTS:-}" ] && [[ " $MNEMO_TESTS " != *" $name "* ]]; then continue; fi
  log="$dir/tests/$name.log"
  if "$t" >"$log" 2>&1; then rc=0; else rc=$?; fi
  p=$(grep -c '^\[       OK \]' "$log" || true)
  # cmocka names a failed case twice (when it fails, and in the summary)
  f=$(grep '^\[  FAILED  \] [a-z_]' "$log" | sort -u | wc -l)
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$rc" -ne 0 ]; then
    [ "$f" -eq 0 ] && failed=$((failed + 1))
    failed_names+=("$name")
    echo "---- $name failed (exit $rc); its output:"; tail -40 "$log"
  else
    echo "ok   $name ($p cases)"
  fi
done
echo "$dir: ${passed} passed, ${failed} failed"
[ ${#failed_names[@]} -eq 0 ]
