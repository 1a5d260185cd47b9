#!/usr/bin/env bash
# drafter-pipeline.sh NEW_CHECKPOINT_URI
#
# Keep a DFlash drafter in step with every new fine-tune, without a person in the loop:
#
#   audit the current drafter against the new checkpoint      (draftsmith audit)
#     keep        -> nothing to train; the current drafter stays
#     warm_start  -> a job that starts from the current drafter, with a smaller budget
#     retrain     -> a job from scratch (also when the drafter no longer fits the checkpoint)
#   wait for the job, which validates (lossless) and publishes   (draftsmith submit --wait)
#   print the drafter to serve                                  (draftsmith drafters list)
#
# Settings (environment):
#   DRAFTSMITH_URL, DRAFTSMITH_API_KEY   the server and an API key (read+write)
#   DRAFTER          the drafter serving today (drf_...); default: the newest drafter for the previous
#                    checkpoint, PREVIOUS_TARGET (if set), else the organisation's newest; none: retrain
#   JOB_SPEC         a job spec file (the body of POST /v1/jobs) with your sampling parameters and publish
#                    destinations; the new checkpoint and the warm start are laid over it
#   WARM_STEPS       training.max_steps of a warm start (default 100; a retrain keeps JOB_SPEC's)
#   AUDIT_ARGS       extra `draftsmith audit` flags, e.g. "--prompts file-... --min-tau 1.5"
#   DRAFTSMITH       the command to run (default: draftsmith)
#
# Output: the drafter id to serve on stdout (and `drafter_id=`, `action=` in $GITHUB_OUTPUT when set).
# Exit status:
#   0  done: the current drafter kept, or a new one validated lossless and published
#   1  usage or configuration error
#   2  the audit could not run: the checkpoint is unreachable or an input is bad (the message says which)
#   3  a lossless check failed (the audit's or the new job's): do not roll anything out
#   4  the training job failed for another reason (its error code and message are printed)
set -euo pipefail

usage() { echo "usage: $0 NEW_CHECKPOINT_URI   (see the header of this script)" >&2; exit 1; }
[ $# -eq 1 ] || usage
new_target=$1
ds=${DRAFTSMITH:-draftsmith}
warm_steps=${WARM_STEPS:-100}
log() { echo "[drafter-pipeline] $*" >&2; }
json_field() {  # json_field EXPR: evaluate EXPR on the JSON document read from stdin (`d` is the document)
  python3 -c "import json, sys; d = json.load(sys.stdin); v = $1; print('' if v is None else v)"
}
output() { [ -n "${GITHUB_OUTPUT:-}" ] && echo "$1" >> "$GITHUB_OUTPUT" || true; }

[ -n "${DRAFTSMITH_URL:-}" ] || { log "set DRAFTSMITH_URL (and DRAFTSMITH_API_KEY)"; exit 1; }
if [ -n "${JOB_SPEC:-}" ] && [ ! -f "$JOB_SPEC" ]; then log "JOB_SPEC $JOB_SPEC does not exist"; exit 1; fi

current=${DRAFTER:-}
if [ -z "$current" ]; then
  filter=()
  [ -n "${PREVIOUS_TARGET:-}" ] && filter=(--target-uri "$PREVIOUS_TARGET")
  current=$("$ds" drafters list --limit 1 ${filter[@]+"${filter[@]}"} | json_field 'd[0]["id"] if d else None')
fi

action=retrain
if [ -n "$current" ]; then
  log "auditing $current against $new_target"
  set +e
  # shellcheck disable=SC2086  # AUDIT_ARGS is a list of flags
  action=$("$ds" audit --drafter "$current" --target "$new_target" ${AUDIT_ARGS:-} | tail -n 1)
  status=$?
  set -e
  case $status in
    0) ;;
    3) log "the lossless check failed for $current on $new_target"; exit 3 ;;
    4) log "$current does not fit $new_target: retraining"; action=retrain ;;
    *) log "the audit could not run (exit $status)"; exit 2 ;;
  esac
else
  log "no drafter yet: training one"
fi
log "recommendation: $action"
output "action=$action"

if [ "$action" = keep ]; then
  log "keeping $current"
  output "drafter_id=$current"
  echo "$current"
  exit 0
fi

submit=("$ds" submit --target "$new_target" --wait)
[ -n "${JOB_SPEC:-}" ] && submit+=(--spec "$JOB_SPEC")
if [ "$action" = warm_start ]; then
  submit+=(--set "init.from_drafter=$current" --set "training.max_steps=$warm_steps")
fi
set +e
job=$("${submit[@]}" | tail -n 1)
status=$?
set -e
case $status in
  0) ;;
  3) log "the new drafter failed the lossless check: nothing published"; exit 3 ;;
  *) log "the training job failed (exit $status)"; exit 4 ;;
esac
drafter=$("$ds" drafters list --job-id "$job" | json_field 'd[0]["id"]')
log "job $job published drafter $drafter"
output "drafter_id=$drafter"
output "job_id=$job"
echo "$drafter"
