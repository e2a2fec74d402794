#!/bin/bash
set -euo pipefail
cd /app
jq -c -s 'to_entries | group_by(.value.id)
  | map(max_by([.value.ts, .key]) | .value) | sort_by(.id) | .[]' <(grep -v '^[[:space:]]*$' events.jsonl) > latest.jsonl
