#!/bin/sh
# Builds /app/repo: settings.ini added (tag v1.0), edited, then deleted along with a notes file added.
set -eu
export GIT_AUTHOR_NAME="Dana Smith" GIT_AUTHOR_EMAIL=dana@example.com
export GIT_COMMITTER_NAME="Dana Smith" GIT_COMMITTER_EMAIL=dana@example.com
commit() {
    GIT_AUTHOR_DATE="$1" GIT_COMMITTER_DATE="$1" git commit -q -m "$2"
}
mkdir -p /app/repo/config /app/repo/src
cd /app/repo
git init -q -b main
printf '# Inventory service\n\nRun `python3 src/main.py`.\n' > README.md
printf '[server]\nhost = 127.0.0.1\nport = 8080\n\n[db]\npath = /var/lib/inventory.db\npool = 4\n' > config/settings.ini
printf 'import configparser\n\ncfg = configparser.ConfigParser()\ncfg.read("config/settings.ini")\nprint(cfg["server"]["port"])\n' > src/main.py
git add -A && commit "2024-03-01T10:00:00Z" "Initial import"
git tag v1.0
printf '[server]\nhost = 0.0.0.0\nport = 9090\n\n[db]\npath = /tmp/inventory.db\npool = 16\ndebug = yes\n' > config/settings.ini
commit_all() { git add -A && commit "$1" "$2"; }
commit_all "2024-03-04T09:30:00Z" "Try a debug configuration"
printf 'Configuration now comes from the deployment tool.\n' > notes.txt
git rm -q config/settings.ini
commit_all "2024-03-07T16:45:00Z" "Remove stale config"
