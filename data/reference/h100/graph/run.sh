#!/usr/bin/env bash
# An H100 (the device tool lent one for a call that named no H200 only): the CUDA engine tests of one graph per decode
# step and of borrowed memory inside the pool's own expert computation (issue 14), in two calls on one machine. Call 1
# builds the ostinato stage alone, which fits a call there (both stages do not: ../../h200/graph/run.sh):
#   OP_TESTS=0 TESTS_K=no_such_test_xyz TESTS_BUDGET=30 PACK=0 VARIANTS=ostinato CALL_BUDGET=1 \
#       bash data/reference/h200/graph/run.sh build
# Call 2, at once on the same machine (it is given back 30 s after a call), is this script: the tests below, in this
# order (the borrow and bitwise cases first, for a call that ends early), verbose, into $OUT/tests-cuda-v.txt. Their
# fixture builds the stock stage it lacks (its output is in the log), and the first server logs of one graph per step
# against per-segment graphs go to $OUT/logs/.
set -uo pipefail
export OUT=${OUT:?}
export PYTHONPATH="$PWD/src:/tmp/site"
T=tests/test_residency_engine.py
ids=(
 "$T::test_borrowed_memory_follows_the_python_reference[deepseek4]"
 "$T::test_one_graph_per_decode_step_computes_bitwise_what_per_segment_graphs_compute[deepseek4-True]"
 "$T::test_one_graph_per_decode_step_computes_bitwise_what_per_segment_graphs_compute[qwen3moe-True]"
 "$T::test_one_graph_per_decode_step_computes_bitwise_what_per_segment_graphs_compute[qwen3moe-False]"
 "$T::test_whole_sessions_overlapped_replay_bitwise_the_in_turn_replay[deepseek4-borrow]"
 "$T::test_whole_sessions_overlapped_replay_bitwise_the_in_turn_replay[qwen3moe-borrow]"
 "$T::test_borrowed_memory_follows_the_python_reference[qwen3moe]"
 "$T::test_borrowed_memory_lends_decode_the_staging_area[deepseek4]"
 "$T::test_borrowed_memory_lends_decode_the_staging_area[qwen3moe]"
 "$T::test_one_graph_per_decode_step_computes_bitwise_what_per_segment_graphs_compute[deepseek4-False]"
 "$T::test_a_cpu_worker_that_answers_late_fails_the_step_with_an_error_naming_the_layer[deepseek4]"
 "$T::test_the_device_counts_its_waits_for_a_slow_worker[deepseek4]"
)
left=$(( ${CALL_END:-580} - SECONDS ))
echo "tests: $left s left"
OSTINATO_ENGINE_VARIANTS=stock,ostinato OSTINATO_ENGINE_OP_TESTS=0 OSTINATO_ENGINE_BACKEND=cuda \
  timeout "$left" python3 -m pytest -v -p no:cacheprovider --basetemp=/tmp/ptest2 -rA --durations=0 "${ids[@]}" \
  > "$OUT/tests-cuda-v.txt" 2>&1
echo "pytest rc=$?"
grep -E "PASSED|FAILED|SKIPPED|ERROR" "$OUT/tests-cuda-v.txt" | tail -30
mkdir -p "$OUT/logs"
for f in /tmp/ptest2/*/server-graph-*.log; do
  [ -f "$f" ] && gzip -c "$f" > "$OUT/logs/$(basename "$(dirname "$f")")-$(basename "$f").gz"
done
true
