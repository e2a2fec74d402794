#!/bin/bash
echo "hello harbor" > /app/greeting.txt
