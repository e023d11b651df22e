#!/bin/sh
# check_no_cudart.sh LIB - fails when LIB has a NEEDED entry for a CUDA library (libcudart,
# libcuda, libnvrtc, ...): libkvtier must load into a process holding any CUDA runtime.
lib=${1:?usage: check_no_cudart.sh LIB}
dyn=$(readelf -d "$lib") || exit 1
needed=$(printf '%s\n' "$dyn" | grep '(NEEDED)')
[ -n "$needed" ] || { echo "$lib: no NEEDED entries at all: not a shared library?"; exit 1; }
printf '%s\n' "$needed"
if printf '%s\n' "$needed" | grep -Ei '\[lib(cuda|cudart|nvrtc|nvidia)[^]]*\]'; then
	echo "$lib links a CUDA library (above); libkvtier must reach CUDA through dlopen only"
	exit 1
fi
exit 0
