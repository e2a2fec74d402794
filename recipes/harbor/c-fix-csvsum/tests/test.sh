#!/bin/bash
# Compiles the agent's csvsum.c with the image's gcc and judges it on inputs made at verification time.
mkdir -p /logs/verifier
if python3 -I /tests/check_csvsum.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
