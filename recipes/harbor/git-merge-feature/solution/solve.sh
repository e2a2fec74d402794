#!/bin/bash
set -euo pipefail
cd /app/project
git checkout -q main
git -c user.name=Oracle -c user.email=oracle@example.com merge --no-edit feature > /dev/null 2>&1 || true
printf '2.1.0\n' > VERSION
cat > CHANGELOG.md <<'MD'
# Changelog

## 2.1.0
- Greetings use the full name.

## 2.0.1
- Farewells are polite.

## 2.0.0
- New storage engine.

## 1.0.0
- First release.
MD
git add VERSION CHANGELOG.md
git -c user.name=Oracle -c user.email=oracle@example.com commit -q -m "Merge branch 'feature'"
