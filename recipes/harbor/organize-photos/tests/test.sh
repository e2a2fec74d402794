#!/bin/bash
# The file list and the content of each file are known to the verifier; nothing the agent wrote is trusted.
mkdir -p /logs/verifier
if python3 -I /tests/check_photos.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
