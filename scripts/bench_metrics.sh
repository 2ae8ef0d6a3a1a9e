# Readers of a run's metrics.jsonl for the bench scripts that compare runs of their own
# (scripts/bench_lora_memory.sh, scripts/bench_frozen_memory.sh); sourced, runs nothing.

# The value of `key` on the last train line of `metrics`.
last_train_value() {  # metrics key
  grep '"split": "train"' "$1" | tail -1 | sed -n "s/.*\"$2\": \\([0-9.e+-]*\\).*/\\1/p"
}

# The median of the differences of elapsed_s over the train lines of `metrics`: a step's time.
median_step_s() {  # metrics
  grep '"split": "train"' "$1" | sed 's/.*"elapsed_s": \([0-9.e+-]*\).*/\1/' |
    awk 'NR > 1 { print $1 - prev } { prev = $1 }' | sort -g |
    awk '{ d[++n] = $1 } END { if (n == 0) print "nan"
                               else printf "%.2f\n", n % 2 ? d[(n + 1) / 2] : (d[n / 2] + d[n / 2 + 1]) / 2 }'
}
