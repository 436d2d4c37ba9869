#!/usr/bin/env bash
# gpu-bundle.sh — pack what the GPU checks need into .gpu/ (git-ignored via
# .git/info/exclude), for a GPU machine that has the NVIDIA driver, nvcc and
# PyTorch but none of tqkvd's Debian libraries and no package registry.
#
#   make USE_CUDA=yes all phases && scripts/gpu-bundle.sh
#
# .gpu/build.tar.xz           build/{bin,tests,lib}: stripped tqkvd, tqctl,
#                             tqbench, tqbench-phases (make phases), tqkv-run
#                             and the test binaries the GPU checks run
# .gpu/sys/                   the shared libraries they load that are not the
#                             C/C++ runtime (gRPC, Abseil, protobuf-c, liburing,
#                             libnuma, libsystemd, libinih, ...), copied from
#                             this machine; scripts/gpu-check.sh puts them on
#                             LD_LIBRARY_PATH
# .gpu/data/                  the shared test model, tokenizer and text
#                             (../shared/data), for gpu_backend.sh's sparse-V
#                             check (TQ_DATA)
# The CUDA runtime is linked statically (cudart_static): only the driver's
# libcuda.so.1 comes from the GPU machine.  Then run there (the device tool:
# carry .gpu):  scripts/gpu-check.sh
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
[ -x "$B/tests/test_cuda" ] || { echo "gpu-bundle: $B/tests/test_cuda is not built (make USE_CUDA=yes all)" >&2; exit 1; }
[ -x "$B/bin/tqbench-phases" ] || { echo "gpu-bundle: $B/bin/tqbench-phases is not built (make USE_CUDA=yes phases)" >&2; exit 1; }
rm -rf .gpu
mkdir -p .gpu/build/bin .gpu/build/tests .gpu/build/lib .gpu/sys
for f in "$B"/bin/*; do strip -o ".gpu/build/bin/${f##*/}" "$f"; done
for f in test_cuda test_cuda_fault test_ring launch_probe tqsoak; do strip -o ".gpu/build/tests/$f" "$B/tests/$f"; done
cp -a "$B"/lib/. .gpu/build/lib/
for f in .gpu/build/bin/* .gpu/build/tests/*; do ldd "$f"; done |
	awk '/=>/ { print $3 }' | sort -u |
	grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda)\.so' |
	while read -r l; do cp -L "$l" .gpu/sys/; done
D=${TQ_DATA:-../shared/data}
if [ -f "$D/stories260K.bin" ]; then
	mkdir -p .gpu/data
	cp "$D/stories260K.bin" "$D/tok512.bin" "$D/tinystories-dev.txt" .gpu/data/
fi
# the binaries carry kernels for every CUDA_ARCHS: xz keeps the bundle within
# what a device call takes along (64 MiB)
tar -C .gpu -cf - build | xz -T2 -3 >.gpu/build.tar.xz
rm -rf .gpu/build
du -sh .gpu
