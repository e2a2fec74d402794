#!/bin/sh
# make_inbox.sh LIST: creates /app/inbox/<path> for each listed path; a file's content is derived from
# its path (the verifier derives the same content to recognise each file wherever it ends up).
set -eu
while IFS= read -r p; do
    mkdir -p "/app/inbox/$(dirname "$p")"
    i=0
    while [ "$i" -lt 40 ]; do printf 'photo-bytes %s %d\n' "$p" "$i"; i=$((i + 1)); done > "/app/inbox/$p"
done < "$1"
