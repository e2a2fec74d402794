#!/bin/sh
# Nightly backup of the application's data directory.
set -eu
stamp=$(date +%Y%m%d)
tar -czf "/var/backups/app/data-$stamp.tar.gz" -C /srv/app data
find /var/backups/app -name 'data-*.tar.gz' -mtime +14 -delete
