#!/bin/sh
# The nightly gate (docs/nightly.md): a fresh run of one experiment, stored, judged against the baseline, which
# moves forward only on a pass. Exit status: speedmatrix regress's (docs/running.md): 0 pass, 1 slower, 3 lost,
# 4 nothing comparable, 5 a measurement problem, 2 bad input.
#
#   EXPERIMENT=tiny-cpu docs/nightly.sh
#
# Settings (environment): EXPERIMENT; RESULTS (the results root, default results); BIN (where speedmatrix is,
# default .venv/bin); RUN (the command that measures, default `make run EXPERIMENT=$EXPERIMENT`); TAG (the store's
# tag for the baseline, default baseline-$EXPERIMENT); OUT (where the verdict's files go, default
# $RESULTS/verdict-$EXPERIMENT); MIN_RUNS (stored runs of the runtime, the baseline among them, before a figure's
# change can fail the night, default 3: docs/nightly.md); MIN_EFFECT (regress --min-effect, e.g.
# output_tok_s=5%,ttft=10%: a fixed threshold instead of the stored runs' spread).
set -u
EXPERIMENT=${EXPERIMENT:-tiny-cpu}
RESULTS=${RESULTS:-results}
BIN=${BIN:-.venv/bin}
RUN=${RUN:-make run EXPERIMENT=$EXPERIMENT}
TAG=${TAG:-baseline-$EXPERIMENT}
MIN_RUNS=${MIN_RUNS:-3}
OUT=${OUT:-$RESULTS/verdict-$EXPERIMENT}
STORE=$RESULTS/history.sqlite
SM="$BIN/speedmatrix"

# a fresh results folder (the store beside it is kept: every night is added to it)
rm -rf "${RESULTS:?}/$EXPERIMENT"
# a run that fails is judged too: its lost cells are the verdict's, with their causes
$RUN || echo "nightly: the run did not finish every job; judging what it measured"
"$SM" history --add "$RESULTS/$EXPERIMENT" --store "$STORE" || exit 2
NEW=$("$SM" history --id "$RESULTS/$EXPERIMENT") || exit 2
if ! "$SM" history --id "$TAG" --store "$STORE" >/dev/null 2>&1; then
    "$SM" history --tag "$TAG" "$NEW" --store "$STORE" || exit 2
    echo "nightly: run $NEW is the first baseline (tag $TAG)"
    exit 0
fi
# the night's level: a run of unchanged software fails on any figure at most 5 % of the time (--family-wise)
"$SM" regress "$TAG" "$NEW" --store "$STORE" --family-wise --min-runs "$MIN_RUNS" \
    ${MIN_EFFECT:+--min-effect "$MIN_EFFECT"} \
    --out "$OUT" --json "$OUT/verdict.json" --junit "$OUT/junit.xml"
status=$?
if [ "$status" -eq 0 ]; then
    "$SM" history --tag "$TAG" "$NEW" --store "$STORE" || exit 2  # the baseline moves forward on a pass
    echo "nightly: pass; run $NEW is the baseline now (tag $TAG)"
fi
exit "$status"
