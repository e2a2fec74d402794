#!/bin/sh
# history.sh N BAD: a repository of N commits of price.py; from commit BAD on, total() rounds to
# one decimal instead of two, which check_total.py catches.
set -eu
n=$1 bad=$2
export GIT_AUTHOR_NAME="Lee Park" GIT_AUTHOR_EMAIL=lee@example.com
export GIT_COMMITTER_NAME="Lee Park" GIT_COMMITTER_EMAIL=lee@example.com
mkdir -p /app/repo && cd /app/repo
git init -q -b main
cat > check_total.py <<'PY'
import sys

from price import total

got = total([("apple", 3), ("pear", 2)])
print("total:", got)
sys.exit(0 if got == 2.55 else 1)
PY
i=1
while [ "$i" -le "$n" ]; do
    digits=2
    [ "$i" -ge "$bad" ] && digits=1
    {
        echo "VERSION = $i"
        echo 'RATES = {"apple": 0.45, "pear": 0.6}'
        j=1
        while [ "$j" -le "$i" ]; do echo "RATES[\"item$j\"] = $j.25"; j=$((j + 1)); done
        echo
        echo
        echo "def total(items):"
        echo "    s = 0.0"
        echo "    for name, qty in items:"
        echo "        s += RATES[name] * qty"
        echo "    return round(s, $digits)"
    } > price.py
    git add -A
    d=$(printf '2024-05-%02dT12:00:00Z' "$i")
    GIT_AUTHOR_DATE=$d GIT_COMMITTER_DATE=$d git commit -q -m "Add item$i to the price list"
    i=$((i + 1))
done
