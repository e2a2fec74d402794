#!/bin/bash
cat /data/*.txt | wc -l > /data/count
