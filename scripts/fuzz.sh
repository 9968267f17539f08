#!/usr/bin/env bash
# Builds every fuzz target (Sources/fuzz-<name>/, product fuzz-<name>) with libFuzzer and
# AddressSanitizer and runs each for SECONDS over its seed corpus Fuzz/corpus/<name>/.
#
#   scripts/fuzz.sh [SECONDS=60] [--merge] [--only NAME] [--debug]
#
# Builds -c release by default (about twice the executions per second; overflow and
# precondition traps stay on); --debug builds -c debug (slower, but keeps the runtime
# exclusivity checks that release drops in QueueEngine).
#
# New inputs go to .build-fuzz/work/<name>/ (not into git); with --merge the ones that add
# coverage are minimised into Fuzz/corpus/<name>/ afterwards. Crash, leak, timeout and OOM
# artefacts go to Fuzz/crashes/<name>/ (git-ignored); the script exits non-zero if any new one
# appears or a fuzzer fails. Known reproducers in Fuzz/regressions/<name>/ are replayed
# first; one that traps again fails the run.
#
# Options passed to every fuzzer: -max_len=4096 (requests are small; longer inputs only slow
# it down), -rss_limit_mb=2048, -timeout=10 (a single input taking longer is a finding),
# -detect_leaks=0: the Swift runtime's metadata and conformance caches, libcurl's global
# state and the dispatch queues the kinds keep are allocated once per process and never
# freed, which LeakSanitizer reports at exit although nothing grows per input.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/opt/swift/usr/bin:$PATH
# The Swift backtracer would attach to a crashing fuzzer and wait; libFuzzer and ASan report.
export SWIFT_BACKTRACE=enable=no

seconds=60
config=release
merge=0
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --merge) merge=1 ;;
    --only) only="$2"; shift ;;
    --debug) config=debug ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) seconds="$1" ;;
  esac
  shift
done

scratch=.build-fuzz
names=()
for dir in Sources/fuzz-*/; do
  [ -d "$dir" ] || continue
  name="${dir#Sources/fuzz-}"; name="${name%/}"
  if [ -n "$only" ] && [ "$name" != "$only" ]; then continue; fi
  names+=("$name")
done
if [ ${#names[@]} -eq 0 ]; then echo "fuzz.sh: no Sources/fuzz-*/ targets" >&2; exit 2; fi

for name in "${names[@]}"; do
  echo "== building fuzz-$name"
  swift build -c "$config" --product "fuzz-$name" --scratch-path "$scratch" \
    -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING
done
bin="$(swift build -c "$config" --scratch-path "$scratch" --show-bin-path)"

status=0
summary=()
for name in "${names[@]}"; do
  fuzzer="$bin/fuzz-$name"
  corpus="Fuzz/corpus/$name"
  work="$scratch/work/$name"
  crashes="Fuzz/crashes/$name"
  mkdir -p "$corpus" "$work" "$crashes"

  # Every past finding is replayed first: one that traps again fails the run.
  regressions="Fuzz/regressions/$name"
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
    open=0
    for f in "$regressions"/*; do
      if ! ASAN_OPTIONS=detect_leaks=0 "$fuzzer" -runs=1 "$f" >/dev/null 2>&1; then
        echo "   regression traps again: $f"
        open=$((open + 1))
      fi
    done
    echo "== fuzz-$name: $(ls "$regressions" | wc -l) regression input(s) replayed, $open trap"
    [ $open -eq 0 ] || status=1
  fi

  before=$(ls "$crashes" | sort)
  dict=()
  [ -f "Fuzz/$name.dict" ] && dict=(-dict="Fuzz/$name.dict")
  log="$scratch/work/$name.log"
  echo "== fuzzing fuzz-$name for ${seconds}s (log $log)"
  set +e
  ASAN_OPTIONS="detect_leaks=0:${ASAN_OPTIONS:-}" "$fuzzer" "$work" "$corpus" "${dict[@]}" \
    -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$crashes/" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  new=$(comm -13 <(echo "$before") <(ls "$crashes" | sort) | grep -E '^(crash|leak|timeout|oom|slow-unit)-' || true)
  line="fuzz-$name: ${execs:-?} executions, ${rate:-?} exec/s, exit $rc"
  if [ -n "$new" ] || [ $rc -ne 0 ]; then
    status=1
    line="$line, FAILED"
    for f in $new; do line="$line
    $crashes/$f"; done
    grep -m1 -E 'ERROR: (libFuzzer|AddressSanitizer)|Fatal error|runtime failure' "$log" | sed 's/^/    /' || true
    grep -m3 -E 'in \$s.* /work|\.swift:[0-9]+' "$log" | head -3 | sed 's/^/    /' || true
  fi
  summary+=("$line")

  if [ $merge -eq 1 ]; then
    echo "== merging new coverage of fuzz-$name into $corpus"
    ASAN_OPTIONS=detect_leaks=0 "$fuzzer" -merge=1 -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
      "$corpus" "$work" >"$scratch/work/$name.merge.log" 2>&1 || { echo "merge failed: see $scratch/work/$name.merge.log"; status=1; }
  fi
done

echo
echo "== summary"
for s in "${summary[@]}"; do echo "$s"; done
exit $status
