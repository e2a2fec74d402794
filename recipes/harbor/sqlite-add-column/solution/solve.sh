#!/bin/bash
set -euo pipefail
sqlite3 /app/app.db "ALTER TABLE users ADD COLUMN domain TEXT;
  UPDATE users SET domain = lower(substr(email, instr(email, '@') + 1));"
