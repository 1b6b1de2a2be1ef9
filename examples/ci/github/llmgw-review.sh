#!/usr/bin/env bash
# Review one pull request of the settings repository with `llmgw review` and post the result on GitHub:
# one comment per pull request, edited in place on every run (found by its first line, "<!-- llmgw-review"),
# and a commit status named llmgw/plan on the head commit.
#
# Usage: llmgw-review.sh PR_NUMBER BASE HEAD_SHA
#   BASE: the base to compare with, e.g. origin/main; HEAD_SHA: the pull request's head commit (fetched).
# Environment: GH_TOKEN (gh's token: pull-requests: write, statuses: write), GITHUB_REPOSITORY,
#   GITHUB_SERVER_URL, GITHUB_RUN_ID (set by Actions); LLMGW_ADMIN_URL and LLMGW_ADMIN_TOKEN (the fleet,
#   read through the admin API), or LLMGW_FLEET_FILE (a snapshot from `llmgw fleet snapshot`) instead.
# Exit status: 0 once posted (the status carries the verdict; branch protection decides what blocks),
#   1 when posting failed.
# GitHub REST API: "Create an issue comment", "Update an issue comment", "List issue comments",
#   "Create a commit status" (docs.github.com/en/rest/issues/comments, /rest/commits/statuses).
set -euo pipefail

pr=$1 base=$2 head=$3
repo=$GITHUB_REPOSITORY
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -n "${LLMGW_FLEET_FILE:-}" ]; then
  fleet=(--fleet "$LLMGW_FLEET_FILE")
else
  fleet=(--admin "$LLMGW_ADMIN_URL")   # the token comes from LLMGW_ADMIN_TOKEN
fi

set +e
llmgw review "$base" "$head" --repo . "${fleet[@]}" -o "$work/review.md" --json-file "$work/review.json" \
  2>"$work/stderr"
code=$?
set -e

case $code in
  0) state=success; description="no change" ;;
  2) state=success; description="the change fits" ;;
  3) state=failure; description="some replicas cannot be placed" ;;
  *) state=error; description="llmgw review failed (exit $code)"
     { echo "<!-- llmgw-review base=- head=$head fleet=- -->"
       echo "## llmgw review: failed (exit $code)"
       echo
       echo '```'
       cat "$work/stderr"
       echo '```'; } >"$work/review.md" ;;
esac

comment=$(gh api --paginate "repos/$repo/issues/$pr/comments" \
  --jq '[.[] | select(.body | startswith("<!-- llmgw-review"))][0].id // empty' | head -n 1)
if [ -n "$comment" ]; then
  gh api --silent -X PATCH "repos/$repo/issues/comments/$comment" -F "body=@$work/review.md"
else
  gh api --silent -X POST "repos/$repo/issues/$pr/comments" -F "body=@$work/review.md"
fi

gh api --silent -X POST "repos/$repo/statuses/$head" -f state="$state" -f context=llmgw/plan \
  -f description="$description" -f target_url="$GITHUB_SERVER_URL/$repo/actions/runs/$GITHUB_RUN_ID"
echo "pull request #$pr: $description (llmgw review exit $code)"
