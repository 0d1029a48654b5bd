# Commands in a buildah working container, for scripts/smoke-image.sh (sourced, not run).
#
# The caller sets `ctr` to a working container (`buildah from`). `run` runs a command
# in it. `capture CMD [INPUT]` runs the shell command CMD there (stdin from the host
# file INPUT, or empty) and prints what CMD writes to stdout (its stderr goes to the
# caller's; CMD can redirect it with 2>&1), then a last line "exit N" with CMD's exit
# status.
#
# Why `capture`: on a loaded machine, `buildah run --isolation chroot` can return
# status 0 and none of a command's output, even from a shell that always ends by
# printing its exit status. The exit line tells such a loss from any answer the image gives:
# while `buildah run` returns 0 without that line, `capture` runs CMD again, at most
# three times in all; a non-zero status of `buildah run` itself fails at once. So a
# check that reads output through `capture` reads what the image answered, never a
# lost answer; a command that changes the container can therefore run more than once
# (smoke-image.sh checks numba's cache by its files, not only by what a run printed).

STORE=(--storage-driver vfs)

run() { buildah "${STORE[@]}" run --isolation chroot "$ctr" -- "$@"; }

fail() { echo "smoke test failed: $*" >&2; exit 1; }

capture() {
  local cmd=$1 input=${2:-/dev/null} out last body status attempt
  # The exit line is printed after a newline of its own, so that output without a
  # trailing newline cannot hide it; that newline is taken out again below.
  for attempt in 1 2 3; do
    status=0
    out=$(run sh -c 'sh -c "$1"; printf "\nexit %s\n" "$?"' capture "$cmd" < "$input") \
      || status=$?
    [ "$status" = 0 ] || fail "buildah run exited $status for '${cmd%%$'\n'*}': $out"
    last=${out##*$'\n'}
    case "$last" in
      "exit "[0-9]*)
        body=""
        [ "$out" = "$last" ] || body=${out%$'\n'"$last"}
        body=${body%$'\n'}
        [ -z "$body" ] || printf '%s\n' "$body"
        printf '%s\n' "$last"
        return 0
        ;;
    esac
    echo "smoke: attempt $attempt of '${cmd%%$'\n'*}' came back without its exit line" >&2
  done
  fail "buildah run lost the output of '${cmd%%$'\n'*}' three times"
}
