# Commands in a buildah working container, for scripts/smoke-image.sh (sourced, not run).
#
# The caller sets `ctr` to a working container (`buildah from`). `run` runs a command
# in it. `capture CMD [INPUT]` runs the shell command CMD there (stdin from the host
# file INPUT, or empty) and prints what CMD writes to stdout (its stderr goes to the
# caller's; CMD can redirect it with 2>&1), then a last line "exit N" with CMD's exit
# status.
#
# Why `capture`: on a loaded CI machine, one `buildah run --isolation chroot` of a
# command whose shell always ends by printing its exit status returned status 0 and
# no output at all. The exit line tells such a loss from any answer the image gives:
# `capture` runs CMD again, at most three times in all, only while that line is
# missing, so every check reads what the image answered, never a lost answer.

STORE=(--storage-driver vfs)

run() { buildah "${STORE[@]}" run --isolation chroot "$ctr" -- "$@"; }

fail() { echo "smoke test failed: $*" >&2; exit 1; }

capture() {
  local cmd=$1 input=${2:-/dev/null} out attempt
  for attempt in 1 2 3; do
    out=$(run sh -c 'sh -c "$1"; echo "exit $?"' capture "$cmd" < "$input") || out=""
    case "$(printf '%s\n' "$out" | tail -1)" in
      "exit "[0-9]*)
        printf '%s\n' "$out"
        return 0
        ;;
    esac
    echo "smoke: attempt $attempt of '$cmd' came back without its exit line" >&2
  done
  fail "buildah run lost the output of '$cmd' three times"
}
