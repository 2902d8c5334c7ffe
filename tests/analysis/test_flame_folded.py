"""Folded text: parse/format round trips, and flamegraph.pl's own line rules (run in Perl) read our output."""

import shutil
import subprocess

import pytest

from analysis.flamegraph.folded import (
    FoldedParseError,
    format_diff_folded,
    format_folded,
    parse_diff_folded,
    parse_folded,
)
from analysis.flamegraph.profile import Profile
from tests.analysis.hostile_profiles import random_hostile_profile

HOSTILE = ["<script>alert(1)</script>", 'say "hi" & <bye>', "semi;colon", "new\nline", "worker 12",
           "tab\there", "  spaced  ", "ünïcödé"]

# flamegraph.pl's input loop (FlameGraph/flamegraph.pl): a count at the end, and an optional second
# count before it which makes the line differential. Frames are split on ';'. This is the consumer
# whose rules our folded text has to satisfy; it prints what it understood, one line per stack.
PERL_READER = r"""
my ($ignored, $diff_lines) = (0, 0);
my %total;
while (<STDIN>) {
    chomp;
    my ($stack, $samples) = (/^(.*)\s+?(\d+(?:\.\d*)?)$/);
    unless (defined $samples and defined $stack) { ++$ignored; next; }
    my $samples2 = undef;
    if ($stack =~ /^(.*)\s+?(\d+(?:\.\d*)?)$/) {
        $samples2 = $samples;
        ($stack, $samples) = $stack =~ (/^(.*)\s+?(\d+(?:\.\d*)?)$/);
        ++$diff_lines;
    }
    my @frames = split ";", $stack;
    $total{join("\x1f", @frames)} += (defined $samples2 ? $samples2 : $samples);
}
print "ignored $ignored\ndiff $diff_lines\n";
print "$_\t$total{$_}\n" for sort keys %total;
"""


def _perl_read(text: str) -> tuple[int, int, dict[tuple[str, ...], int]]:
    perl = shutil.which("perl")
    if perl is None:
        pytest.fail("perl is missing (Debian's perl-base is essential); cannot run flamegraph.pl's reader")
    out = subprocess.run([perl, "-e", PERL_READER], input=text.encode(), capture_output=True,
                         check=True, timeout=30).stdout.decode()
    lines = out.rstrip("\n").split("\n")
    ignored = int(lines[0].split()[1])
    diff_lines = int(lines[1].split()[1])
    stacks = {}
    for line in lines[2:]:
        key, count = line.rsplit("\t", 1)
        stacks[tuple(key.split("\x1f"))] = int(count)
    return ignored, diff_lines, stacks


def _sample_profile() -> Profile:
    prof = Profile()
    prof.add(["MainThread", "serve (server.py:40)", "forward (model.py:12)"], 120)
    prof.add(["MainThread", "serve (server.py:40)", "tokenize (tok.py:3)"], 30)
    prof.add(["MainThread", "serve (server.py:40)"], 7)
    for i, name in enumerate(HOSTILE):
        prof.add(["MainThread", name], i + 1)
    prof.add(["swapper", "do_idle_[k]"], 9)
    return prof


def test_format_is_sorted_stack_count_lines_with_a_final_newline():
    prof = Profile({("b", "x"): 2, ("a",): 1, ("b",): 3})
    assert format_folded(prof) == "a 1\nb 3\nb;x 2\n"
    assert format_folded(Profile()) == ""


def test_parse_format_round_trip_is_byte_identical():
    text = format_folded(_sample_profile())
    again = parse_folded(text)
    assert format_folded(again) == text
    assert again.stacks == _sample_profile().stacks


def test_parse_sums_duplicates_skips_blank_lines_and_accepts_crlf():
    prof = parse_folded("a;b 2\r\n\n   \na;b 3\nc 1")
    assert prof.stacks == {("a", "b"): 5, ("c",): 1}


@pytest.mark.parametrize("line, why", [
    ("a;b", "expected"),
    ("a;b x", "'x'"),
    ("a;b -3", "'-3'"),
    ("a;b 1.5", "'1.5'"),
    (" 5", "expected"),
    ("a;b ٣", "'٣'"),
])
def test_parse_rejects_bad_lines_quoting_line_number_and_text(line, why):
    with pytest.raises(FoldedParseError, match="line 2") as err:
        parse_folded(f"ok 1\n{line}\n")
    assert why in str(err.value)


def test_flamegraph_pl_rules_read_every_line_with_our_counts_and_no_phantom_diff_column():
    prof = _sample_profile()
    ignored, diff_lines, stacks = _perl_read(format_folded(prof))
    assert ignored == 0
    assert diff_lines == 0  # "worker 12" would have been read as a second count without escaping
    assert stacks == prof.stacks
    assert sum(stacks.values()) == prof.total()


def test_diff_folded_is_read_by_flamegraph_pl_as_two_columns():
    base = Profile({("m", "a"): 10, ("m", "b"): 30, ("m", "worker 12"): 5})
    cur = Profile({("m", "a"): 50, ("m", "c"): 5})
    text = format_diff_folded(base, cur, normalise=False)
    ignored, diff_lines, stacks = _perl_read(text)
    assert (ignored, diff_lines) == (0, 4)
    assert stacks == {("m", "a"): 50, ("m", "b"): 0, ("m", "c"): 5, ("m", "worker\\x2012"): 0}
    before, after = parse_diff_folded(text)
    assert before.stacks == base.stacks
    assert after.stacks == cur.stacks


def test_diff_folded_normalises_the_baseline_to_the_current_total():
    base = Profile({("m", "a"): 10, ("m", "b"): 30})  # 40 samples
    cur = Profile({("m", "a"): 60, ("m", "b"): 20})  # 80 samples
    before, after = parse_diff_folded(format_diff_folded(base, cur))
    assert before.total() == after.total() == 80
    assert before.stacks == {("m", "a"): 20, ("m", "b"): 60}



@pytest.mark.parametrize("seed", range(30))
def test_random_hostile_profiles_round_trip_and_read_the_same_in_perl(seed):
    prof = random_hostile_profile(seed)
    text = format_folded(prof)
    assert parse_folded(text).stacks == prof.stacks
    ignored, diff_lines, stacks = _perl_read(text)
    assert (ignored, diff_lines) == (0, 0)
    assert stacks == prof.stacks
