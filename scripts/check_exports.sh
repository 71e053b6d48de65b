#!/usr/bin/env bash
# Checks what a shared build of the library exports: of its own code, the API and nothing else.
#  - Every exported symbol in namespace attention must be public: at the top of the namespace, in
#    attention::functional, attention::distributed or attention::testing, or a member, vtable or type information of
#    a public class. Internal namespaces (detail, kernels, cpu, serialization, anonymous) stay
#    hidden, except the kernel functions that attention::distributed calls (src/kernels/blockwise.h).
#  - Symbols of other code may only be instantiations of the templates of the standard library
#    and LibTorch, whose headers declare them with default visibility, so that GCC exports every
#    copy it emits (vague linkage); anything else (fmt, nlohmann::json, zlib, Gloo) is a leak.
# Also checks the SONAME.
#
#   scripts/check_exports.sh LIB.so SONAME
set -euo pipefail
lib=$1 soname=$2

actual_soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
if [[ $actual_soname != "$soname" ]]; then
  echo "check_exports.sh: $lib has SONAME '$actual_soname', expected '$soname'" >&2
  exit 1
fi

# Demangled names of the defined dynamic symbols, without the linker's own markers and without
# the "vtable for" kind of prefix.
symbols=$(nm -D --defined-only -C "$lib" | cut -d' ' -f3- |
  grep -v -x -E '_init|_fini|_edata|_end|__bss_start' |
  sed -E 's/^((typeinfo name|typeinfo|vtable|VTT|guard variable) for |(non-)?virtual thunk to )//')
internal='^attention::(\(anonymous namespace\)|[a-z_0-9]+)::'
public='^attention::(functional|distributed|testing)::'
called_by_distributed='^attention::(detail::shape_str|kernels::(Problem::expanded_mask|make_problem|forward_with_lse|backward_with_lse))(\[|\()'
templates='^(void |bool |std::[^ ]+ |void \(\*\)\()?(std::|__gnu_cxx::|at::|c10::|c10d::|torch::|caffe2::)'

leaked=$(grep -E "$internal" <<<"$symbols" | grep -v -E "$public" |
  grep -v -E "$called_by_distributed" || true)
foreign=$(grep -v -E '^attention::' <<<"$symbols" | grep -v -E "$templates" || true)
if [[ -n $leaked || -n $foreign ]]; then
  echo "check_exports.sh: $lib exports more than its API:" >&2
  if [[ -n $leaked ]]; then head -n 40 <<<"$leaked" >&2; fi
  if [[ -n $foreign ]]; then head -n 40 <<<"$foreign" >&2; fi
  exit 1
fi
own=$(grep -c -E '^attention::' <<<"$symbols" || true)
echo "check_exports.sh: $lib ($soname): $own symbols of the API, $(($(wc -l <<<"$symbols") - own))" \
  "instantiations of standard library and LibTorch templates, nothing else"
