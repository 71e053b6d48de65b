#!/usr/bin/env bash
# Formatting and script checks: clang-format (the repository's .clang-format) on every C++ file,
# bash -n and shellcheck on every script. Exits non-zero on any finding.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
cd "$ROOT"

mapfile -t sources < <(git ls-files '*.cpp' '*.h')
clang-format --dry-run --Werror "${sources[@]}"
mapfile -t scripts < <(git ls-files 'scripts/*.sh' 'examples/*.sh' '.ci/run')
for script in "${scripts[@]}"; do bash -n "$script"; done
shellcheck -x --source-path=SCRIPTDIR "${scripts[@]}"
echo "lint.sh: ${#sources[@]} C++ files formatted, ${#scripts[@]} scripts clean"
