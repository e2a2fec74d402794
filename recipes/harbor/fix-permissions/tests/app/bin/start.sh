#!/bin/sh
exec /srv/app/bin/server --config /srv/app/conf/app.conf
