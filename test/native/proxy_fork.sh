# SPDX-License-Identifier: MIT
# Run by test_proxy_malloc under HM_PROXY=shared: bash's $(...) subshells are
# forked children that go on running and write into the heap they inherited;
# the parent's variables must come out intact.
a=(); for i in $(seq 1 300); do a+=("value-$i"); done
declare -A h; for i in $(seq 1 200); do h[k$i]="hv$i"; done
for i in 1 2 3 4 5 6 7 8; do
  x=$(unset a; unset h; for j in $(seq 1 300); do b+=("other-$j-xxxxxxxx"); done; echo ${#b[@]})
  y=$(declare -A z; for j in $(seq 1 100); do z[k$j]=$j; done; echo ${#z[@]})
done
s=""; for i in $(seq 1 300); do s+="${a[$((i-1))]}"; done
echo "${#a[@]} ${#h[@]} $x $y ${h[k77]} $(echo "$s" | md5sum)"
