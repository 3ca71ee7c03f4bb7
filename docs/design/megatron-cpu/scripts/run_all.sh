#!/bin/bash
# Re-runs every experiment in order (each < 1 min on 2 cores). Needs /tmp/mcore-venv (see README in findings).
set -e; cd /tmp/mcore-scripts; PY="nice -n 19 /tmp/mcore-venv/bin/python"
f() { echo "== $*"; timeout 170 $PY "$@" 2>&1 | grep -v '^\[cpu_patches\]' | grep -E 'TP=|PP=|DP=|diff|FAIL|Error|loss|native' ; }
f tp1_nopatch.py || true       # shows the unpatched failures
f tp_test.py 1; f tp_test.py 2; f tp_test.py 2 sp || true   # sp fails: torch_norm.py:32
f pp_test.py 1; f pp_test.py 2; f pp_test.py 2 nobatch
f vpp_test.py 1; f vpp_test.py 2 || true; f vpp_test.py 2 nobatch; f vpp_test.py 2 nobatch overlap
f ddp_opt_test.py 1 plain mode; f ddp_opt_test.py 2 plain mode; f ddp_opt_test.py 2 distopt mode; f ddp_opt_test.py 2 distopt mode bf16
f bridge_test.py make; f bridge_test.py 1 1; f bridge_test.py 2 1; f bridge_test.py 1 2; f bridge_test.py 2 2
