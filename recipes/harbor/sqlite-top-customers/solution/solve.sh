#!/bin/bash
set -euo pipefail
cd /app
{
  echo "name,total"
  sqlite3 -separator , shop.db "SELECT c.name, printf('%.2f', SUM(o.quantity * o.unit_price)) AS t
    FROM customers c JOIN orders o ON o.customer_id = c.id WHERE o.status = 'paid'
    GROUP BY c.id ORDER BY SUM(o.quantity * o.unit_price) DESC, c.name LIMIT 3"
} > top_customers.csv
