#!/bin/bash
set -euo pipefail
cd /app/repo
git checkout v1.0 -- config/settings.ini
git -c user.name=Oracle -c user.email=oracle@example.com commit -q -m "Restore config/settings.ini from v1.0"
