#!/usr/bin/env bash
# Print the commit of this working tree, for the env.txt of a GPU run (the same rule as
# requant.evidence.buildinfo.git_commit, which the reports use):
#   * $REQUANT_COMMIT when it is a commit id (7 to 64 lowercase hex, optionally "-dirty"):
#     the GPU machine gets a copy of the working tree, sometimes with a stale .git beside it
#     (it once named an older commit and called the copy dirty), so a declared commit wins;
#     pass REQUANT_COMMIT=$(bash benchmarks/commit_id.sh) along with the copy (unset it
#     first where an old value may be exported);
#   * else `git rev-parse HEAD` when this tree is a git checkout (its own top level, not some
#     repository around a copy), with "-dirty" appended when `git status --porcelain`
#     lists anything (modified or untracked files: the measured code is not that commit);
#   * else the word "unknown". Never the word HEAD.
#
# `commit_id.sh --tree` prints the git tree id of this working tree's content instead: every file
# that is not ignored by .gitignore, as it is on disk, hashed in a throwaway repository (never the
# copy's own .git). It names the measured code even where .git is stale or absent: on a clean
# checkout it is `git rev-parse HEAD^{tree}`, and `git log --format='%H %T' | grep TREE` finds the
# commit whose content it is. "unknown" without git.
cd "$(dirname "$0")/.." || exit 1
here=$(pwd -P)
if [ "${1:-}" = "--tree" ]; then
    scratch=$(mktemp -d) || exit 1
    if git init -q --bare "$scratch" 2>/dev/null \
            && GIT_DIR="$scratch" GIT_WORK_TREE="$here" git add -A . 2>/dev/null \
            && t=$(GIT_DIR="$scratch" git write-tree 2>/dev/null) && [[ $t =~ ^[0-9a-f]{40}$ ]]; then
        echo "$t"
    else
        echo unknown
    fi
    rm -rf "$scratch"
    exit 0
fi
top=$(git rev-parse --show-toplevel 2>/dev/null) || top=""
if [[ ${REQUANT_COMMIT:-} =~ ^[0-9a-f]{7,64}(-dirty)?$ ]]; then
    echo "$REQUANT_COMMIT"
elif [ -n "$top" ] && [ "$(cd "$top" && pwd -P)" = "$here" ] \
        && c=$(git rev-parse --verify -q HEAD 2>/dev/null) && [[ $c =~ ^[0-9a-f]{40}$ ]]; then
    if [ -n "$(git status --porcelain 2>/dev/null)" ]; then
        c="$c-dirty"
    fi
    echo "$c"
else
    echo unknown
fi
