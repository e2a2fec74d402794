#!/bin/sh
find /srv/app/logs -name "*.log" -mtime +7 -delete
