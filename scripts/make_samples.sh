#!/usr/bin/env bash
# Regenerate samples/: short synthetic utterances and their transcripts.
# Needs Debian's espeak-ng and sox (apt-get install espeak-ng sox). Deterministic for a given espeak-ng.
# Usage: bash scripts/make_samples.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=samples
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# name | espeak-ng voice | words per minute | sox output format | transcript
cat > "$tmp/list" <<'LIST'
hello_world|en-us|150|-r 16000 -c 1 -b 16|hello world this is a streaming speech test
weather|en-gb|140|-r 16000 -c 1 -b 16|the weather today is cold and bright with a light wind
numbers|en-us+f3|160|-r 16000 -c 1 -b 16|seven apples and three oranges cost twelve dollars
stereo_44k|en-us+m3|145|-r 44100 -c 2 -b 16|please call me back when you reach the station
LIST

: > "$out/transcripts.tsv"
while IFS='|' read -r name voice wpm format text; do
  espeak-ng -v "$voice" -s "$wpm" -w "$tmp/$name.wav" "$text"
  # shellcheck disable=SC2086  # $format holds several sox options on purpose
  sox "$tmp/$name.wav" $format "$out/$name.wav"
  printf '%s.wav\t%s\n' "$name" "$text" >> "$out/transcripts.tsv"
done < "$tmp/list"
ls -l "$out"
