#!/bin/bash
set -euo pipefail
find /app/inbox -type f -regextype posix-extended -regex '.*/IMG_[0-9]{8}_[0-9]{4}\.jpg' -print0 |
while IFS= read -r -d '' f; do
    b=$(basename "$f")
    dest="/app/photos/${b:4:4}/${b:8:2}/${b:10:2}_${b:13:4}.jpg"
    mkdir -p "$(dirname "$dest")"
    mv "$f" "$dest"
done
