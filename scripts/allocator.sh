# Sourced by scripts/main.sh and scripts/test.sh before they start Python:
# glibc's allocator on transparent huge pages (glibc 2.35 and later; an
# older glibc or another C library ignores it). A training or scoring step
# allocates temporaries above the 32 MB that glibc's malloc keeps for reuse,
# so each step maps them afresh and the kernel faults their pages in 4 KB at
# a time; with 2 MB pages it faults a 512th as often. Same results, bit for
# bit: it changes how memory is mapped, not what is computed. Measured in
# benchmarks/allocator.py (docs/scaling.md, "Memory pages on CPU"). The
# user's own glibc.malloc.hugetlb, if set, is kept; so are other tunables.
case ":${GLIBC_TUNABLES:-}:" in
  *:glibc.malloc.hugetlb=*) ;;
  *) export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1" ;;
esac
