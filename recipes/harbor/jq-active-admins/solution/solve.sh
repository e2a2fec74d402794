#!/bin/bash
set -euo pipefail
cd /app
jq '[.[] | select(.role == "admin" and .active == true) | .email] | unique' users.json > active_admins.json
