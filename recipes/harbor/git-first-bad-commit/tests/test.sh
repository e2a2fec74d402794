#!/bin/bash
# The answer is judged by the content of the commit it names, read with git plumbing.
mkdir -p /logs/verifier
if python3 -I /tests/check_bisect.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
