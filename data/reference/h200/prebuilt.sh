# Sourced by heldout/run.sh and branches/run.sh (bash, set -e): an engine build packed by an earlier session
# (`ostinato engine pack-build`: its index engine-cuda.json and its parts engine-cuda.tar.xz.NN), carried in
# .prebuilt-parts/ and .prebuilt/ over two or more calls (the H200's CUDA pack of stock and ostinato, about 53 MB, with
# the tracked files, .whl/ and .carry/ exceeds the 64 MiB that travel to the device in one call: the parts but the last
# go in a `stage` call of their own, the last part and the index with the call that needs the build, sent at once,
# since the machine is given back 30 s after a call). Stage calls add up: where the parts but the last and the
# tracked files exceed 64 MiB together, several stage calls each carry some of the parts (`ostinato engine
# repart-pack --part-size` cuts a pack into parts that fill each call: heldout/README.md, "Carrying the build").
PACK_DIR=build/prebuilt

# what the carried folders hold, copied where a later call on this warm machine finds it
gather_prebuilt() {
  local d
  for d in .prebuilt-parts .prebuilt; do
    if [ -d "$d" ] && [ -n "$(ls -A "$d")" ]; then mkdir -p "$PACK_DIR" && cp -f "$d"/* "$PACK_DIR"/; fi
  done
}

# the `stage` part: keep the carried parts, nothing else
stage_prebuilt() {
  echo "stage: $(ls "$PACK_DIR" 2>/dev/null | wc -l) file(s) of the pack in $PACK_DIR"; ls -l "$PACK_DIR" 2>/dev/null || true
}

# once the index is there, the build from the gathered parts (`ostinato engine unpack-build` checks every part's sha256
# and refuses a build of other engine sources; a build already there with the same fingerprints is left as it is);
# exits 3 when parts are missing. Needs `ost` (python3 -m ostinato).
unpack_prebuilt() {
  [ -f "$PACK_DIR/engine-cuda.json" ] || return 0
  ost engine unpack-build --from "$PACK_DIR" --out build/engine || {
    echo "unpack: $PACK_DIR holds engine-cuda.json but not its parts as packed (a fresh machine: the stage call's was" \
         "given back; call run.sh stage carrying .prebuilt-parts, then this at once, or run.sh build)" >&2; exit 3; }
}

# the parts that use this machine's build stop at once on a fresh machine (the build's was given back between calls,
# or the carried pack was not unpacked): snakemake would start a build that the call cannot finish, spending the
# device time on nothing
need_build() {
  [ -x build/engine/cuda/ostinato/bin/llama-server ] || {
    echo "$1: no CUDA build on this machine (a fresh one: the build's machine was given back); run.sh build, or run.sh" \
         "stage carrying .prebuilt-parts and then this at once carrying .prebuilt" >&2
    exit 3; }
}
