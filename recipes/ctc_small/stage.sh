#!/usr/bin/env bash
# One training stage of ctc-small on a machine without speech synthesisers, from the repository root:
# unpack the Debian packages in .tts/ and .words/ (README.md beside this file lists them) into /tmp/tts,
# synthesise the corpus into .corpus/ (once: kept while the folder is), train from INIT until DEADLINE
# (unix seconds) and evaluate on the held-out split. Writes OUT/{ctc-small.safetensors,train.json,
# eval.json,log.txt,corpus.json}.
#
#   bash recipes/ctc_small/stage.sh audiomask/assets/ctc-small.safetensors "$OUT/stage" $(( $(date +%s) + 580 ))
#
# ENGINES (default "espeak-ng flite"; add festival when its packages are in .tts/), HOURS (40),
# WORKERS (16), BATCH_AUDIO_S (3600) and PEAK_LR (0.001) override the stage's settings.
set -euo pipefail
init=$1 out=$2 deadline=$3
tts=/tmp/tts
mkdir -p "$tts" "$out"
for package in .tts/*.deb .words/*.deb; do dpkg -x "$package" "$tts"; done
# The unpacked libraries are the synthesisers' only: python never sees LD_LIBRARY_PATH.
libraries=$tts/usr/lib/x86_64-linux-gnu:$tts/lib/x86_64-linux-gnu:$tts/usr/lib/x86_64-linux-gnu/pulseaudio
espeak="env LD_LIBRARY_PATH=$libraries ESPEAK_DATA_PATH=$tts/usr/lib/x86_64-linux-gnu/espeak-ng-data $tts/usr/bin/espeak-ng"
flite="env LD_LIBRARY_PATH=$libraries $tts/usr/bin/flite"
festival="env LD_LIBRARY_PATH=$libraries $tts/usr/bin/festival --datadir $tts/usr/share/festival"
if [ ! -f .corpus/manifest.jsonl ]; then
  # shellcheck disable=SC2086  # ENGINES is a list of words
  python3 -m recipes.ctc_small.corpus --out .corpus --hours "${HOURS:-40}" --workers "${WORKERS:-16}" \
    --engines ${ENGINES:-espeak-ng flite} --espeak "$espeak" --flite "$flite" --festival "$festival" \
    --wordlist "$tts/usr/share/dict/american-english" --frequency-text "$tts/usr/share/games/fortunes" \
    > "$out/corpus_log.txt" 2>&1
fi
cp .corpus/corpus.json "$out/"
python3 -m recipes.ctc_small.train --corpus .corpus --out "$out" --device cuda --workers "${WORKERS:-16}" \
  --deadline "$deadline" --init "$init" --batch-audio-s "${BATCH_AUDIO_S:-3600}" --peak-lr "${PEAK_LR:-0.001}" \
  --eval-reserve-s 45 > "$out/log.txt" 2>&1
grep -E "features|planned|CER|done" "$out/log.txt"
