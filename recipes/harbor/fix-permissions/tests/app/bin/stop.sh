#!/bin/sh
pkill -f /srv/app/bin/server
