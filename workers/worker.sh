#!/bin/sh
# Thin launcher: the logic lives in the croqq package (croqq/cluster/boot.py).
exec croqq worker "$@"
