#!/bin/bash
set -euo pipefail
cd /app
awk -F'"' '{ split($3, f, " "); if (f[1] >= 500 && f[1] <= 599) { split($1, a, " "); n[a[1]]++ } }
     END { for (ip in n) print n[ip], ip }' logs/access.log | LC_ALL=C sort -k1,1nr -k2,2 | head -n 5 > top_error_ips.txt
