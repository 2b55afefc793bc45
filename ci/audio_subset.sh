#!/usr/bin/env bash
# The recordings the librosa-comparing audio tests read, small enough to carry to the GPU machine with
# Whisper's second part (ci/gpu_phases.sh stage-audio unpacks it): each pygpukit.audio.testdata package's
# completion stamp and its first WAV files in sorted order (the tests take the first few: wav_files()
# sorts), all of pocketsphinx-testdata. Fetches the packages first when missing. Writes
# .bigB/audio-subset.tar (about 14 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
python=.venv/bin/python
"$python" -m pygpukit.audio.testdata >/dev/null
root=$("$python" -c "from pygpukit.audio import testdata; print(testdata.cache_dir())")
list=$(mktemp)
trap 'rm -f "$list"' EXIT
for spec in asterisk-core-sounds-en-wav:8 asterisk-moh-opsound-wav:3 pocketsphinx-testdata:100000; do
  name=${spec%%:*} count=${spec##*:}
  (cd "$root" && echo "$name/.complete" && find "$name" -name '*.wav' | LC_ALL=C sort | head -n "$count") >>"$list"
done
mkdir -p .bigB
tar -C "$root" -cf .bigB/audio-subset.tar -T "$list"
ls -la .bigB/audio-subset.tar
