# Many small strings in a Perl array and hash (Perl takes them from the C library's malloc).
# Prints a digest. Usage: perl small_strings.pl [strings, default 1000000]
my $n = shift // 1000000;
my @a;
for my $i (0 .. $n - 1) { push @a, "string number $i " . ("x" x ($i % 50)); }
my $h = 0;
for my $s (@a) { $h = ($h * 31 + length($s)) % 4294967291; }
my %k;
for my $i (0 .. $n / 4) { $k{"key$i"} = $a[$i]; }
print "count=", scalar(@a), " hash=$h keys=", scalar(keys %k), "\n";
