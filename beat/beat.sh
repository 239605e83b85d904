#!/bin/sh
# Thin launcher: the single beat (it refuses to start while another beat holds the lock).
exec croqq beat "$@"
