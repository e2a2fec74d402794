#!/bin/bash
# Modes are read with lstat; contents are compared with the verifier's copies.
mkdir -p /logs/verifier
if python3 -I /tests/check_modes.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
