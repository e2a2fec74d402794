#!/bin/bash
set -euo pipefail
cd /srv/app
chmod 0755 bin/*.sh
chmod 0640 conf/app.conf
chmod 0700 secrets
chmod 0600 secrets/api.key
chmod 0755 data
chmod 1777 logs
