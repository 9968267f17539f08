#!/usr/bin/env bash
# swift-format over the Swift sources, with the repository's .swift-format (4-space indent,
# 160 columns, and off the rules that would rewrite the house style: `a; b` on one line,
# `case let .x(a, b)`, several names in one `let`, several enum cases on one line, numbers
# without `_` groups, C names such as LLVMFuzzerRunDriver, inline `/* */` comments), and two
# rules that `swift format` reports but cannot fix (OnlyOneTrailingClosureArgument,
# ReplaceForEachWithForLoop), so that `--fix` leaves nothing to do by hand.
#
#   scripts/lint.sh          report every difference; exits non-zero on any (--strict)
#   scripts/lint.sh --fix    rewrite the files in place (swift format -i), then lint
#
# The generated Sources/QueueAPI/OpenAPIDocument.swift opts out (swift-format-ignore-file).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
paths=(Sources Tests Package.swift)
if [ "${1:-}" = "--fix" ]; then
    swift format format --in-place --parallel --recursive "${paths[@]}"
elif [ $# -gt 0 ]; then
    echo "usage: $0 [--fix]" >&2
    exit 2
fi
exec swift format lint --strict --parallel --recursive "${paths[@]}"
