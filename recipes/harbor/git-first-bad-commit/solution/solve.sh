#!/bin/bash
set -euo pipefail
cd /app/repo
git bisect start main "$(git rev-list --max-parents=0 main)" > /dev/null
git bisect run python3 check_total.py > /dev/null
git rev-parse refs/bisect/bad > /app/first_bad.txt
git bisect reset > /dev/null 2>&1
