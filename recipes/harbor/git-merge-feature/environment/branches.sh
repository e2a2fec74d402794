#!/bin/sh
# Builds /app/project: main and feature diverge from one base; both edit VERSION and the top of
# CHANGELOG.md (conflicts), and each edits a different function of app.py (merges cleanly).
set -eu
export GIT_AUTHOR_NAME="Ravi Iyer" GIT_AUTHOR_EMAIL=ravi@example.com
export GIT_COMMITTER_NAME="Ravi Iyer" GIT_COMMITTER_EMAIL=ravi@example.com
at() { GIT_AUTHOR_DATE="$1" GIT_COMMITTER_DATE="$1" git commit -q -am "$2"; }
mkdir -p /app/project && cd /app/project
git init -q -b main
printf '2.0.0\n' > VERSION
printf '# Changelog\n\n## 2.0.0\n- New storage engine.\n\n## 1.0.0\n- First release.\n' > CHANGELOG.md
printf 'def greet(name):\n    return "Hello " + name\n\n\ndef farewell(name):\n    return "Bye " + name\n' > app.py
git add -A && at "2024-06-01T08:00:00Z" "Release 2.0.0"
git checkout -q -b feature
printf '2.1.0\n' > VERSION
printf '# Changelog\n\n## 2.1.0\n- Greetings use the full name.\n\n## 2.0.0\n- New storage engine.\n\n## 1.0.0\n- First release.\n' > CHANGELOG.md
printf 'def greet(name):\n    return "Hello, " + name.strip() + "!"\n\n\ndef farewell(name):\n    return "Bye " + name\n' > app.py
at "2024-06-03T08:00:00Z" "Friendlier greeting"
git checkout -q main
printf '2.0.1\n' > VERSION
printf '# Changelog\n\n## 2.0.1\n- Farewells are polite.\n\n## 2.0.0\n- New storage engine.\n\n## 1.0.0\n- First release.\n' > CHANGELOG.md
printf 'def greet(name):\n    return "Hello " + name\n\n\ndef farewell(name):\n    return "Goodbye, " + name + "."\n' > app.py
at "2024-06-04T08:00:00Z" "Polite farewell"
