# hetmem benchmarks — a bash workload for whole-program timing and trace
# recording: strings, indexed and associative arrays, parameter expansion,
# no external commands. SPDX-License-Identifier: MIT
#   bash script.sh [ROUNDS]   (default 30)
rounds=${1:-30}
total=0
for ((r = 0; r < rounds; r++)); do
  declare -A seen=()
  list=()
  s=""
  for ((i = 0; i < 300; i++)); do
    w="w$(( (i * 7919 + r * 31) % 997 ))"
    seen[$w]=$(( ${seen[$w]:-0} + 1 ))
    list+=("$w-$i")
    s+="${w:0:3}"
  done
  joined="${list[*]}"
  up="${joined^^}"
  repl="${up//W/v}"
  total=$(( total + ${#seen[@]} + ${#repl} + ${#s} ))
  unset seen
done
echo "checksum $total"
