#!/usr/bin/env bash
# Print the commit of this working tree, for the env.txt of a GPU run:
#   * `git rev-parse HEAD` when this tree is a git checkout (its own top level, not some
#     repository around a copy), with "-dirty" appended when `git status --porcelain`
#     lists anything (modified or untracked files: the measured code is not that commit);
#   * else $REQUANT_COMMIT (the GPU machine gets a copy of the working tree without .git:
#     pass REQUANT_COMMIT=$(bash benchmarks/commit_id.sh) along with it);
#   * else the word "unknown". Never the word HEAD.
cd "$(dirname "$0")/.." || exit 1
here=$(pwd -P)
top=$(git rev-parse --show-toplevel 2>/dev/null) || top=""
if [ -n "$top" ] && [ "$(cd "$top" && pwd -P)" = "$here" ] \
        && c=$(git rev-parse --verify -q HEAD 2>/dev/null) && [[ $c =~ ^[0-9a-f]{40}$ ]]; then
    if [ -n "$(git status --porcelain 2>/dev/null)" ]; then
        c="$c-dirty"
    fi
    echo "$c"
elif [ -n "${REQUANT_COMMIT:-}" ]; then
    echo "$REQUANT_COMMIT"
else
    echo unknown
fi
