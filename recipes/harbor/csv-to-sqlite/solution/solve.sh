#!/bin/bash
set -euo pipefail
cd /app
rm -f sales.db
sqlite3 sales.db "CREATE TABLE sales (region TEXT, product TEXT, amount REAL);"
sqlite3 sales.db ".import --csv --skip 1 sales.csv sales"
sqlite3 sales.db "CREATE VIEW region_totals AS SELECT region, SUM(amount) AS total FROM sales GROUP BY region;"
