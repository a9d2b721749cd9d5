# hetmem benchmarks — a perl workload for whole-program timing and trace
# recording: words made, counted in a hash, sorted, rewritten by regular
# expressions, split and joined. SPDX-License-Identifier: MIT
#   perl words.pl [ROUNDS]   (default 20)
use strict;
use warnings;

my $rounds = shift // 20;
my $seed = 12345;
sub rnd { $seed = ($seed * 1103515245 + 12345) % 2147483648; return $seed; }

my $total = 0;
for my $r (1 .. $rounds) {
    my %count;
    my @lines;
    for my $l (1 .. 400) {
        my @w = map { join '', map { chr(97 + rnd() % 26) } 1 .. (2 + rnd() % 9) } 1 .. 12;
        $count{$_}++ for @w;
        push @lines, join ' ', @w;
    }
    my @top = (sort { $count{$b} <=> $count{$a} || $a cmp $b } keys %count)[0 .. 49];
    for my $line (@lines) {
        (my $t = $line) =~ s/([aeiou])([a-z])/$2$1/g;
        $t =~ s/\b(\w)(\w*)/\u$1$2/g;
        my @f = split / /, $t;
        $total += scalar(@f) + length(join ',', reverse @f);
    }
    $total += length(join '', @top);
}
print "checksum $total\n";
