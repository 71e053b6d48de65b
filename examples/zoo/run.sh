#!/usr/bin/env bash
# Python writes the zoo's seeded models and their generations, the C++ decoder loads each and
# generates its tokens through KV caches and paged caches: one ctest entry.
#   examples/zoo/run.sh PYTHON PROGRAM DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=$1 program=$2 dir=$3
rm -rf "$dir"
"$python" "$here/write_models.py" "$dir"
for model in "$dir"/*/; do
  "$program" "$model"
done
# A configuration that cannot hold is refused by name before anything is built.
bad=$dir/bad-layer-types
cp -r "$dir/qwen3-float32" "$bad"
"$python" - "$bad/config.json" <<'PYTHON'
import json, sys
config = json.load(open(sys.argv[1]))
config["layer_types"] = ["full_attention"]  # one entry for two layers
json.dump(config, open(sys.argv[1], "w"))
PYTHON
if "$program" "$bad" 2>"$dir/bad.log"; then
  echo "run.sh: a layer_types list of the wrong length was accepted" >&2
  exit 1
fi
grep -q "expected layer_types of n_layers = 2 entries, got 1" "$dir/bad.log"
echo "run.sh: every model generated Python's tokens; a bad configuration was refused"
